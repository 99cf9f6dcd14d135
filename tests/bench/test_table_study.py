"""bench/table_study.py on three small measured tables (auto, all, fixed) of one line."""

import json

import pytest
from cli_helpers import invoke_ok

from diffsmooth.bench.table_study import study
from diffsmooth.engine.demo import shipped as demo_assets

SPEC = """
sigmas = [0.25, 0.5]
radii = [0.25, 0.5]
n0 = 20
n_max = 200
[data]
dataset = "embedded"
skip = 83
max = 500
[run]
threads = 1
batch = 100
[[line]]
name = "RS"
method = "rs"
"""


@pytest.mark.skipif(not demo_assets.DEMO_UNET.exists(), reason="embedded demo models not shipped")
@pytest.mark.slow
def test_study_compares_the_plans_measured_and_on_paired_simulated_paths(tmp_path):
    (tmp_path / "spec.toml").write_text(SPEC)
    for plan in ("auto", "all", "fixed"):
        invoke_ok(["table", tmp_path / "spec.toml", "--out", tmp_path / plan, "--plan", plan, "--pilot", "2", "--quiet"])
    doc = study(tmp_path / "auto", tmp_path / "all", tmp_path / "fixed", seeds=3, n_max_sim=2000)
    measured = doc["measured"]
    auto_summary = json.loads((tmp_path / "auto" / "summary.json").read_text())
    assert measured["auto"]["cells"] == [100 * c["certified_accuracy"] for c in auto_summary["rows"][0]["cells"]]
    assert measured["fixed_subset"]["images"] == 7 and len(measured["fixed_subset"]["all_cells_same_images"]) == 3
    for n in (200, 2000):
        sim = doc[f"simulated_n{n}"]
        assert sim["fixed"]["samples"] == 7 * (20 + n) * 2                # every image, both sigmas, n0 + n
        assert sim["all"]["samples"] < sim["fixed"]["samples"] and sim["fewer_all_vs_fixed"] > 1
        assert all(0 <= v <= 100 for plan in ("fixed", "all", "auto") for v in sim[plan]["cells"])

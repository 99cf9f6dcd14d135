"""studies/table_study.py on three small measured tables (auto, all, fixed) of one line."""

import json

import pytest
from cli_helpers import invoke_ok
from table_fixtures import small_table_spec

from diffsmooth.engine.demo import shipped as demo_assets
from studies.table_study import estimate_line, study

SPEC = small_table_spec((0.25, 0.5))


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
    runs = measured["auto"]["runs"]                 # this version re-predicts from the pilot rows: the same as printed
    assert runs and all(r["repredicted_samples"] == pytest.approx(r["predicted_samples"]) for r in runs.values())
    assert measured["fixed_subset"]["images"] == 7 and len(measured["fixed_subset"]["all_cells_same_images"]) == 3
    for n in (200, 2000):
        sim = doc[f"simulated_n{n}"]
        assert sim["fixed"]["samples"] == 7 * (20 + n) * 2                # every image, both sigmas, n0 + n
        assert sim["all"]["samples"] < sim["fixed"]["samples"] and sim["fewer_all_vs_fixed"] > 1
        assert all(0 <= v <= 100 for plan in ("fixed", "all", "auto") for v in sim[plan]["cells"])
    # at the measured n-max the fixed plan; at another, each seed plans from its own simulated pilot
    assert "plans_chosen" not in doc["simulated_n200"]["auto"]
    assert sum(doc["simulated_n2000"]["auto"]["plans_chosen"].values()) == 3
    # the estimate scales the simulated samples per image to a line and adds one warm-up per build
    e = estimate_line(doc, seconds_per_image=9.0, at_n=2000, images=500, warmup_s=60.0, builds=3, overhead=1.1)
    assert e["fixed"]["seconds"] == pytest.approx(2 * 500 * 9.0 + 2 * 60.0)
    auto = doc["simulated_n2000"]["auto"]["samples"] / 7 * 500
    assert e["auto"]["samples"] == pytest.approx(auto)
    assert e["auto"]["seconds"] == pytest.approx(auto * 9.0 / 2020 * 1.1 + 3 * 60.0)
    # without the all table, the rates come from auto's own rows (pilot and main)
    alone = study(tmp_path / "auto", None, None, seeds=2, n_max_sim=None)
    assert alone["rates_from"] == "auto" and "all" not in alone["measured"]
    assert alone["simulated_n200"]["fixed"]["samples"] == 7 * 220 * 2

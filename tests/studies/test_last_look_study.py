"""studies/last_look_study.py: the last look's shares on the same paired paths, and their exact miscoverage."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

from diffsmooth.engine.certify.sequential import SequentialRule
from studies.last_look_study import main, passes, path_study
from tests.studies.test_race_study import _folder


def test_every_share_runs_on_the_same_paths_and_fewer_samples_come_with_a_smaller_last_look(tmp_path):
    doc = path_study(_folder(tmp_path), n_max=20_000, seeds=2, shares=[0.5, 0.05], tolerance=0.0, pilot=6)
    plans = doc["plans"]
    assert plans["fixed"]["samples"] == 60 * 2 * (100 + 20_000)
    for plan in ("all", "race"):
        today, small = plans[plan]["0.5"], plans[plan]["0.05"]
        assert small["samples"] < today["samples"] < plans["fixed"]["samples"]
        assert np.allclose(np.subtract(today["cells"], plans["fixed"]["cells"]), today["minus_fixed"])
    for sigma, by in doc["per_sigma"].items():
        assert by["0.05"]["samples"] <= by["0.5"]["samples"] and len(by["fixed"]) == len(doc["radii"])
    assert passes(doc, 0.5, points=100.0) and not passes(doc, 0.5, points=-1.0)


def test_cli_paths_render_and_coverage(tmp_path):
    folder = _folder(tmp_path / "rows")
    out = tmp_path / "study.md"
    result = CliRunner().invoke(main, ["paths", "--rows", str(folder), "--n-max", "2000", "--seeds", "1",
                                       "--shares", "0.5,0.1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert text.startswith("## SIMULATED") and "| race | 0.1 |" in text and "| all | 0.5 (today's, default) |" in text
    doc = json.loads(out.with_suffix(".json").read_text())
    assert doc["shares"] == [0.5, 0.1] and "--shares 0.5,0.1" in doc["command"]
    out.write_text("")
    assert CliRunner().invoke(main, ["render", str(out.with_suffix(".json"))]).exit_code == 0
    assert out.read_text() == text
    cov = tmp_path / "coverage.md"
    result = CliRunner().invoke(main, ["coverage", "--n-max", "2000", "--shares", "0.5,0.05", "--alpha", "0.05",
                                       "--scan", "4", "--out", str(cov)])
    assert result.exit_code == 0, result.output
    records = json.loads(cov.with_suffix(".json").read_text())["records"]
    assert [r["share"] for r in records] == [0.5, 0.05]
    for r in records:
        assert r["union"] == pytest.approx(0.05) and 0 < r["scan"]["worst"] <= 0.05
        assert r["last_level"] == pytest.approx(0.05 * r["share"])
        assert r["looks"] == len(SequentialRule((0.25, 0.5, 0.75, 1.0), 0.5, 0.05, 2000).looks())
    assert cov.read_text().count("| yes |") == 2
    bad = CliRunner().invoke(main, ["coverage", "--shares", "0.5,1.5"])
    assert bad.exit_code != 0 and "shares must be in (0, 1)" in bad.output

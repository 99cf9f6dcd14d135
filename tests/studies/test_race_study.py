"""studies/race_study.py on a table folder of synthetic rows: the rates it reads, the plans it compares."""

import json

import numpy as np
import pytest

from diffsmooth.engine.runs.results import CERTIFY_COLUMNS, SEQUENTIAL_EXTRA_BEFORE_SELECTED
from studies.race_study import estimate, markdown, rates_from, study

COLUMNS = CERTIFY_COLUMNS + SEQUENTIAL_EXTRA_BEFORE_SELECTED     # rows as stored before `selected`


def _folder(tmp_path, images=60):
    """A table folder of one RS line at sigma 0.25 and 0.5: first runs for every image, and a rerun of a
    few with more samples (the study reads each image's row with the most samples)."""
    rng = np.random.default_rng(4)
    spec = {"sigmas": [0.25, 0.5], "radii": [0.0, 0.25, 0.5, 0.75], "n0": 100, "n_max": 2000, "alpha": 0.001,
            "lines": [{"name": "RS", "method": "rs"}]}
    (tmp_path / "runs").mkdir(parents=True)
    (tmp_path / "summary.json").write_text(json.dumps({"spec": spec, "rows": [{"name": "RS"}]}))
    for sigma in spec["sigmas"]:
        for name, count, drawn in ((f"rs_s{sigma:g}.tsv", images, 300), (f"rs_s{sigma:g}_to0.75.tsv", 5, 2000)):
            lines = ["\t".join(COLUMNS)]
            for i in range(count):
                votes = int(drawn * min(1.0, rng.uniform(0.55, 1.05)))
                row = [i, i % 10, i % 10, 0.3, int(i % 7 != 0), "0:00:01", drawn + 100, votes]
                lines.append("\t".join(str(v) for v in row))
            (tmp_path / "runs" / name).write_text("\n".join(lines) + "\n")
    return tmp_path


def test_the_selected_class_comes_from_the_row_else_from_a_selected_file_else_from_correct():
    from studies.race_study import right_class

    row = {"idx": "4", "label": "3", "predict": "-1", "correct": "0"}
    assert right_class(row, None, 0.5) is False                                  # unknown: as before, another class
    assert right_class(row, {"selected": {"0.5": {"4": 3}}}, 0.5) is True
    assert right_class(dict(row, selected="3"), {"selected": {"0.5": {"4": 1}}}, 0.5) is True    # the row wins
    assert right_class(dict(row, selected="2"), None, 0.5) is False


def test_rates_come_from_each_images_row_with_the_most_samples(tmp_path):
    data = rates_from(_folder(tmp_path))
    assert set(data["rates"]) == {0.25, 0.5} and all(len(p) == 60 for p in data["rates"].values())
    assert all(np.all((p > 0) & (p < 1)) for p in data["rates"].values())          # Jeffreys: never 0 or 1
    assert not data["correct"][0.25][0] and data["correct"][0.25][1]              # row 0: correct = 0


def test_study_compares_the_plans_on_the_same_paths_and_says_where_the_samples_go(tmp_path):
    doc = study(_folder(tmp_path), n_max=2000, seeds=2, tolerance=0.0, pilot=6)
    plans = doc["plans"]
    assert plans["fixed"]["samples"] == 60 * 2 * (100 + 2000)
    assert plans["race"]["minus_all_worst"] == pytest.approx(0.0) and plans["race"]["minus_all_best"] == pytest.approx(0.0)
    for plan in ("all", "auto", "race"):
        assert plans[plan]["samples"] < plans["fixed"]["samples"]
        total = sum(sum(by.values()) for by in plans[plan]["by_sigma"].values())
        assert total == pytest.approx(plans[plan]["samples"])                    # every sample has a reason
    assert len(set(np.round(plans["all"]["cells"], 6))) >= 3                      # the cells spread
    e = estimate(doc, seconds_per_image=9.0, images=500, warmup_s=60.0, overhead=1.1, builds=1)
    assert e["fixed"]["seconds"] == pytest.approx(plans["fixed"]["samples"] / 60 * 500 * 9.0 / 2100 + 60.0)
    doc["estimate"] = e
    text = markdown(doc)
    assert "| race |" in text and "ESTIMATED" in text and "Where the samples go" in text
    extensions = plans["race"]["by_extension"]
    extended = sum(by["extended"] for by in plans["race"]["by_sigma"].values())
    assert sum(row["samples"] for row in extensions) == pytest.approx(extended)      # every extension sample
    assert {row["role"] for row in extensions} == {"likely winner", "shows it loses"}
    assert "The race's extensions" in text and f"| {extensions[0]['role']} |" in text



def test_the_mixture_replays_unanimous_rows_as_unanimous_where_jeffreys_cannot(tmp_path):
    """Rows with every vote of 300: Jeffreys' estimate replays them at p = 0.9983, below Phi(3), so fixed-n
    never certifies r / sigma = 3; under the fitted point mass most are rate 1 and certify it. Tiling
    repeats the rows' images."""
    folder = _folder(tmp_path)
    for path in (folder / "runs").glob("rs_s0.25*.tsv"):
        lines = path.read_text().splitlines()
        path.write_text("\n".join([lines[0]] + ["\t".join(line.split("\t")[:6] + ["400", "300"]) for line in lines[1:]]) + "\n")
    data = rates_from(folder)
    assert np.all(data["votes"][0.25] == data["drawn"][0.25])
    kept = {rates: study(folder, n_max=20_000, seeds=1, tolerance=0.0, pilot=6, rates=rates)["plans"]["fixed"]["cells"][-1]
            for rates in ("jeffreys", "mixture")}                               # r = 0.75: sigma 0.25's r / sigma = 3
    assert kept["mixture"] > kept["jeffreys"] + 20
    tiled = study(folder, n_max=2000, seeds=1, tolerance=0.0, pilot=6, images=150)
    assert tiled["images"] == 150 and tiled["plans"]["fixed"]["samples"] == 150 * 2 * 2100


def test_the_fitted_beta_mixture_gives_each_seed_rates_from_the_rows_posteriors(tmp_path):
    from studies.race_study import seed_rates

    data = rates_from(_folder(tmp_path))
    rng = np.random.default_rng(0)
    draws = [seed_rates(data, "beta-mixture", rng) for _ in range(2)]
    for sigma, p in data["rates"].items():
        assert draws[0][sigma].shape == p.shape and np.all((draws[0][sigma] >= 0) & (draws[0][sigma] <= 1))
        assert not np.array_equal(draws[0][sigma], draws[1][sigma])              # a new draw per seed
        observed = data["votes"][sigma] / data["drawn"][sigma]
        assert np.corrcoef(observed, draws[0][sigma])[0, 1] > 0.5               # each image near its own rate
    assert set(data["_priors"]) == {("beta-mixture", s) for s in data["rates"]}  # fitted once per sigma

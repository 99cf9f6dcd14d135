"""The wrong-class stop in the table: an image whose selected class is not its label draws only its n0
selection samples in every sequential run, the race counts it settled (never in a cell), and every cell is
what it was without the stop."""

import json

import numpy as np
import pytest
from cli_helpers import invoke_ok, rows_without_time
from table_fixtures import small_table_spec

from diffsmooth.engine.certify.sequential import SequentialRule
from diffsmooth.engine.demo import shipped as demo_assets
from diffsmooth.engine.runs.results import read_rows
from diffsmooth.engine.table.race import Rows, cell_status
from diffsmooth.engine.table.race_sim import RaceRule
from studies.replay import simulate_plans

needs_demo = pytest.mark.skipif(not demo_assets.DEMO_UNET.exists(), reason="embedded demo models not shipped")
RADII = (0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5)


def _row(idx, label, predict, selected=None, votes=150, samples=250):
    row = dict(idx=str(idx), label=str(label), predict=str(predict), radius="0.0", correct=str(int(predict == label)),
               top_votes=str(votes), samples=str(samples))
    if selected is not None:
        row["selected"] = str(selected)
    return row


def test_an_abstaining_row_of_another_class_is_settled_and_one_of_unknown_class_is_not():
    rule = SequentialRule(RADII, 0.5, 0.001, 10_000)
    rows = [_row(0, 3, -1, selected=5), _row(1, 3, -1, selected=3), _row(2, 3, -1), _row(3, 3, -1, 7, votes=0, samples=100)]
    status = cell_status(rule, Rows.from_rows(rows, 100, [-1] * 4), 0)
    assert status.undecided.tolist() == [False, True, True, False]


def test_the_simulated_stop_keeps_every_cell_and_draws_fewer_samples():
    rng = np.random.default_rng(3)
    images = 200
    rates = {s: np.concatenate([rng.uniform(0.45, 0.99, 120), 1 - 10 ** rng.uniform(-5, -1.5, 80)]) for s in (0.25, 0.5, 1.0)}
    right = {s: rng.random(images) < 0.8 for s in rates}
    seeds = [np.random.default_rng(11), np.random.default_rng(11)]
    before, after = (simulate_plans(rates, right, RaceRule(RADII, 0.001, 10_000, wrong_class_stop=stop), 100, 0.0, rng)
                     for rng, stop in zip(seeds, (False, True)))
    for plan in ("fixed", "all", "race"):
        assert np.allclose(before[plan]["cells"], after[plan]["cells"], rtol=0, atol=1e-9), plan
    assert np.allclose(after["race"]["cells"], after["all"]["cells"], rtol=0, atol=1e-9)
    assert len(set(np.round(after["all"]["cells"], 6))) >= 4
    assert after["fixed"]["samples"] == before["fixed"]["samples"]
    assert after["all"]["samples"] < 0.9 * before["all"]["samples"]
    assert after["race"]["samples"] < before["race"]["samples"]
    wrong = sum(after["all"]["by_sigma"][s]["wrong class"] for s in rates)
    assert wrong == 100 * sum(int((~right[s]).sum()) for s in rates)        # n0 each, nothing more


@needs_demo
@pytest.mark.slow
def test_a_table_stops_wrong_class_images_with_the_cells_of_a_table_without_the_stop(tmp_path, monkeypatch):
    from diffsmooth.engine.runs.dataset_run import Jobs

    path = tmp_path / "spec.toml"
    # ten images (skip 50) at n-max 100: one of them selects a class that is not its label
    path.write_text(small_table_spec(radii=(0.25, 0.5, 0.75, 1.0), skip=50, n_max=100))

    def table(folder, *extra):
        invoke_ok(["table", str(path), "--out", str(tmp_path / folder), "--pilot", "2", "--quiet", "--tolerance", "0",
                   *extra])
        return json.loads((tmp_path / folder / "summary.json").read_text())

    race = table("race")            # that the race's cells are all's, with the stop, test_race.py's table test shows
    real_call = Jobs.__call__
    monkeypatch.setattr(Jobs, "__call__", lambda self, index, label=None: real_call(self, index, None))
    without = table("without")
    cells = [[c["certified_accuracy"] for c in s["rows"][0]["cells"]] for s in (race, without)]
    assert cells[0] == cells[1] and len(set(cells[0])) >= 3
    assert race["samples"]["total"] < without["samples"]["total"]
    first = read_rows(tmp_path / "race" / "runs" / "rs_s0.25.tsv")
    wrong = [r for r in first if r["selected"] != r["label"]]
    assert wrong and all(int(r["samples"]) == 20 and r["predict"] == "-1" for r in wrong)
    assert len({r["selected"] for r in first}) >= 3
    kept = {r["idx"]: r for r in rows_without_time(tmp_path / "without" / "runs" / "rs_s0.25.tsv")}
    for r in rows_without_time(tmp_path / "race" / "runs" / "rs_s0.25.tsv"):
        if r["selected"] == r["label"]:
            assert r == kept[r["idx"]]


def test_the_cost_prediction_runs_the_images_whose_selected_class_is_the_label():
    from diffsmooth.engine.table.cost import right_class

    assert right_class(_row(0, 3, -1, selected=3)) and not right_class(_row(0, 3, -1, selected=5))
    assert not right_class(_row(0, 3, 5))                    # predicts another class (no `selected` column)
    assert right_class(_row(0, 3, -1)) and right_class(_row(0, 3, 3))    # unknown abstention: run, as before the stop

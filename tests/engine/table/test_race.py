"""The race plan (engine/table/race.py): what a row proves about `--plan all`'s row, the decisions,
the simulator, and the table run end to end against `--plan all`."""

import json
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import invoke_ok, rows_without_time
from table_fixtures import small_table_spec

from diffsmooth.engine.certify.sequential import SequentialRule
from diffsmooth.engine.demo import shipped as demo_assets
from diffsmooth.engine.runs.results import read_rows
from diffsmooth.engine.table.cost import Sampling, predict_race
from diffsmooth.engine.table.race import (
    Rows,
    cell_bounds,
    cell_status,
    initial_radii,
    next_extension,
    settled_prefix,
    tolerance_images,
)
from diffsmooth.engine.table.race_sim import RaceRule, SimulatedSigma
from studies.replay import simulate_plans

needs_demo = pytest.mark.skipif(not demo_assets.DEMO_UNET.exists(), reason="embedded demo models not shipped")
RADII = (0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5)


def _rates(rng, images):
    """Vote rates spread from hopeless to unanimous, most near the thresholds the radii need."""
    return np.concatenate([rng.uniform(0.45, 0.99, images // 2), 1 - 10 ** rng.uniform(-5, -1.5, images - images // 2)])


def test_first_radii_are_zero_and_the_largest_within_two_and_a_half_sigma():
    assert initial_radii(RADII, 0.25) == (0.0, 0.5)
    assert initial_radii(RADII, 0.5) == (0.0, 1.25)
    assert initial_radii(RADII, 1.0) == (0.0, 1.5)
    assert initial_radii((0.0, 1.0), 0.1) == (0.0,)
    assert settled_prefix(RADII, (0.0, 1.25)) == 0 and settled_prefix(RADII, RADII[:4]) == 3
    assert settled_prefix(RADII, (0.5,)) == -1
    assert tolerance_images(0.5, 500) == 2 and tolerance_images(0.5, 100) == 0 and tolerance_images(0, 500) == 0


@pytest.mark.parametrize("sigma", [0.25, 0.5, 1.0])
def test_a_rows_certified_and_settled_radii_agree_with_all_on_the_same_path(sigma):
    """The claim the race rests on: on the same vote path, a run settling any subset of the radii
    certifies r only if `all` does, and where its row says r is settled (not undecided), `all`
    certifies r exactly when the row does; an extension deciding radius r from a row leaves it settled,
    rightly. Checked for every radius, on rates near every threshold."""
    rng = np.random.default_rng(3)
    images = 600
    correct = rng.random(images) < 0.8
    sim = SimulatedSigma(sigma, _rates(rng, images), correct, RaceRule(RADII, 0.001, 4000), rng, (0.0,))
    full = sim.run(RADII)
    all_certified = (correct & (full[0] > 0))[:, None] & (full[0][:, None] >= np.array(RADII)[None, :])   # > 0: not abstained
    undecided_seen = 0
    for subset in [(0.0, 0.5), (1.0,), (0.25, 1.5), (0.0, 0.25, 0.5, 0.75), RADII[:1], (0.75, 1.25)]:
        sim.settle(np.arange(images), subset)
        rows = sim.rows()
        for k in range(len(RADII)):
            status = cell_status(sim.rule, rows, k)
            assert not np.any(status.certified & ~all_certified[:, k]), (subset, k)
            settled = ~status.undecided
            assert np.array_equal(status.certified[settled], all_certified[settled, k]), (subset, k)
            undecided_seen += int(status.undecided.sum())
    decided_seen = 0                            # the race's extensions: decide radius k from the rows' looks
    for subset in [(0.0, 1.0), (0.0, 0.25)]:
        sim.settle(np.arange(images), subset)
        for k in range(len(RADII)):
            asked = np.flatnonzero(cell_status(sim.rule, sim.rows(), k).undecided)
            sim.decide(asked, k)
            status = cell_status(sim.rule, sim.rows(), k)
            assert not status.undecided[asked].any(), (subset, k)
            assert np.array_equal(status.certified[asked], all_certified[asked, k]), (subset, k)
            for j in range(len(RADII)):         # and every other radius the rows now call settled is settled right
                other = cell_status(sim.rule, sim.rows(), j)
                settled = ~other.undecided
                assert np.array_equal(other.certified[settled], all_certified[settled, j]), (subset, k, j)
            decided_seen += len(asked)
    assert undecided_seen > 50 and decided_seen > 50        # tested where it matters, not only on settled rows
    assert 0.1 < all_certified.mean() < 0.9     # certificates spread over the radii


def test_the_race_at_tolerance_zero_gives_alls_cells_for_fewer_samples():
    rng = np.random.default_rng(5)
    images = 240
    rates = {s: _rates(rng, images) for s in (0.25, 0.5, 1.0)}
    correct = {s: rng.random(images) < 0.85 for s in rates}
    got = simulate_plans(rates, correct, RaceRule(RADII, 0.001, 10_000), 100, 0.0, rng)
    assert np.allclose(got["race"]["cells"], got["all"]["cells"], rtol=0, atol=1e-9)
    assert len(set(np.round(got["all"]["cells"], 6))) >= 4                # the cells spread
    assert got["race"]["samples"] < 0.8 * got["all"]["samples"] and got["race"]["extensions"] > 0


def test_a_tolerance_bounds_how_far_each_cell_is_below_alls():
    rng = np.random.default_rng(9)
    images = 200
    for _ in range(3):
        rates = {s: _rates(rng, images) for s in (0.25, 0.5, 1.0)}
        correct = {s: rng.random(images) < 0.85 for s in rates}
        got = simulate_plans(rates, correct, RaceRule(RADII, 0.001, 4000), 100, 2.0, rng)    # 4 images
        below = (got["all"]["cells"] - got["race"]["cells"]) * images / 100
        assert np.all(below >= -1e-9) and np.all(below <= 4 + 1e-9)


def _rows(radius, correct, votes, drawn, prefix_to=None):
    n = len(radius)
    return Rows(np.array(radius, float), np.array(correct, bool), np.zeros(n, bool), np.array(votes),
                np.array(drawn), np.full(n, -1) if prefix_to is None else np.array(prefix_to))


def test_the_likely_winner_settles_every_undecided_image_a_loser_just_enough_least_likely_first():
    """Two sigmas at r = 1.0 (index 1). sigma 1.0: 6 certified, 2 undecided with every vote so far;
    sigma 0.5: 3 certified, 4 undecided with 0 to 12 misses in 600. sigma 1.0 is likelier: it settles
    all its undecided images; then sigma 0.5 settles only enough of its own to fall to the best's
    count, least likely to certify first; within a tolerance of 1 image it settles nothing."""
    radii = (0.0, 1.0)
    rules = {s: SequentialRule(radii, s, 0.001, 10_000, schedule_radii=radii) for s in (0.5, 1.0)}
    low, drawn, correct = 0.9, [600] * 10, [1] * 8 + [0, 0]       # low: certifies 0, not 1.0, at either sigma
    rows = {1.0: _rows([1.5] * 6 + [low] * 4, correct, [600] * 8 + [0, 0], drawn),
            0.5: _rows([1.2] * 3 + [low] * 7, correct, [600] * 4 + [590, 589, 588, 500, 0, 0], drawn)}
    status = {s: cell_status(rules[s], rows[s], 1) for s in rules}
    assert [int(status[s].certified.sum()) for s in (0.5, 1.0)] == [3, 6]
    assert list(np.flatnonzero(status[0.5].undecided)) == [3, 4, 5, 6]      # image 7: 100 misses, settled
    assert list(np.flatnonzero(status[1.0].undecided)) == [6, 7]
    assert status[0.5].chance[3] > status[0.5].chance[4] > status[0.5].chance[5] > status[0.5].chance[6]
    ext = next_extension(rules, rows, tolerance=0, order=[0.5, 1.0])
    assert ext.contender == 1.0 and ext.k == 1 and ext.images == (6, 7) and ext.role == "likely winner"
    rows[1.0].prefix_to[[6, 7]] = 1                                         # settled: not certified
    ext = next_extension(rules, rows, tolerance=0, order=[0.5, 1.0])
    assert ext.contender == 0.5 and ext.images == (6,)                       # 3 + 4 undecided -> 6: one to settle
    assert not ext.likeliest and ext.role == "shows it loses"
    assert next_extension(rules, rows, tolerance=1, order=[0.5, 1.0]) is None
    asked = [(0.5, 1)]                                  # a close second asked again at this radius takes twice as many
    assert next_extension(rules, rows, 0, [0.5, 1.0], history=asked).images == (5, 6)
    assert next_extension(rules, rows, 0, [0.5, 1.0], history=asked * 2).images == (3, 4, 5, 6)
    assert next_extension(rules, rows, 0, [0.5, 1.0], history=[(1.0, 1), (0.5, 0)]).images == (6,)
    bounds = cell_bounds(rules, rows)
    assert [(b.certified, b.undecided_gap) for b in bounds] == [(8, 0), (6, 1)]


def test_predicted_race_samples_grow_with_the_images_and_stay_below_fixed_n():
    rng = np.random.default_rng(2)
    rows = {}
    for sigma in (0.25, 0.5):
        drawn = rng.integers(100, 2000, 12)
        votes = np.minimum(drawn, (drawn * rng.uniform(0.6, 1.0, 12)).astype(int))
        rows[sigma] = [{"top_votes": str(v), "samples": str(d + 100), "correct": "1"} for v, d in zip(votes, drawn)]
    small = predict_race(rows, RADII, 50, Sampling(100, 0.001, 10_000), 0.5, seeds=2)
    large = predict_race(rows, RADII, 200, Sampling(100, 0.001, 10_000), 0.5, seeds=2)
    for sigma in rows:
        assert 0 < small[sigma] < large[sigma] < 200 * 10_100


def _table(tmp_path, *extra, folder="t"):
    path = tmp_path / "spec.toml"
    path.write_text(small_table_spec(radii=(0.25, 0.5, 0.75, 1.0)))
    return ["table", str(path), "--out", str(tmp_path / folder), "--pilot", "2", "--quiet", *extra]


@needs_demo
@pytest.mark.slow
def test_race_table_equals_the_all_table_records_its_bounds_and_resumes_to_the_same_rows(tmp_path):
    out = tmp_path / "t"
    invoke_ok(_table(tmp_path, "--tolerance", "0"))
    invoke_ok(_table(tmp_path, "--plan", "all", folder="all"))
    race, every = (json.loads((tmp_path / f / "summary.json").read_text()) for f in ("t", "all"))
    cells = [c["certified_accuracy"] for c in race["rows"][0]["cells"]]
    assert cells == [c["certified_accuracy"] for c in every["rows"][0]["cells"]]
    assert len(set(cells)) >= 3                                            # the cells spread
    assert all(c["most_below_all"] == 0 for c in race["rows"][0]["cells"])
    decisions = json.loads((out / "race.json").read_text())["RS"]
    assert decisions["extensions"], "the race settled nothing: the test does not exercise it"
    assert "most each cell can be below" in (out / "table.md").read_text()
    assert race["samples"]["total"] > 0 and race["plan"]["mode"] == "race"
    # the last extension killed with its last row lost: the rerun replays the recorded decisions, same table
    extension = _last_extension(out)
    before = rows_without_time(extension)
    kept = extension.read_text().splitlines(keepends=True)
    extension.write_text("".join(kept[:-1]))
    table = (out / "table.md").read_text()
    invoke_ok(_table(tmp_path, "--tolerance", "0"))
    assert rows_without_time(extension) == before and (out / "table.md").read_text() == table
    assert json.loads((out / "race.json").read_text())["RS"]["extensions"] == decisions["extensions"]
    rows = read_rows(extension)
    assert all(int(r["top_votes"]) <= int(r["samples"]) - 20 for r in rows)
    from click.testing import CliRunner

    from diffsmooth.cli import main
    other = CliRunner().invoke(main, _table(tmp_path, "--tolerance", "1"))
    assert other.exit_code == 2 and "another tolerance" in other.output
    # a loose race asked again with a smaller tolerance continues from its rows to all's cells
    invoke_ok(_table(tmp_path, "--tolerance", "60", folder="loose"))     # 4 of 7 images
    loose = json.loads((tmp_path / "loose" / "summary.json").read_text())["rows"][0]["cells"]
    assert any(c["most_below_all"] > 0 for c in loose), "the loose race left no gap: the test does not exercise it"
    invoke_ok(_table(tmp_path, "--tolerance", "0", folder="loose"))
    tight = json.loads((tmp_path / "loose" / "summary.json").read_text())["rows"][0]["cells"]
    assert [c["certified_accuracy"] for c in tight] == cells and all(c["most_below_all"] == 0 for c in tight)
    assert json.loads((tmp_path / "loose" / "table.json").read_text())["tolerance"] == 0


def test_the_race_is_the_default_plan_and_a_tolerance_outside_0_100_is_refused(tmp_path):
    from click.testing import CliRunner

    from diffsmooth.cli import main
    result = CliRunner().invoke(main, ["table", "--help"])
    assert "[default: race]" in result.output and "--tolerance" in result.output
    result = CliRunner().invoke(main, ["table", "--demo", "--out", str(tmp_path / "t"), "--tolerance", "-1"])
    assert result.exit_code == 2 and "tolerance" in result.output and not (tmp_path / "t").exists()


def _last_extension(out: Path) -> Path:
    """The result file of the race's last extension (where a kill loses a row), from race.json."""
    last = json.loads((out / "race.json").read_text())["RS"]["extensions"][-1]
    return out / "runs" / f"rs_s{last['sigma']:g}_{last['kind']}.tsv"


@needs_demo
@pytest.mark.slow
def test_extensions_go_on_from_the_rows_states_with_the_rows_of_reruns_and_fewer_samples(tmp_path, monkeypatch):
    """The race's extensions continue each image from its row's state (engine/runs/row_states.py) until
    the radius asked is decided: the same cells as a race whose extensions rerun their images from the
    first sample to settle every radius up to the one asked (rows without states), for fewer samples."""
    from cli_helpers import assert_rows_spread

    from diffsmooth.engine.table.race_build import LineRace

    path = tmp_path / "spec.toml"
    path.write_text(small_table_spec(radii=(0.25, 0.5, 0.75, 1.0, 1.25), n_max=1000))

    def table(folder):
        invoke_ok(["table", str(path), "--out", str(tmp_path / folder), "--pilot", "2", "--quiet", "--tolerance", "0"])
        return json.loads((tmp_path / folder / "summary.json").read_text())

    went_on = table("on")
    monkeypatch.setattr(LineRace, "starts", lambda self, sigma, radii, images, **how: {})
    rerun = table("rerun")
    files = {f: sorted(p.name for p in (tmp_path / f / "runs").glob("*.tsv")) for f in ("on", "rerun")}
    assert any("_to" in name for name in files["rerun"]), "no extension ran: the test does not exercise continuation"
    assert any("_at" in name for name in files["on"]) and not any("_to" in name for name in files["on"])
    for name in (n for n in files["on"] if "_at" not in n):         # the first runs: the same rows
        assert rows_without_time(tmp_path / "on" / "runs" / name) == rows_without_time(tmp_path / "rerun" / "runs" / name), name
    assert_rows_spread(tmp_path / "on" / "runs" / "rs_s0.25.tsv", min_classes=3)
    assert (tmp_path / "on" / "runs" / "rs_s0.25.tsv.states.jsonl").is_file()
    assert went_on["samples"]["total"] < rerun["samples"]["total"]
    assert [c["certified_accuracy"] for c in went_on["rows"][0]["cells"]] == \
        [c["certified_accuracy"] for c in rerun["rows"][0]["cells"]]
    # an extension killed with its last row lost: the resumed table has the same rows and counts the same samples
    monkeypatch.undo()
    extension = _last_extension(tmp_path / "on")
    before = rows_without_time(extension)
    extension.write_text("".join(extension.read_text().splitlines(keepends=True)[:-1]))
    assert table("on")["samples"] == went_on["samples"] and rows_without_time(extension) == before


def test_the_simulated_race_going_on_from_rows_draws_fewer_samples_for_the_same_cells():
    """On the same paths: extensions that settle every radius up to the one asked give the same rows going
    on from the rows' states as rerun from the first sample, for fewer samples; extensions that decide
    only the radius asked (the table's) keep `all`'s cells (tolerance 0) for fewer samples still."""
    from studies.replay import simulate_race

    rng = np.random.default_rng(8)
    images = 200
    rates = {s: _rates(rng, images) for s in (0.25, 0.5, 1.0)}
    correct = {s: rng.random(images) < 0.85 for s in rates}
    outcomes, all_cells = [], None
    for continued, decide in ((True, False), (False, False), (True, True)):
        paths = np.random.default_rng(3)
        sims = {s: SimulatedSigma(s, rates[s], correct[s], RaceRule(RADII, 0.001, 10_000), paths, initial_radii(RADII, s))
                for s in sorted(rates)}
        if all_cells is None:
            all_cells = np.array([max(int((sims[s].correct & (sims[s].run(RADII)[0] > 0)
                                           & (sims[s].run(RADII)[0] >= r)).sum()) for s in sims) for r in RADII])
        outcomes.append(simulate_race(sims, 0, 100, continued=continued, decide=decide))
    went_on, rerun, decided = outcomes
    np.testing.assert_array_equal(went_on.cells, rerun.cells)
    np.testing.assert_array_equal(went_on.cells, all_cells)
    np.testing.assert_array_equal(decided.cells, all_cells)
    assert len(set(went_on.cells.tolist())) >= 4 and went_on.extensions == rerun.extensions > 0
    assert sum(went_on.samples.values()) < sum(rerun.samples.values())
    assert sum(decided.samples.values()) < sum(went_on.samples.values())
    assert went_on.first == rerun.first == decided.first
    for outcome in (went_on, decided):
        for sigma in rates:              # every extension sample is in by_extension, under its sigma
            spent = sum(samples for (s, _, _), (_, samples) in outcome.by_extension.items() if s == sigma)
            assert spent == pytest.approx(outcome.extended[sigma])
    assert sum(images for images, _ in went_on.by_extension.values()) > 0
    assert {role for _, _, role in went_on.by_extension} <= {"likely winner", "shows it loses"}

"""The race always ends (issue: a table whose race asked for the same two extensions forever). What a row
proves is read from its state: the running upper bound, and every radius decided at its look, so a step
never asks for an extension whose answer is known; a step that would still write no row stops the table
with one line. Through the race's own code (LineRace, run_race) on planted vote paths, and on simulated
paths (race_sim) at the audit's settings."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import norm

from diffsmooth.engine.certify.jobs import drive
from diffsmooth.engine.certify.sequential import SequentialRule, sequential_job
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.runs.dataset_run import result_row
from diffsmooth.engine.runs.results import CERTIFY_COLUMNS, SEQUENTIAL_EXTRA, ResultWriter, read_rows
from diffsmooth.engine.runs.row_states import append_state, states_path
from diffsmooth.engine.table import race_build, race_sim
from diffsmooth.engine.table.race import Rows, cell_status, initial_radii
from diffsmooth.engine.table.race_build import LineRace, decides, run_race
from diffsmooth.engine.table.race_sim import RaceRule, SimulatedSigma
from diffsmooth.engine.table.spec import LineSpec, TableSpec
from studies.replay import simulate_race

N0, LABEL, CLASSES = 100, 3, 10
RADII = tuple(round(0.25 * i, 2) for i in range(9))         # 0, 0.25, ..., 2.0


class PlantedTable:
    """One line's race through the engine's race code, its runs replayed on planted vote paths: the runner's
    part (rows and states written as engine/runs/dataset_run.py writes them, images a file holds skipped)."""

    def __init__(self, out: Path, hits: dict, sigmas=(0.5,), alpha=0.05, n_max=100_000):
        self.out, self.hits = out, hits                 # hits[(sigma, image)]: 1 where estimation sample t votes LABEL
        line = LineSpec("RS", "rs", {}, {}, {})
        self.spec = TableSpec("planted", tuple(sigmas), RADII, (line,), n0=N0, n_max=n_max, alpha=alpha)
        self.rules = {s: SequentialRule(RADII, s, alpha, n_max, schedule_radii=RADII) for s in sigmas}
        self.race = LineRace(self.spec, line, sorted({i for _, i in hits}), self.rules, self.path)
        self.asked = []

    def path(self, line, sigma, kind) -> Path:
        return self.out / "runs" / (f"rs_s{sigma:g}.tsv" if kind == "main" else f"rs_s{sigma:g}_{kind}.tsv")

    def counts(self, sigma, image):
        hits = self.hits[(sigma, image)]

        def count(first, num):
            out = np.zeros((1, CLASSES), dtype=np.int64)
            for sample in range(first, first + num):
                if sample < N0 or hits[sample - N0]:
                    out[0, LABEL] += 1
                else:
                    out[0, (LABEL + 1) % CLASSES] += 1
            return out
        return count

    def run(self, sigma, radii, images, kind, starts=None):
        rule = SequentialRule(radii, sigma, self.spec.alpha, self.spec.n_max, schedule_radii=RADII,
                              decide_largest=decides(kind))
        path = self.path(None, sigma, kind)
        with ResultWriter(path, CERTIFY_COLUMNS + SEQUENTIAL_EXTRA) as writer:
            for image in images:
                if image in writer.done:                # the runner skips the images its file holds
                    continue
                start = (starts or {}).get(image, {}).get("")
                job = sequential_job(N0, rule, None if start is None else [start], label=LABEL)
                certificate, = drive(job, self.counts(sigma, image))
                append_state(states_path(path), image, certificate.state)
                writer.write(**result_row(image, LABEL, certificate, 0.0, writer.columns))

    def first_runs(self):
        for sigma in self.spec.sigmas:
            self.run(sigma, initial_radii(RADII, sigma), self.race.indices, "main")

    def extend(self, sigma, radii, images, kind):
        self.asked.append((sigma, kind, tuple(images)))
        self.run(sigma, radii, images, kind, self.race.starts(sigma, radii, images, decide=decides(kind)))

    def race_to_the_end(self, tolerance=0.0):
        self.first_runs()
        return run_race(self.race, tolerance, self.extend, lambda line: None, self.out / "race.json")

    def all_cells(self):
        """`all`'s certified images per radius on the same paths (the rule settling every radius)."""
        cells = np.zeros(len(RADII), dtype=int)
        for sigma in self.spec.sigmas:
            counted = np.zeros(len(RADII), dtype=int)
            for image in self.race.indices:
                certificate, = drive(sequential_job(N0, self.rules[sigma], label=LABEL), self.counts(sigma, image))
                if certificate.prediction == LABEL:
                    counted += np.array([certificate.radius >= r for r in RADII])
            cells = np.maximum(cells, counted)
        return cells

    def race_cells(self):
        rows = self.race.rows_by_sigma()
        return np.max([[sum(int(r["correct"]) == 1 and float(r["radius"]) >= radius for r in rows[s][""])
                        for radius in RADII] for s in self.spec.sigmas], axis=0)


def audit_path(seed=0):
    """The audit's path: 3,495 of the first 3,500 estimation votes for the label (4 misses in the first 200),
    then votes at pA = Phi(3). Its first run (radii 0 and 1.25 at sigma 0.5) stops at 3,500 samples with
    L = 0.99477, running U = 0.998508 (the look at 200), stopping look's U = 0.999844."""
    hits = np.random.default_rng(seed).random(100_000) < norm.cdf(3.0)
    hits[:3500] = True
    hits[[17, 60, 111, 190, 2222]] = False
    return hits


def test_the_audits_path_ends_with_alls_cells_and_no_extension(tmp_path):
    table = PlantedTable(tmp_path, {(0.5, 0): audit_path()})
    table.first_runs()
    state = json.loads(states_path(table.path(None, 0.5, "main")).read_text().splitlines()[0])["state"]
    assert state["samples"] == 3500 and state["successes"] == 3495
    assert state["lower"] == pytest.approx(0.99477, abs=1e-5) and state["upper"] == pytest.approx(0.998508, abs=1e-6)
    rows = table.race.contenders()[(0.5, "")]
    k = RADII.index(1.5)
    # the stopping look's upper bound (0.999844) leaves 1.5 and 1.75 open; the running one (the state's) rules both out
    assert rows.upper[0] == pytest.approx(0.998508, abs=1e-6)
    blind = dataclasses.replace(rows, upper=np.ones(1))
    assert cell_status(table.rules[0.5], blind, k).undecided[0] and cell_status(table.rules[0.5], blind, k + 1).undecided[0]
    assert not cell_status(table.rules[0.5], rows, k).undecided[0]
    bounds = run_race(table.race, 0.0, table.extend, lambda line: None, tmp_path / "race.json")
    assert table.asked == []                           # nothing to decide: the race ends at once
    assert [b.undecided_gap for b in bounds] == [0] * len(RADII)
    np.testing.assert_array_equal(table.race_cells(), table.all_cells())
    assert table.race_cells().tolist() == [1] * 6 + [0] * 3      # certified up to 1.25 (radius 1.28), as `all`


def _last_only(rows: Rows) -> Rows:
    """Rows read as the race read them before: the stopping look's upper bound, the last decided radius only."""
    return dataclasses.replace(rows, upper=np.ones(len(rows.radius)), decided=np.zeros((len(rows.radius), 0), bool))


def test_every_radius_decided_at_a_look_counts_not_only_the_last_rows(tmp_path, monkeypatch):
    """The audit's path with the running upper bound hidden from the race: it asks at 1.5, then at 1.75, and
    ends there, since both rows stopped at the same look and each decided its radius."""
    table = PlantedTable(tmp_path, {(0.5, 0): audit_path()})
    old_next = race_build.next_extension
    blind = lambda rows: dataclasses.replace(rows, upper=np.ones(len(rows.radius)))   # noqa: E731
    monkeypatch.setattr(race_build, "next_extension",
                        lambda rules, rows, *a, **k: old_next(rules, {c: blind(r) for c, r in rows.items()}, *a, **k))
    bounds = table.race_to_the_end()
    assert [(kind, images) for _, kind, images in table.asked] == [("at1.5", (0,)), ("at1.75", (0,))]
    assert [b.undecided_gap for b in bounds] == [0] * len(RADII)
    np.testing.assert_array_equal(table.race_cells(), table.all_cells())
    rows = table.race.contenders()[(0.5, "")]
    assert rows.decided[0].tolist() == [k in (RADII.index(1.5), RADII.index(1.75)) for k in range(len(RADII))]


def test_a_race_asking_again_for_what_a_run_holds_stops_in_one_line_naming_it_and_keeps_every_row(tmp_path, monkeypatch):
    """Defence in depth: the race's old reading (stopping look's upper bound, last decided radius) planted
    back. On the audit's path it asked at 1.5, then 1.75, then 1.5 again forever; now the third step, which
    would write no row, stops the table with one line naming the line, sigma, radius and image."""
    table = PlantedTable(tmp_path, {(0.5, 0): audit_path()})
    old_next = race_build.next_extension

    def old_reading(rules, rows, *args, **kwargs):
        return old_next(rules, {c: _last_only(r) for c, r in rows.items()}, *args, **kwargs)

    monkeypatch.setattr(race_build, "next_extension", old_reading)
    with pytest.raises(UserError) as refused:
        table.race_to_the_end()
    message = str(refused.value)
    assert "\n" not in message
    assert "RS" in message and "sigma 0.5" in message and "r = 1.5" in message and "image(s) 0 " in message
    assert [(kind, images) for _, kind, images in table.asked] == [("at1.5", (0,)), ("at1.75", (0,))]
    kept = {p.name: read_rows(p) for p in (tmp_path / "runs").glob("*.tsv")}
    assert sorted(kept) == ["rs_s0.5.tsv", "rs_s0.5_at1.5.tsv", "rs_s0.5_at1.75.tsv"]
    assert all(len(rows) == 1 for rows in kept.values())
    assert len(json.loads((tmp_path / "race.json").read_text())["RS"]["extensions"]) == 2   # the steps that ran


def test_a_race_past_its_extension_bound_stops_in_one_line(tmp_path, monkeypatch):
    """The second defence: more extensions than images x contenders x radii (each decides one at least)."""
    table = PlantedTable(tmp_path, {(0.5, 0): audit_path(), (0.5, 1): audit_path(1)})
    monkeypatch.setattr(race_build, "extension_bound", lambda images, contenders, radii: 0)
    monkeypatch.setattr(LineRace, "held", lambda self, *args: [])
    old_next = race_build.next_extension
    monkeypatch.setattr(race_build, "next_extension",
                        lambda rules, rows, *a, **k: old_next(rules, {c: _last_only(r) for c, r in rows.items()}, *a, **k))
    with pytest.raises(UserError, match=r"more than 0 extensions .* image\(s\) 0, 1"):
        table.race_to_the_end()


@pytest.mark.parametrize("scale", [0.98, 1.0, 1.003])
def test_planted_races_at_and_near_the_thresholds_end_with_alls_cells(tmp_path, scale):
    """Through the race's code and files: two sigmas, eight images each at pA = Phi(r / sigma) x scale for
    the table's radii (at, just below and just above the thresholds); tolerance 0 gives `all`'s cells."""
    rng = np.random.default_rng(int(scale * 1000))
    hits = {}
    for sigma in (0.5, 1.0):
        for image, r in enumerate((0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0)):
            p = min(1.0, norm.cdf(r / sigma) * scale)
            hits[(sigma, image)] = rng.random(10_000) < p
    table = PlantedTable(tmp_path, hits, sigmas=(0.5, 1.0), alpha=0.05, n_max=10_000)
    bounds = table.race_to_the_end()
    assert [b.undecided_gap for b in bounds] == [0] * len(RADII)
    np.testing.assert_array_equal(table.race_cells(), table.all_cells())
    assert len(set(table.race_cells().tolist())) >= 3            # the cells spread over the radii
    assert 0 < len(table.asked) <= len(table.race.indices) * 2 * len(RADII)


def simulated_races(alpha, n_max, rates, seed, sigma=0.5):
    """One sigma's race at tolerance 0 on simulated paths (one image per path; an image's extensions do not
    depend on the others'), with each image's extensions counted: (outcome, `all`'s cells, per-image counts)."""
    images = len(rates)
    sim = SimulatedSigma(sigma, rates, np.ones(images, bool), RaceRule(RADII, alpha, n_max), np.random.default_rng(seed),
                         initial_radii(RADII, sigma))
    per_image = np.zeros(images, dtype=np.int64)
    decide = sim.decide

    def counted(chosen, k):
        per_image[np.asarray(chosen, dtype=np.int64)] += 1
        assert len(chosen) > 0 and per_image.max() <= len(RADII), "an image extended past the race's bound"
        decide(chosen, k)

    sim.decide = counted
    full = sim.run(RADII)
    all_cells = np.array([int(((full[0] > 0) & (full[0] >= r)).sum()) for r in RADII])
    outcome = simulate_race({sigma: sim}, 0, N0)
    return outcome, all_cells, per_image


def _rates_at_thresholds(images, sigma, rng):
    """pA at each radius's threshold Phi(r / sigma) and half-way between two, in equal shares."""
    at = norm.cdf(np.array(RADII[1:]) / sigma)
    between = (at[:-1] + at[1:]) / 2
    return rng.choice(np.concatenate([at, between]), images)


@pytest.mark.parametrize("alpha,n_max", [(0.001, 10_000), (0.05, 10_000), (0.1, 10_000), (0.001, 100_000),
                                         (0.05, 100_000), (0.1, 100_000)])
def test_simulated_races_at_the_thresholds_end_within_their_bound_with_alls_cells(alpha, n_max):
    """Every image is extended at most once per radius (the race's bound: a decision is never undone), and at
    tolerance 0 the cells are `all`'s, for pA at and between the radii's thresholds."""
    rng = np.random.default_rng(int(alpha * 1000) + n_max)
    rates = _rates_at_thresholds(400, 0.5, rng)
    outcome, all_cells, per_image = simulated_races(alpha, n_max, rates, seed=n_max + 7)
    np.testing.assert_array_equal(outcome.cells, all_cells)
    assert per_image.max() <= len(RADII) and outcome.extensions <= len(RADII) * len(rates)
    assert per_image.sum() > 0 and len(set(all_cells.tolist())) >= 4


class PastTheBound(Exception):
    pass


@pytest.mark.slow
def test_five_thousand_simulated_paths_at_phi_3_where_the_old_reading_looped_all_end_with_alls_cells(monkeypatch):
    """The audit's worst setting: alpha 0.05, n-max 100,000, pA = Phi(3) (the threshold of r = 1.5 at sigma
    0.5), 5,000 paths: the race ends on every one, within its bound, with `all`'s cells. The same paths
    under the old reading (stopping look's upper bound, last decided radius) extend an image past the bound
    (on this seed 5,000 paths are enough for that; 20,000 took four times as long and showed the same)."""
    rates = np.full(5_000, norm.cdf(3.0))
    outcome, all_cells, per_image = simulated_races(0.05, 100_000, rates, seed=20)
    np.testing.assert_array_equal(outcome.cells, all_cells)
    assert per_image.max() <= len(RADII) and outcome.extensions <= len(RADII) * len(rates)
    assert all_cells[RADII.index(1.25)] > all_cells[RADII.index(1.5)] > 0      # the paths straddle r = 1.5

    old_next = race_sim.next_extension
    monkeypatch.setattr(race_sim, "next_extension",
                        lambda rules, rows, *a, **k: old_next(rules, {c: _last_only(r) for c, r in rows.items()}, *a, **k))
    with pytest.raises(AssertionError, match="past the race's bound"):
        simulated_races(0.05, 100_000, rates, seed=20)


def test_the_table_command_stops_such_a_race_with_one_line_and_exit_2_keeping_its_rows(tmp_path, monkeypatch):
    """Through `diffsmooth table`: a race step planted to ask a run for images it holds ends the command with
    exit 2 and one line naming the line, sigma and radius; the first runs' rows stay on disk."""
    from click.testing import CliRunner
    from table_fixtures import small_table_spec

    from diffsmooth.cli import main

    monkeypatch.setattr(LineRace, "held", lambda self, sigma, config, kind, images: list(images))
    spec = tmp_path / "spec.toml"
    spec.write_text(small_table_spec(radii=(0.25, 0.5, 0.75, 1.0)))
    out = tmp_path / "t"
    result = CliRunner().invoke(main, ["table", str(spec), "--out", str(out), "--pilot", "2", "--quiet", "--tolerance", "0"])
    assert result.exit_code == 2, result.output
    last = result.output.strip().splitlines()[-1]
    assert "table: race, RS, sigma" in last and "r = " in last and "already holds" in last and "Traceback" not in result.output
    first_runs = sorted(p.name for p in (out / "runs").glob("*.tsv"))
    assert first_runs == ["rs_s0.25.tsv", "rs_s0.5.tsv"] and all(len(read_rows(out / "runs" / n)) == 7 for n in first_runs)

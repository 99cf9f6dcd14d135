"""`diffsmooth table`: the spec, the plan (pilot stride, radius assignment), the cost prediction, the
outputs, resume and refusals."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from cli_helpers import invoke_ok
from click.testing import CliRunner
from table_fixtures import small_table_spec

from diffsmooth.cli import main
from diffsmooth.engine.certify.sequential import SequentialRule
from diffsmooth.engine.demo import shipped as demo_assets
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.runs.results import read_rows
from diffsmooth.engine.table.cost import Sampling, expected_samples, posterior_rates, predict_run
from diffsmooth.engine.table.planning import assign_radii, pilot_indices
from diffsmooth.engine.table.report import line_cells, markdown
from diffsmooth.engine.table.spec import demo_spec, parse_spec

needs_demo = pytest.mark.skipif(not demo_assets.DEMO_UNET.exists(), reason="embedded demo models not shipped")

SPEC = small_table_spec()


# -- the plan ------------------------------------------------------------------------------------

def test_pilot_is_an_even_stride_not_the_first_images():
    indices = list(range(0, 500, 5))                 # a selection in class order (50 per class)
    pilot = pilot_indices(indices, 10)
    assert len(pilot) == 10 and len(set(pilot)) == 10 and set(pilot) <= set(indices)
    assert len({i // 50 for i in pilot}) == 10        # one per class, where the first 10 are all class 0
    assert pilot_indices(indices[:3], 10) == indices[:3]


def test_each_radius_goes_to_its_best_sigma_its_better_neighbour_and_those_within_the_slack():
    counts = {0.25: {0.0: 40, 0.5: 30, 1.0: 2, 1.5: 0},
              0.5: {0.0: 35, 0.5: 33, 1.0: 20, 1.5: 4},
              1.0: {0.0: 25, 0.5: 22, 1.0: 21, 1.5: 12}}
    uncapped = float("inf")                                      # the reach cap: its own test below
    got = assign_radii(counts, pilot=50, margin=0.05, reach=uncapped)            # slack: 3 images
    assert got[0.25] == [0.0, 0.5]                               # best at 0 and 0.5
    assert got[0.5] == [0.0, 0.5, 1.0, 1.5]                      # neighbour of every best
    assert got[1.0] == [1.0, 1.5]                                # best at 1.0 (21 > 20) and 1.5
    tie = assign_radii({0.25: {2.0: 0}, 0.5: {2.0: 0}, 1.0: {2.0: 0}}, pilot=50, margin=0.0, reach=uncapped)
    assert tie == {0.25: [], 0.5: [2.0], 1.0: [2.0]}             # nobody certifies: the larger sigmas try
    wide = assign_radii(counts, pilot=50, margin=0.5, reach=uncapped)
    assert all(len(r) == 4 for r in wide.values())              # a wide margin: every sigma settles every radius


def test_the_bests_neighbour_joins_a_radius_only_within_its_reach_a_close_second_always():
    """Past r = reach x sigma the best's neighbour does not join (its samples grow like
    1 / (1 - Phi(r / sigma)) for a cell the pilot says it loses); a sigma within the slack of the
    best joins however far (it may win the cell); the best always settles r."""
    counts = {0.25: {0.0: 40, 0.75: 26, 1.5: 0},
              0.5: {0.0: 35, 0.75: 27, 1.5: 4},
              1.0: {0.0: 25, 0.75: 20, 1.5: 10}}
    got = assign_radii(counts, pilot=50, margin=0.05, reach=2.5)     # slack: 3 images
    assert got[0.25] == [0.0, 0.75]              # 0.75 = 3 x 0.25, out of reach, but within the slack of 27
    assert got[0.5] == [0.0, 0.75]               # 1.5 = 3 x 0.5: the best's neighbour, 6 behind, out of reach
    assert got[1.0] == [0.75, 1.5]               # 0.75: the best's only neighbour in reach (0.25 is not: 3 x 0.25)
    assert assign_radii(counts, pilot=50, margin=0.05, reach=3.0)[0.5] == [0.0, 0.75, 1.5]   # in reach of 3
    close = {**counts, 0.5: {0.0: 35, 0.75: 27, 1.5: 8}}
    assert assign_radii(close, pilot=50, margin=0.05, reach=2.5)[0.5] == [0.0, 0.75, 1.5]    # within the slack
    far = assign_radii({0.25: {2.0: 5}, 0.5: {2.0: 1}}, pilot=50, margin=0.05, reach=2.0)
    assert far == {0.25: [2.0], 0.5: []}         # the best settles r however far (8 x 0.25)


# -- the spec ------------------------------------------------------------------------------------

@pytest.mark.parametrize("doc,message", [
    ({"line": []}, "at least one"),
    ({"line": [{"method": "xx"}]}, "method must be one of"),
    ({"line": [{"method": "rs"}], "sigmas": [0.5, 0.5]}, "twice"),
    ({"line": [{"method": "rs"}], "sigmas": [0.0]}, "> 0"),
    ({"line": [{"method": "rs"}], "radii": [-1]}, ">= 0"),
    ({"line": [{"method": "rs"}], "n_max": "many"}, "integer"),
    ({"line": [{"method": "rs"}], "n0": 1.5}, "integer"),
    ({"line": [{"method": "rs"}], "alpha": float("nan")}, "finite"),
    ({"line": [{"method": "rs"}], "colour": 1}, "unknown key colour"),
    ({"line": [{"method": "rs"}], "run": {"gpu": True}}, "unknown key gpu"),
    ({"line": [{"method": "rs", "m": 3}]}, "belong to diffsmooth"),
    ({"line": [{"method": "diffsmooth", "m": {"0.3": 3}}]}, "not in `sigmas`"),
    ({"line": [{"method": "diffsmooth", "m": [0]}]}, ">= 1"),
    ({"line": [{"method": "rs", "name": "a"}, {"method": "dds", "name": "a"}]}, "new non-empty"),
    ({"line": [{"method": "rs", "classifier": 3}]}, "checkpoint path"),
])
def test_spec_problems_are_one_line_each(doc, message):
    with pytest.raises(UserError, match=message) as caught:
        parse_spec(doc)
    assert "\n" not in str(caught.value)


def test_spec_values_per_sigma_and_sweeps():
    spec = parse_spec({"sigmas": [0.25, 0.5], "radii": [0.5, 0.25],
                       "line": [{"method": "diffsmooth", "m": [1, 3], "local_sigma": {"0.25": 0.1, "0.5": [0.2, 0.25]}}]})
    line, = spec.lines
    assert spec.radii == (0.0, 0.25, 0.5)                        # radius 0 is always in the table
    assert line.m == {0.25: (1, 3), 0.5: (1, 3)} and line.local_sigma == {0.25: (0.1,), 0.5: (0.2, 0.25)}
    assert spec.request_options(line, 0.5)["local_sigma"] == (0.2, 0.25)
    assert parse_spec({"line": [{"method": "rs"}]}).fingerprint() != spec.fingerprint()


def test_demo_spec_has_three_sigmas_and_radii_to_two():
    spec = demo_spec()
    assert spec.sigmas == (0.25, 0.5, 1.0) and spec.radii[0] == 0.0 and spec.radii[-1] == 2.0
    assert [line.method for line in demo_spec(("rs", "diffsmooth")).lines] == ["rs", "diffsmooth"]
    with pytest.raises(UserError, match="unknown line"):
        demo_spec(("rs", "macer"))
    assert "precision" not in demo_spec().run
    assert demo_spec(device="cuda", precision="fp16").run == {"device": "cuda", "precision": "fp16"}


def test_table_demo_takes_a_precision_and_a_spec_refuses_it(tmp_path):
    """`table --demo --precision fp16 --device cuda` runs the demo as a spec with `precision = "fp16"` would (the
    headline-shaped demo table on a GPU); --precision without --demo is refused in one line, and fp16 on the CPU
    is refused by the run's own check in one line."""
    from click.testing import CliRunner

    from diffsmooth.cli import main
    spec = tmp_path / "s.toml"
    spec.write_text('[[line]]\nmethod = "rs"\n')
    refused = CliRunner().invoke(main, ["table", str(spec), "--precision", "fp16", "--out", str(tmp_path / "t")])
    assert refused.exit_code != 0 and "--precision belong to --demo" in refused.output
    on_cpu = CliRunner().invoke(main, ["table", "--demo", "--rows", "rs", "--images", "2", "--n-max", "200",
                                       "--precision", "fp16", "--quiet", "--out", str(tmp_path / "c")])
    assert on_cpu.exit_code != 0 and "fp16 is for CUDA" in on_cpu.output and "Traceback" not in on_cpu.output


# -- the cost ------------------------------------------------------------------------------------

def test_expected_samples_of_sure_images_is_the_look_that_settles_the_largest_radius():
    rule = SequentialRule((0.25, 0.5), 0.5, 0.001, 2000)
    rates = np.ones((1, 6))                                    # every vote for cA: the rule stops as soon as it can
    looks = rule.looks()
    from diffsmooth.engine.runs.simulation import simulate_sequential
    _, used = simulate_sequential(np.ones(1), rule, np.random.default_rng(0))
    assert int(used[0]) in looks
    assert expected_samples(rates, rule, n0=100) == 100 + int(used[0])
    # a rate near the largest radius's threshold (Phi(1) = 0.84) needs more looks, never more than n-max
    near = expected_samples(np.full((1, 6), 0.8), rule, n0=100)
    assert 100 + int(used[0]) < near <= 100 + 2000


def test_rates_are_drawn_from_each_images_posterior_never_certain():
    """A pilot row's rate is uncertain; the prediction draws it from Beta(top + 1/2, drawn - top + 1/2):
    mean (top + 1/2) / (drawn + 1), below 1 even with every vote, spread like the row's evidence."""
    rng = np.random.default_rng(0)
    top, drawn = np.array([[500, 250, 0]]), np.array([[500, 500, 0]])
    draws = np.stack([posterior_rates(top, drawn, rng) for _ in range(4000)])
    assert draws[:, 0, 0].max() < 1 and draws[:, 0, 0].mean() == pytest.approx(500.5 / 501, abs=2e-4)
    assert draws[:, 0, 1].mean() == pytest.approx(0.5, abs=0.003) and 0.015 < draws[:, 0, 1].std() < 0.03
    assert np.all(draws[:, 0, 2] == 0.45)                             # nothing drawn: the abstain rate


def test_predicted_run_reads_the_pilot_rows_vote_counts():
    rows = [{"idx": i, "label": 0, "predict": 0, "radius": "0.5", "correct": 1, "samples": 1120, "top_votes": 1000}
            for i in range(4)]
    cost = predict_run("RS", 0.5, [rows], (0.25,), main_images=10, sampling=Sampling(n0=120, alpha=0.001, n_max=1000),
                       samples_per_second=100.0)
    top, drawn = np.full((1, 4), 1000), np.full((1, 4), 1000)      # 1,120 samples less n0 = 120
    assert cost.samples == pytest.approx(10 * expected_samples(lambda rng: posterior_rates(top, drawn, rng),
                                                               SequentialRule((0.25,), 0.5, 0.001, 1000), 120))
    weaker = [dict(r, top_votes=700) for r in rows]
    assert predict_run("RS", 0.5, [weaker], (0.25,), 10, Sampling(120, 0.001, 1000), 100.0).samples > cost.samples
    assert cost.seconds == pytest.approx(cost.samples / 100.0)
    assert predict_run("RS", 0.5, [rows], (), 10, Sampling(120, 0.001, 1000), 100.0).samples == 0


# -- the report ----------------------------------------------------------------------------------

def test_a_cell_is_the_best_sigma_among_those_that_settle_its_radius():
    def rows(radii):
        return [{"correct": 1, "radius": f"{r}"} for r in radii]
    by_sigma = {0.25: {"a": rows([0.3, 0.3, 0.3])}, 0.5: {"b": rows([0.9, 0.9, 0.0])}}
    cells = line_cells(by_sigma, (0.0, 0.25, 0.5), images=4, settles=lambda s, r: True)
    assert [(c.certified, c.sigma) for c in cells] == [(3, 0.25), (3, 0.25), (2, 0.5)]
    only = line_cells(by_sigma, (0.0, 0.25, 0.5), images=4, settles=lambda s, r: s == 0.5)
    assert [(c.certified, c.sigma) for c in only] == [(3, 0.5), (2, 0.5), (2, 0.5)]
    text = markdown({"A": cells, "B": only}, {"A": None, "B": None}, (0.0, 0.25, 0.5), "caption")
    assert "| A | **75.0** | **75.0** | **50.0** |" in text and "| B | **75.0** | 50.0 | **50.0** |" in text


# -- the command ---------------------------------------------------------------------------------

def _table(tmp_path, *extra, spec=SPEC, name="spec.toml"):
    """The command for the small spec; the pilot plan (auto) unless `extra` names another (the race: test_race.py)."""
    path = tmp_path / name
    path.write_text(spec)
    plan = () if "--plan" in extra else ("--plan", "auto")
    return [sys.executable, "-m", "diffsmooth.cli", "table", str(path), "--out", str(tmp_path / "t"), "--pilot", "2",
            "--quiet", *plan, *extra]


@needs_demo
@pytest.mark.slow
def test_table_writes_its_outputs_resumes_to_the_same_table_and_refuses_another_spec(tmp_path, monkeypatch):
    from diffsmooth.engine.table import runner as table_runner
    builds = []
    real_build = table_runner.build_voter
    monkeypatch.setattr(table_runner, "build_voter",
                        lambda run, log, *held: builds.append(run.sigma) or real_build(run, log, *held))
    args = _table(tmp_path)[3:]
    first = invoke_ok(args)
    out = tmp_path / "t"
    # the main phase runs in reverse: its first run (sigma 0.5, when planned) keeps the last pilot's models
    mains = [s for s in (0.5, 0.25) if (out / "runs" / f"rs_s{s:g}.tsv").is_file()]
    assert builds == [0.25, 0.5] + (mains[1:] if mains[:1] == [0.5] else mains), builds
    for name in ("table.md", "table.tex", "curves.png", "summary.json", "plan.json", "cost.json"):
        assert (out / name).is_file(), name
    summary = json.loads((out / "summary.json").read_text())
    assert summary["samples"]["pilot"] > 0 and summary["samples"]["total"] < summary["samples"]["fixed_n"]
    assert summary["seconds"]["predicted"] > 0 and summary["seconds"]["measured"] > 0
    row, = summary["rows"]
    assert row["name"] == "RS" and row["acr"] is None and [c["radius"] for c in row["cells"]] == [0.0, 0.25, 0.5, 0.75]
    assert all(c["ci95"][0] <= c["certified_accuracy"] <= c["ci95"][1] for c in row["cells"])
    plan = json.loads((out / "plan.json").read_text())
    assert len(plan["pilot"]) == 2 and len(plan["pilot"]) + len(plan["main"]) == 7
    pilot_rows = read_rows(out / "runs" / "rs_s0.25_pilot.tsv")
    assert {int(r["idx"]) for r in pilot_rows} == set(plan["pilot"])
    assert all(int(r["top_votes"]) <= int(r["samples"]) - 20 for r in pilot_rows)
    assert "main phase predicted" in first.output
    costs = json.loads((out / "cost.json").read_text())
    assert {run["rate_from"] for run in costs["runs"].values() if "rate_from" in run} == {"probe"}
    table = (out / "table.md").read_text()
    # a killed main run (its last rows lost) and a rerun: the same table; a finished table draws nothing
    main_file = out / "runs" / "rs_s0.5.tsv"
    lines = main_file.read_text().splitlines(keepends=True)
    main_file.write_text("".join(lines[:-2]))
    invoke_ok(args)
    assert (out / "table.md").read_text() == table
    sizes = {p.name: p.stat().st_mtime_ns for p in (out / "runs").glob("*.tsv")}
    invoke_ok(args)
    assert {p.name: p.stat().st_mtime_ns for p in (out / "runs").glob("*.tsv")} == sizes
    # another spec or plan into this folder: one line, exit 2, nothing changed
    changed = _table(tmp_path, spec=SPEC.replace("n_max = 200", "n_max = 300"), name="other.toml")[3:]
    result = CliRunner().invoke(main, changed)
    assert result.exit_code == 2 and result.output.count("\n") == 1 and "another spec" in result.output
    result = CliRunner().invoke(main, args + ["--plan", "all"])
    assert result.exit_code == 2 and "another plan / pilot size / margin / reach:" in result.output
    assert (out / "table.md").read_text() == table


# --plan fixed (an ACR column, n0 + n-max samples per image): test_by_config.py's fixed table


@needs_demo
@pytest.mark.slow
def test_dry_run_plans_and_predicts_then_stops_before_the_main_phase(tmp_path):
    result = invoke_ok(_table(tmp_path, "--dry-run")[3:])
    out = tmp_path / "t"
    assert "main phase predicted" in result.output and (out / "plan.json").is_file()
    assert not (out / "runs" / "rs_s0.25.tsv").exists() and not (out / "table.md").exists()


@needs_demo
@pytest.mark.slow
def test_sigterm_stops_the_whole_table_and_the_rerun_finishes_it(tmp_path):
    args = _table(tmp_path)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(args, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    first_pilot = tmp_path / "t" / "runs" / "rs_s0.25_pilot.tsv"
    deadline = time.time() + 120
    while time.time() < deadline and not (first_pilot.exists() and len(read_rows(first_pilot, torn_tail="ignore")) >= 1):
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    start = time.time()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert time.time() - start < 30 and "run the same command again" in err
    runs = tmp_path / "t" / "runs"
    assert not (runs / "rs_s0.25.tsv").exists() and not (tmp_path / "t" / "table.md").exists()   # stopped in the pilot
    invoke_ok(args[3:])
    assert (tmp_path / "t" / "table.md").is_file()


def test_a_signal_between_two_runs_stops_the_table_before_the_next_one(tmp_path, monkeypatch):
    """Ctrl-C or SIGTERM that lands between runs (no run_dataset handler installed) is noted and the
    next run never starts; the table exits like an interrupted run."""
    from diffsmooth.engine.table.build import Phase, TableBuilder, TableInterrupted, TablePlanning
    from diffsmooth.engine.table.phases import stop_between_runs
    spec = parse_spec({"sigmas": [0.5], "line": [{"method": "rs"}]})
    builder = TableBuilder(spec, tmp_path / "t", TablePlanning("auto"), log=lambda line: None)
    monkeypatch.setattr(builder, "run_phase", lambda phase: pytest.fail("a run started after the signal"))
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with stop_between_runs() as builder.runner.stop:
        os.kill(os.getpid(), signal.SIGTERM)
        with pytest.raises(TableInterrupted, match="SIGTERM"):
            builder.runner.step(Phase(spec.lines[0], 0.5, [0], (0.0,), tmp_path / "x.tsv", "pilot"))
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before     # handlers restored


def test_an_interrupted_main_runs_seconds_count_when_the_table_resumes(tmp_path, monkeypatch):
    """cost.json's measured seconds add up every invocation of a main run, the interrupted ones too,
    so predicted vs measured compares like with like after a resume; samples come when it finishes,
    once per phase however often a resumed table passes it."""
    from diffsmooth.engine.errors import Terminated
    from diffsmooth.engine.table import runner as table_runner
    from diffsmooth.engine.table.build import Phase, TableBuilder, TableInterrupted, TablePlanning
    from diffsmooth.engine.table.folder import TableFolder
    spec = parse_spec({"sigmas": [0.5], "line": [{"method": "rs"}]})
    out = tmp_path / "t"
    out.mkdir()
    builder = TableBuilder(spec, out, TablePlanning("auto"), log=lambda line: None)
    phase = Phase(spec.lines[0], 0.5, [0, 1], (0.0,), tmp_path / "x.tsv", "main")
    key = f"{spec.lines[0].name} | sigma 0.5"
    costs = {"runs": {key: {"seconds": 30.0}}, "predicted": {"samples": 1, "seconds": 30.0}}
    clock = [100.0]
    monkeypatch.setattr(table_runner.time, "perf_counter", lambda: clock[0])

    def interrupted(*args, **kwargs):           # SIGTERM 12.5 s into the run
        clock[0] += 12.5
        raise Terminated("test")
    monkeypatch.setattr(table_runner, "run_dataset", interrupted)
    with pytest.raises(TableInterrupted, match="SIGTERM during RS .* sigma 0.5 \\(main\\)") as stop:
        builder.runner.step(phase, costs)
    assert stop.value.seconds == 12.5
    assert json.loads((out / "cost.json").read_text())["measured"][key] == {"seconds": 12.5, "samples": 0}
    folder = TableFolder(out, lambda line: None)
    folder.measured(costs, phase, 20.0, 4000)   # the resumed invocation finishes the run
    assert json.loads((out / "cost.json").read_text())["measured"][key] == {"seconds": 32.5, "samples": 4000,
                                                                          "phases": {"main 0 x2": 4000}}
    extension = Phase(spec.lines[0], 0.5, [1], (0.0, 0.5), tmp_path / "y.tsv", "to0.5")
    folder.measured(costs, extension, 5.0, 700)     # a line-sigma's next phase (the race's extensions) adds up
    folder.measured(costs, extension, 0.0, 700)     # a rerun finds its rows: no seconds, the same samples
    measured = json.loads((out / "cost.json").read_text())["measured"][key]
    assert measured["samples"] == 4700 and measured["seconds"] == 37.5


def test_the_timing_probe_times_full_batches_after_an_untimed_one(monkeypatch):
    """The predicted seconds use full batches' rate: one untimed batch, then PROBE_BATCHES timed ones
    at the run's batch size, on a pilot image (its own index, so its noise stream)."""
    from diffsmooth.engine.table import phases as table_build

    clock = [0.0]
    calls = []

    class Voter:
        def count(self, image, index, first_sample, num, batch):
            calls.append((index, first_sample, num, batch))
            clock[0] += num * 0.002             # 500 samples per second

    monkeypatch.setattr(table_build.time, "perf_counter", lambda: clock[0])
    rate = table_build.probe_rate(Voter(), image=None, index=7, batch=100)
    assert rate == pytest.approx(500.0)
    assert calls == [(7, 0, 100, 100), (7, 100, 100 * table_build.PROBE_BATCHES, 100)]

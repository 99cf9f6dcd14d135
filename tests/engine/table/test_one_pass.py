"""Lines that share the denoiser at a sigma (DDS, DiffSmooth) run their full runs as one pass
(engine/table/one_pass.py): every file of the table, its settings, table.md, race.json and the cells
equal those of separate runs, a pass interrupted and resumed included; summary.json counts the shared
passes."""

import json
import tomllib

import pytest
from table_fixtures import small_table_spec

from diffsmooth.engine.demo import shipped as demo_assets
from diffsmooth.engine.errors import Terminated
from diffsmooth.engine.runs.results import read_rows
from diffsmooth.engine.table import one_pass
from diffsmooth.engine.table import runner as table_runner
from diffsmooth.engine.table.build import Phase, TableBuilder, TableInterrupted, TablePlanning
from diffsmooth.engine.table.spec import parse_spec

needs_demo = pytest.mark.skipif(not demo_assets.DEMO_UNET.exists(), reason="embedded demo models not shipped")

# the small table's images (n-max 100) with a DDS and a DiffSmooth line (m = 2: the pass's local noises
# must be the line's own) instead of RS; its race extends both lines at sigma 0.5
SPEC = small_table_spec(n_max=100).split("[[line]]")[0] + """
[[line]]
name = "DDS"
method = "dds"
[[line]]
name = "DiffSmooth"
method = "diffsmooth"
local_sigma = 0.25
m = 2
"""


def _build(out, one=True, log=lambda line: None):
    TableBuilder(parse_spec(tomllib.loads(SPEC)), out, TablePlanning("race", pilot=2), log=log, progress=False,
                 one_pass=one).build()
    return _outputs(out)


def _outputs(out):
    runs = out / "runs"
    rows = {p.name: sorted(({k: v for k, v in r.items() if k != "time"} for r in read_rows(p)), key=lambda r: int(r["idx"]))
            for p in sorted(runs.rglob("*.tsv"))}
    settings = {p.name: json.loads(p.read_text()) for p in sorted(runs.rglob("*.json"))}
    summary = json.loads((out / "summary.json").read_text())
    return {"rows": rows, "settings": settings, "table": (out / "table.md").read_text(),
            "race": json.loads((out / "race.json").read_text()), "cells": summary["rows"], "summary": summary}


@pytest.fixture(scope="module")
def separate(tmp_path_factory):
    return _build(tmp_path_factory.mktemp("separate") / "t", one=False)


def _same_table(got, want):
    assert got["rows"] == want["rows"] and got["settings"] == want["settings"]
    assert (got["table"], got["race"], got["cells"]) == (want["table"], want["race"], want["cells"])
    assert got["summary"]["samples"] == want["summary"]["samples"]


@needs_demo
@pytest.mark.slow
def test_one_pass_rows_equal_separate_runs_and_an_interrupted_pass_resumes_to_them(separate, tmp_path, monkeypatch):
    """One table in two invocations: the pilots' passes, a first run's pass stopped by SIGTERM after three images,
    then the rest (that pass resumed, the other sigma's first run, the race's extensions) equal separate runs."""
    real = table_runner.run_dataset
    calls = []

    def stops_after_three_images(*args, **kwargs):
        calls.append(len(args[2]))
        if len(calls) < 3:                      # the two pilot passes finish
            return real(*args, **kwargs)
        rows = []

        def on_row(row):                        # after both lines' rows of the third image: SIGTERM
            rows.append(row)
            if len(rows) == 6:
                raise Terminated("test")
        return real(*args, on_row=on_row, **kwargs)

    monkeypatch.setattr(table_runner, "run_dataset", stops_after_three_images)
    out, said = tmp_path / "t", []
    stopped = TableBuilder(parse_spec(tomllib.loads(SPEC)), out, TablePlanning("race", pilot=2), log=said.append,
                           progress=False)
    with pytest.raises(TableInterrupted, match="SIGTERM during DDS \\+ DiffSmooth sigma 0.5 \\(first\\)"):
        stopped.build()
    assert calls == [2, 2, 2]                   # each pass writes both lines' files
    for name in ("dds_s0.5.tsv", "diffsmooth_s0.5.tsv"):
        assert len(read_rows(out / "runs" / name)) == 2 + 3        # the pilot's images and three of the first run's
    assert not list((out / "runs").glob("dds_s*_[at][to]*.tsv"))         # no extension ran
    assert stopped.runner.shared_passes == 2    # the pilots' (the stopped pass is not counted)
    monkeypatch.setattr(table_runner, "run_dataset", real)
    said_again = []
    got = _build(out, log=said_again.append)
    # first runs and reruns of both lines at both sigmas; the rows spread over classes and votes
    assert {"dds_s0.25.tsv", "dds_s0.5.tsv", "diffsmooth_s0.25.tsv", "diffsmooth_s0.5.tsv"} <= set(got["rows"])
    assert any("_at" in name for name in got["rows"])     # the race extended a line
    for name in ("dds_s0.5.tsv", "diffsmooth_s0.5.tsv"):
        rows = got["rows"][name]
        assert len({r["predict"] for r in rows}) >= 3, rows
        assert len({r["radius"] for r in rows if float(r["radius"]) > 0}) >= 2, rows
        assert any(0 < int(r["top_votes"]) < int(r["samples"]) - 20 for r in rows), rows
    assert got["rows"]["dds_s0.5.tsv"] != got["rows"]["diffsmooth_s0.5.tsv"]
    _same_table(got, separate)
    # each sigma's pilot and first run: one pass for both lines (the resumed invocation: the first runs); separate
    # runs share none
    assert (got["summary"]["shared_passes"], separate["summary"]["shared_passes"]) == (2, 0)
    assert sum("one pass: the denoiser runs once" in line for line in said) == 3         # the stopped one included
    assert sum("one pass: the denoiser runs once" in line for line in said_again) == 2


def test_lines_that_denoise_at_one_sigma_share_a_pass_and_nothing_else_does(tmp_path):
    spec = parse_spec({"sigmas": [0.25, 0.5], "line": [
        {"name": "RS", "method": "rs"}, {"name": "DDS", "method": "dds"},
        {"name": "DS", "method": "diffsmooth", "local_sigma": 0.25, "m": 1},
        {"name": "DS center", "method": "diffsmooth", "normalization": "center"}]})
    builder = TableBuilder(spec, tmp_path / "t", TablePlanning("auto"), log=lambda line: None)
    rs, dds, ds, center = spec.lines

    def phase(line, sigma, images=(0, 1), radii=(0.0, 0.5), kind="first"):
        return Phase(line, sigma, images, radii, builder.phase_path(line, sigma, "main"), kind)

    phases = [phase(line, sigma) for line in spec.lines for sigma in spec.sigmas]
    got = [[(p.line.name, p.sigma) for p in group] for group in one_pass.groups(builder.request, phases)]
    assert got == [[("RS", 0.25)], [("RS", 0.5)], [("DDS", 0.25), ("DS", 0.25)], [("DDS", 0.5), ("DS", 0.5)],
                   [("DS center", 0.25)], [("DS center", 0.5)]]
    # other images, other radii or another phase kind: separate passes
    for other in (phase(ds, 0.25, images=(0, 2)), phase(ds, 0.25, radii=(0.0, 0.25)), phase(ds, 0.25, kind="pilot")):
        assert len(one_pass.groups(builder.request, [phase(dds, 0.25), other])) == 2


@needs_demo
def test_a_pass_holds_only_the_lines_configurations_and_refuses_a_name_twice(tmp_path):
    spec = parse_spec({"sigmas": [0.5], "data": {"dataset": "embedded", "skip": 100}, "line": [
        {"name": "DDS", "method": "dds"}, {"name": "DS", "method": "diffsmooth", "local_sigma": [0.25, 0.5], "m": 1},
        {"name": "DS again", "method": "diffsmooth", "local_sigma": 0.25, "m": 1}]})
    builder = TableBuilder(spec, tmp_path / "t", TablePlanning("auto"), log=lambda line: None)
    runs = [builder.runner.planned(Phase(line, 0.5, (0, 100), (0.0,), builder.phase_path(line, 0.5, "main"), "first"))
            for line in spec.lines]
    shared = one_pass.shared_run(runs[:2])
    # DDS with the clean classifier, DiffSmooth at each sigma' with its own: no cross product of the two
    assert [c.name for c in shared.configurations] == [c.name for r in runs[:2] for c in r.configurations]
    assert len(shared.configurations) == 3 and shared.is_sweep
    assert list(shared.result_files().values()) == [runs[0].out, runs[1].out / f"{runs[1].configurations[0].name}.tsv",
                                                    runs[1].out / f"{runs[1].configurations[1].name}.tsv"]
    assert one_pass.shared_run(runs[1:]) is None         # the same configuration twice: each line runs alone


@needs_demo
@pytest.mark.slow
@pytest.mark.parametrize("plan", ["auto", "all"])
def test_the_other_plans_share_their_full_runs_with_the_rows_of_separate_runs(tmp_path, plan):
    # sigma 0.5 alone, four images (labels 9, 4, 0, 5)
    spec = parse_spec(tomllib.loads(SPEC.replace("sigmas = [0.25, 0.5]", "sigmas = [0.5]")
                                    .replace("skip = 83", "skip = 166")))
    got = {}
    for one in (True, False):
        out = tmp_path / str(one)
        builder = TableBuilder(spec, out, TablePlanning(plan, pilot=2), log=lambda line: None, progress=False, one_pass=one)
        builder.build()
        got[one] = {p.name: sorted(({k: v for k, v in r.items() if k != "time"} for r in read_rows(p)),
                                   key=lambda r: int(r["idx"])) for p in sorted((out / "runs").glob("*.tsv"))}
        got[one]["table.md"] = (out / "table.md").read_text()
        got[one]["shared"] = builder.runner.shared_passes
    assert got[True] == dict(got[False], shared=2 if plan == "auto" else 1)      # auto: its pilot and its main runs
    assert len(got[True]) == (4 if plan == "all" else 6)
    rows = [r for name, file in got[True].items() if name.endswith(".tsv") for r in file]
    assert len({r["predict"] for r in rows} - {"-1"}) >= 3, rows         # votes spread: equal files say something

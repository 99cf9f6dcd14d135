"""Every default of a table is defined once (engine/table/defaults.py; what a table shares with `certify`:
engine/choices.py), and the command line, the spec reader, `--check` and the planner read the same values."""

import ast
import dataclasses
import inspect
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from diffsmooth.cli import table as cli_table
from diffsmooth.cli.group import main
from diffsmooth.engine import choices
from diffsmooth.engine.runs.request import RunRequest
from diffsmooth.engine.table import check, defaults, planning, race
from diffsmooth.engine.table.build import TableBuilder, TablePlanning
from diffsmooth.engine.table.check import CheckReport, describe_runs
from diffsmooth.engine.table.runner import TableInputs
from diffsmooth.engine.table.spec import TableSpec, demo_spec, parse_spec
from studies import replay

ROOT = Path(__file__).resolve().parents[3]
PLANNER = {"plan": defaults.PLAN, "pilot": defaults.PILOT_IMAGES, "margin": defaults.MARGIN,
           "reach": defaults.RACE_REACH_SIGMAS, "tolerance": defaults.TOLERANCE_POINTS}


def _defaults(function) -> dict:
    return {name: p.default for name, p in inspect.signature(function).parameters.items()
            if p.default is not inspect.Parameter.empty}


def _field_defaults(settings) -> dict:
    return {f.name: f.default for f in dataclasses.fields(settings)}


def _option_defaults(command) -> dict:
    return {p.name: p.default for p in command.params}


def test_the_table_commands_options_are_the_planners_defaults():
    table = _option_defaults(cli_table.table)
    assert {k: table[k] for k in ("plan", "margin", "reach", "tolerance")} == \
        {k: PLANNER[k] for k in ("plan", "margin", "reach", "tolerance")}
    assert table["pilot"] is None           # resolved per table: PILOT_IMAGES, or DEMO_PILOT_IMAGES for --demo
    assert _defaults(TableBuilder.__init__)["planning"] == TablePlanning()
    assert _field_defaults(TablePlanning) == PLANNER


def test_the_planners_functions_take_the_same_defaults():
    assign = _defaults(planning.assign_radii)
    assert (assign["margin"], assign["reach"]) == (defaults.MARGIN, defaults.RACE_REACH_SIGMAS)
    assert _defaults(race.initial_radii)["reach"] == defaults.RACE_REACH_SIGMAS
    assert _defaults(replay.simulate_plans)["knobs"] == replay.PlanKnobs()
    sim = _field_defaults(replay.PlanKnobs)
    assert (sim["reach"], sim["pilot"]) == (defaults.RACE_REACH_SIGMAS, defaults.PILOT_IMAGES)


@pytest.mark.parametrize("demo", [True, False])
def test_the_command_line_resolves_the_pilot_from_defaults(tmp_path, monkeypatch, demo):
    seen = {}

    class Builder:
        def __init__(self, spec, out, **kwargs):
            seen.update(kwargs)

        def build(self, dry_run=False):
            pass

    monkeypatch.setattr(cli_table, "TableBuilder", Builder)
    monkeypatch.setattr(cli_table, "check_table", lambda spec, folders: CheckReport())
    if demo:
        args = ["table", "--demo", "--out", str(tmp_path / "t")]
    else:
        spec = tmp_path / "spec.toml"
        spec.write_text('[[line]]\nmethod = "rs"\n')
        args = ["table", str(spec), "--out", str(tmp_path / "t")]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    pilot = defaults.DEMO_PILOT_IMAGES if demo else defaults.PILOT_IMAGES
    assert seen == dict(planning=TablePlanning(**dict(PLANNER, pilot=pilot)), log=seen["log"], command=seen["command"],
                        progress=True, one_pass=True, inputs=seen["inputs"])
    assert isinstance(seen["inputs"], TableInputs)      # the preflight's and the runs' data, opened once


def test_the_spec_reader_fills_in_the_defaults():
    spec = parse_spec({"line": [{"method": "diffsmooth"}]})
    assert (spec.sigmas, spec.radii, spec.title) == (defaults.SIGMAS, defaults.RADII, defaults.TITLE)
    assert (spec.n0, spec.n_max, spec.alpha, spec.seed) == \
        (choices.DEFAULT_N0, choices.DEFAULT_N, choices.DEFAULT_ALPHA, choices.DEFAULT_SEED)
    fields = {name: f.default for name, f in TableSpec.__dataclass_fields__.items()}
    assert (fields["n0"], fields["n_max"], fields["alpha"], fields["seed"]) == \
        (spec.n0, spec.n_max, spec.alpha, spec.seed)
    line = spec.lines[0]
    assert line.local_noise == choices.DEFAULT_LOCAL_NOISE
    for sigma in spec.sigmas:
        options = spec.request_options(line, sigma)
        assert options["local_sigma"] == (sigma * defaults.LOCAL_SIGMA_FRACTION,) == defaults.local_sigmas(sigma)
        assert options["m"] == (choices.DEFAULT_M,) == defaults.local_noises(sigma)
        assert (options["split"], options["skip"]) == (choices.DEFAULT_SPLIT, choices.DEFAULT_SKIP)


def test_the_demo_table_takes_the_spec_defaults():
    spec = demo_spec()
    assert spec.radii == defaults.RADII
    assert (spec.n0, spec.alpha, spec.seed) == (choices.DEFAULT_N0, choices.DEFAULT_ALPHA, choices.DEFAULT_SEED)


def test_the_check_describes_the_runs_with_the_spec_readers_values():
    spec = parse_spec({"line": [{"method": "diffsmooth"}]})
    runs = [line for line in describe_runs(spec) if line.startswith("run:")]
    assert len(runs) == len(spec.sigmas)
    for sigma, line in zip(spec.sigmas, runs):
        assert f"sigma' {defaults.local_sigmas(sigma)[0]:g}; m {choices.DEFAULT_M};" in line


def test_the_check_and_the_runs_read_the_same_selection(monkeypatch):
    seen = {}

    class Dataset:
        def __len__(self):
            return 10

        def indices_selected(self, skip, stop):
            seen.update(skip=skip, stop=stop)
            return list(range(0, 10, skip))

        def verify(self, indices):
            pass

    def load(kind, path, split):
        seen.update(kind=kind, split=split)
        return Dataset()

    monkeypatch.setattr(check, "load_dataset", load)
    spec = parse_spec({"line": [{"method": "rs"}]})
    assert check.check_data(spec)[1] == []
    selection = spec.selection()
    assert selection["split"] == choices.DEFAULT_SPLIT and selection["skip"] == choices.DEFAULT_SKIP
    assert seen == {"kind": "embedded", "split": selection["split"], "skip": selection["skip"],
                    "stop": selection["max_index"]}
    request = RunRequest.parse("certify", out="x.tsv", **spec.request_options(spec.lines[0], spec.sigmas[0]))
    assert (request.split, request.skip, request.max_index) == (selection["split"], selection["skip"], None)


def test_certify_reads_the_same_run_defaults():
    """`certify`'s options and RunRequest: n0, n, alpha, seed, split, method, sigma, sigma', m, local noise."""
    from diffsmooth.cli.certify import certify
    cli = _option_defaults(certify)
    request = {name: f.default for name, f in RunRequest.__dataclass_fields__.items()}
    expected = {"n0": choices.DEFAULT_N0, "n": choices.DEFAULT_N, "alpha": choices.DEFAULT_ALPHA,
                "seed": choices.DEFAULT_SEED, "split": choices.DEFAULT_SPLIT, "skip": choices.DEFAULT_SKIP,
                "sigma": choices.DEFAULT_SIGMA,
                "local_noise": choices.DEFAULT_LOCAL_NOISE}
    for name, value in expected.items():
        assert cli[name] == request[name] == value, name
    for name, value in (("method", choices.DEFAULT_METHOD), ("local_sigma", choices.DEFAULT_LOCAL_SIGMA),
                        ("m", choices.DEFAULT_M)):
        assert list(cli[name]) == list(request[name]) == [value], name
    parsed = RunRequest.parse("certify", out="x.tsv")
    assert (parsed.method, parsed.local_sigma, parsed.m) == (request["method"], request["local_sigma"], request["m"])


# Names of a default and the parameters a planner function takes a default for: bound to a literal anywhere
# but engine/table/defaults.py (or engine/choices.py), they would be a second definition.
DEFAULT_NAMES = re.compile(r"^(DEFAULT_\w+|INITIAL_REACH|PILOT\w*|DEMO_PILOT\w*|MARGIN|TOLERANCE\w*|REACH\w*|PLAN)$")
DEFAULT_PARAMS = {"pilot", "margin", "reach", "tolerance", "tolerance_points", "plan", "n0", "n_max", "alpha",
                  "local_sigma", "m"}
TABLE_FILES = [*sorted((ROOT / "engine" / "table").glob("*.py")), ROOT / "diffsmooth" / "cli" / "table.py",
               *(ROOT / "studies" / f"{name}.py" for name in ("race_study", "table_study", "plan_ceilings")),
               ROOT / "bench" / "table_gpu.py"]


def second_definitions(path: Path, root: Path = ROOT) -> list:
    """'file:line name = value' for each default bound to a literal in `path`."""
    found, tree = [], ast.parse(path.read_text())
    where = path.relative_to(root)
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                pairs = zip(target.elts, node.value.elts) if isinstance(target, ast.Tuple) and \
                    isinstance(node.value, ast.Tuple) else [(target, node.value)]
                found += [f"{where}:{node.lineno} {t.id} = {v.value!r}" for t, v in pairs
                          if isinstance(t, ast.Name) and DEFAULT_NAMES.match(t.id) and isinstance(v, ast.Constant)]
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            positional = args.posonlyargs + args.args
            pairs = [*zip(positional[len(positional) - len(args.defaults):], args.defaults),
                     *((a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None)]
            found += [f"{where}:{node.lineno} {node.name}({a.arg}={d.value!r})" for a, d in pairs
                      if a.arg in DEFAULT_PARAMS and isinstance(d, ast.Constant) and d.value is not None]
    return found


def test_no_table_module_defines_a_default_again():
    assert all(path.exists() for path in TABLE_FILES)
    found = [hit for path in TABLE_FILES if path.name != "defaults.py" for hit in second_definitions(path)]
    assert not found, "defaults defined again (import them from engine/table/defaults.py or engine/choices.py): " + \
        "; ".join(found)


def test_the_scan_sees_a_second_definition(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("PILOT_IMAGES, PLAN = 25, 'race'\nDEFAULT_REACH: float = 2.5\n"
                      "def f(x, pilot=25, *, margin=0.05, seed=0, reach=REACH):\n    pass\n")
    assert second_definitions(module, tmp_path) == ["m.py:1 PILOT_IMAGES = 25", "m.py:1 PLAN = 'race'",
                                                    "m.py:2 DEFAULT_REACH = 2.5", "m.py:3 f(pilot=25)",
                                                    "m.py:3 f(margin=0.05)"]

"""`diffsmooth table`: every run of a table, in order, into one folder; the plan fixed before the main
phase; the cost said before it is spent; the outputs written from the rows.

DIR/table.json   the spec, plan mode, pilot size, margin, reach and tolerance (a rerun with others is refused)
DIR/plan.json    the plan (auto: written after the pilot, before the main phase draws a sample)
DIR/race.json    race: the extensions so far and each cell's bound (engine/table/race_build.py)
DIR/cost.json    predicted samples and seconds of the main phase; measured ones as runs finish or stop
DIR/runs/        one ordinary resumable result file per run (a folder per run for sweeps)
DIR/table.md, table.tex, curves.png, summary.json
DIR/table_by_config.md, table_by_config.tex   a row per sigma and configuration (engine/table/by_config.py)
DIR/.lock        held while a `diffsmooth table` runs on DIR: a second one on the same folder is refused

Every run is an ordinary result file, so a table killed at any point and rerun with the same command
continues (finished images are skipped) and gives the same table.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import socket
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from diffsmooth.engine.certify.sequential import SequentialState
from diffsmooth.engine.errors import Terminated, UserError
from diffsmooth.engine.runs.execute import build_voter, execute
from diffsmooth.engine.runs.locks import hold_lock
from diffsmooth.engine.runs.model_set import ModelSet
from diffsmooth.engine.runs.plan import plan_run
from diffsmooth.engine.runs.request import RunRequest
from diffsmooth.engine.runs.results import read_rows
from diffsmooth.engine.runs.row_states import drawn_samples, read_states, states_path
from diffsmooth.engine.table import by_config as layout
from diffsmooth.engine.table.cost import RunCost, predict_race, predict_run
from diffsmooth.engine.table.one_pass import run_phases
from diffsmooth.engine.table.pilot_rate import timed_batches
from diffsmooth.engine.table.planning import (
    DEFAULT_MARGIN,
    DEFAULT_REACH,
    TablePlan,
    pilot_indices,
    plan_from_pilot,
    plan_without_pilot,
)
from diffsmooth.engine.table.race import DEFAULT_TOLERANCE, CellBound, initial_radii
from diffsmooth.engine.table.race_build import LineRace, run_race
from diffsmooth.engine.table.report import (
    LineRows,
    caption,
    certified,
    latex,
    line_acr,
    line_cells,
    markdown,
    plot,
    write_summary,
)
from diffsmooth.engine.table.spec import LineSpec, TableSpec


def _ordered_starts(phase: Phase, configurations) -> Dict[int, List[SequentialState]]:
    """The phase's starts as each image's states in the run's configuration order (`configurations`: the
    run's names, in order); an image lacking the state of any configuration starts afresh."""
    names = list(configurations)
    out = {}
    for image, named in (phase.starts or {}).items():
        if len(names) == 1 and len(named) == 1:
            out[image] = list(named.values())
        elif all(name in named for name in names):
            out[image] = [named[name] for name in names]
    return out


class TableInterrupted(Exception):
    """Ctrl-C or SIGTERM stopped the table (finished rows are kept; rerun the command to continue)."""

    def __init__(self, message: str, seconds: float = 0.0):
        super().__init__(message)
        self.seconds = seconds                  # compute seconds the interrupted run had spent


@dataclass
class Phase:
    """One run of the table: a line at a sigma, on some images, settling some radii (None: fixed-n)."""

    line: LineSpec
    sigma: float
    indices: Sequence[int]
    radii: Optional[Sequence[float]]
    path: Path
    kind: str                               # "pilot" or "main"
    starts: Optional[Dict[int, Dict[str, SequentialState]]] = None   # {image: {configuration: state}}: go on from there


@dataclass
class PhaseResult:
    rows: Dict[str, List[dict]]             # configuration name -> rows (every image of the phase)
    seconds: float                          # measured compute seconds this invocation (0 when already done)
    samples: int                            # samples drawn, from the rows (a sweep's pass: its slowest configuration)
    probe_rate: Optional[float] = None      # pilot: samples per second of full batches (probe_rate)


PROBE_BATCHES = 2


def probe_rate(voter, image, index: int, batch: int, batches: int = PROBE_BATCHES) -> float:
    """Samples per second of this machine's pipeline on full batches, as the main phase runs them:
    one untimed batch, then `batches` timed. Only for a resumed table whose pilot ran before (its
    batches were not timed); a pilot that runs is timed on its own batches (table/pilot_rate.py)."""
    voter.count(image, index, 0, batch, batch)
    start = time.perf_counter()
    voter.count(image, index, batch, batches * batch, batch)
    return batches * batch / max(time.perf_counter() - start, 1e-9)


class StopRequest:
    """Set by Ctrl-C or SIGTERM that arrives between two runs (inside a run, run_dataset's own
    handlers stop the run and the table stops with it)."""

    def __init__(self):
        self.signal: Optional[str] = None


@contextmanager
def stop_between_runs():
    """Ctrl-C and SIGTERM (what a scheduler sends before it kills) set a flag that the table checks
    before each run; run_dataset installs its own handlers for the length of a run and restores these."""
    stop = StopRequest()

    def note(signum, frame):
        stop.signal = signal.Signals(signum).name
    try:
        previous = {s: signal.signal(s, note) for s in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:                      # not the main thread
        yield stop
        return
    try:
        yield stop
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def phase_path(out: Path, line: LineSpec, sigma: float, kind: str) -> Path:
    """Where a table folder keeps one run: DIR/runs/LINE_sSIGMA[_pilot].tsv (a folder for a sweep)."""
    suffix = "" if kind == "main" else f"_{kind}"
    name = f"{line.slug}_s{sigma:g}{suffix}"
    sweep = any(len(v.get(sigma, ())) > 1 for v in (line.classifier, line.local_sigma, line.m))
    return Path(out) / "runs" / (name if sweep else f"{name}.tsv")


class TableBuilder:
    """Runs a TableSpec's phases into `out`; `log` takes one line at a time."""

    def __init__(self, spec: TableSpec, out, plan: str = "auto", pilot: int = 25, margin: float = DEFAULT_MARGIN,
                 log: Callable[[str], None] = print, command: str = "", progress: bool = True,
                 reach: float = DEFAULT_REACH, tolerance: float = DEFAULT_TOLERANCE, one_pass: bool = True):
        self.spec, self.out, self.mode, self.pilot_size, self.margin = spec, Path(out), plan, pilot, margin
        self.reach, self.tolerance = reach, tolerance
        self.one_pass = one_pass                # lines sharing the denoiser at a sigma draw it once (table/one_pass.py)
        self.shared_passes = 0                  # passes this invocation ran for several lines at once
        self.log, self.command, self.progress = log, command, progress
        self.voters: Dict[tuple, object] = {}
        self.model_set = ModelSet()             # the stages built so far, reused by every run of the same architecture
        self.stop = StopRequest()
        self.started = time.perf_counter()

    # -- the folder ----------------------------------------------------------------------------

    def claim_folder(self) -> None:
        """Record what this folder holds; refuse a folder holding another table."""
        identity = {"spec_fingerprint": self.spec.fingerprint(), "plan": self.mode,
                    "pilot": self.pilot_size if self.mode in ("auto", "race") else None,
                    "margin": self.margin if self.mode == "auto" else None,
                    "reach": self.reach if self.mode == "auto" else None, "spec": self.spec.as_dict()}
        if self.mode == "race":
            identity["tolerance"] = self.tolerance
        path = self.out / "table.json"
        if path.exists():
            try:
                held = json.loads(path.read_text())
            except ValueError:
                raise UserError(f"{path} is damaged (not JSON); use another --out") from None
            if self._tightens(held, identity):
                self.log(f"table: race, the tolerance goes from {held['tolerance']:g} to {self.tolerance:g} points: "
                         f"the finished rows stay, and more images are settled until every cell is within it")
                held["tolerance"] = self.tolerance
                plan = self.out / "plan.json"
                if plan.exists():
                    dataclasses.replace(TablePlan.read(plan), tolerance=self.tolerance).write(plan)
                path.write_text(json.dumps(held, indent=1, allow_nan=False) + "\n")
                return
            if {k: held.get(k) for k in identity} != json.loads(json.dumps(identity)):
                changed = [name for k, name in (("spec_fingerprint", "spec"), ("plan", "plan"), ("pilot", "pilot size"),
                                                ("margin", "margin"), ("reach", "reach"), ("tolerance", "tolerance"))
                           if held.get(k) != identity.get(k)]
                raise UserError(f"{self.out} holds a table with another {' / '.join(changed) or 'spec'}: "
                                f"rerun with the same spec and options, or use another --out")
            return
        self.out.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(identity, indent=1, allow_nan=False) + "\n")

    @staticmethod
    def _tightens(held: dict, identity: dict) -> bool:
        """A finished or interrupted race asked again with a smaller tolerance, and nothing else changed:
        its rows stay valid (every row is about `all` on the same paths), so it continues."""
        same = {k: held.get(k) for k in identity if k != "tolerance"} == json.loads(json.dumps(
            {k: v for k, v in identity.items() if k != "tolerance"}))
        return (same and identity.get("plan") == "race" and isinstance(held.get("tolerance"), (int, float))
                and identity["tolerance"] < held["tolerance"])

    # -- runs ------------------------------------------------------------------------------------

    def request(self, phase: Phase) -> RunRequest:
        options = self.spec.request_options(phase.line, phase.sigma)
        options["quiet"] = not self.progress
        if phase.radii is None:
            return RunRequest.parse("certify", out=str(phase.path), **options)
        # every run of the table looks at the same sample counts, whichever radii it settles (the race's rows
        # bound `all`'s only then; engine/table/race.py)
        return RunRequest.parse("certify", sequential=True, radii=",".join(f"{r:g}" for r in phase.radii),
                                schedule_radii=",".join(f"{r:g}" for r in self.spec.radii),
                                n_max=self.spec.n_max, out=str(phase.path), **options)

    def selection(self) -> List[int]:
        """The spec's image selection (dataset, skip, max)."""
        line = self.spec.lines[0]
        run = plan_run(self.request(Phase(line, self.spec.sigmas[0], (), None, self.out / "runs" / "probe.tsv", "")))
        return list(run.indices)

    def run_phase(self, phase: Phase) -> PhaseResult:
        run = plan_run(self.request(phase))
        run = dataclasses.replace(run, indices=tuple(phase.indices))
        files = {c.name: path for c, path in run.result_files().items()}
        seconds, clock = 0.0, None
        predicting = phase.kind == "pilot" and not (self.out / "cost.json").exists()     # the prediction still to make
        if not all(self._done(path) >= set(phase.indices) for path in files.values()):
            voter = self._voter(phase, run)
            start = time.perf_counter()
            continuation = {} if phase.radii is None or self.mode != "race" else \
                {"keep_states": True, "starts": _ordered_starts(phase, files)}      # the race's extensions go on from states
            try:
                with timed_batches(voter, predicting) as clock:
                    summary = execute(run, voter, self.log, **continuation)
            except Terminated:                  # SIGTERM inside a run (engine/runs/dataset_run.py): the whole table stops
                raise TableInterrupted(f"stopped by SIGTERM during {phase.line.name} sigma {phase.sigma:g} "
                                       f"({phase.kind})", time.perf_counter() - start) from None
            seconds = time.perf_counter() - start
            if summary.interrupted:
                raise TableInterrupted(f"stopped during {phase.line.name} sigma {phase.sigma:g} ({phase.kind})", seconds)
        rows = {name: sorted(read_rows(path, torn_tail="ignore"), key=lambda r: int(r["idx"]))
                for name, path in files.items()}
        rate = clock.rate(run.batch) if clock is not None else None
        if rate is not None:
            self.log(f"table: timing, {phase.line.name} sigma {phase.sigma:g}: {rate:,.0f} samples/s "
                     f"from {clock.describe(run.batch)}")
        elif predicting and seconds:
            self.log(f"table: timing, {phase.line.name} sigma {phase.sigma:g}: the pilot ran in one batch; its "
                     f"samples over its compute seconds give the rate")
        elif predicting:                        # the pilot ran before this invocation: nothing of it was timed
            index = phase.indices[0]
            rate = probe_rate(self._voter(phase, run), run.dataset[index][0], index, run.batch)
            self.log(f"table: timing probe, {phase.line.name} sigma {phase.sigma:g}: {rate:,.0f} samples/s "
                     f"at batch {run.batch}")
        return PhaseResult(rows, seconds, self._samples(rows, phase, files), rate)

    def _voter(self, phase: Phase, run):
        """The line-sigma's voter; its stages come from the table's model set (built once per
        architecture, later runs' weights copied in), and the fast path is checked for each."""
        key = (phase.line.name, phase.sigma)
        if key not in self.voters:
            self.voters = {key: build_voter(run, self.log, self.model_set)}
        return self.voters[key]

    @staticmethod
    def _done(path: Path) -> set:
        return {int(r["idx"]) for r in read_rows(path, torn_tail="ignore")} if path.is_file() and path.stat().st_size \
            else set()

    def _samples(self, rows: Dict[str, List[dict]], phase: Phase, files: Optional[Dict[str, Path]] = None) -> int:
        """Samples the phase's images drew (a file may hold other phases' images too); a row that went on
        from an earlier row's state drew only the samples after it (its own state says from where;
        `files`: each configuration's result file)."""
        if phase.radii is None:
            return len(phase.indices) * (self.spec.n0 + self.spec.n_max)
        mine = set(phase.indices)
        per_image: Dict[int, int] = {}
        for name, config_rows in rows.items():
            states = read_states(states_path(files[name])) if files else {}
            for r in config_rows:
                if int(r["idx"]) in mine:
                    per_image[int(r["idx"])] = max(per_image.get(int(r["idx"]), 0),
                                                   drawn_samples(r, states, self.spec.n0))
        return sum(per_image.values())

    def phase_path(self, line: LineSpec, sigma: float, kind: str) -> Path:
        return phase_path(self.out, line, sigma, kind)

    # -- the table -------------------------------------------------------------------------------

    def build(self, dry_run: bool = False) -> Optional[dict]:
        """Run the table; holds the folder's lock (DIR/.lock) throughout, so a second `diffsmooth table`
        on the same folder stops at once. The runs inside take their own files' locks as usual."""
        with hold_lock(self.out, "table folder", folder=True):
            return self._build(dry_run)

    def _build(self, dry_run: bool) -> Optional[dict]:
        spec = self.spec
        indices = self.selection()              # the data and options refused before the folder is claimed
        self.claim_folder()
        (self.out / "runs").mkdir(exist_ok=True)
        with stop_between_runs() as self.stop:
            if self.mode == "race":
                return self._build_race(indices, dry_run)
            pilot_results: Dict[tuple, PhaseResult] = {}
            if self.mode == "auto":
                pilot = pilot_indices(indices, self.pilot_size)
                self.log(f"table: pilot of {len(pilot)} of {len(indices)} images settles every radius for every sigma")
                pilot_results = run_phases(self, [Phase(line, sigma, pilot, spec.radii, self.phase_path(line, sigma, "pilot"),
                                                        "pilot") for line in spec.lines for sigma in spec.sigmas])
                plan = self._plan_from(indices, pilot, pilot_results)
            else:
                plan = plan_without_pilot(self.mode, indices, spec.sigmas, spec.radii)
                self._fix_plan(plan)
            for text in plan.lines():
                self.log(text)
            costs = self._predict(plan, pilot_results)
            if dry_run:
                return None
            # the main phase runs in reverse, so its first run keeps the last pilot run's models (one compile less)
            main_results: Dict[tuple, PhaseResult] = run_phases(self, [
                Phase(line, sigma, plan.main, None if self.mode == "fixed" else plan.radii_for(sigma),
                      self.phase_path(line, sigma, "main"), "main")
                for line, sigma in reversed([(line, sigma) for line in spec.lines for sigma in spec.sigmas])
                if plan.radii_for(sigma) and plan.main], costs)
        return self._report(plan, indices, pilot_results, main_results, costs)

    def _step(self, phase: Phase, costs: Optional[dict] = None) -> PhaseResult:
        if self.stop.signal:
            raise TableInterrupted(f"stopped by {self.stop.signal} before {phase.line.name} sigma {phase.sigma:g} "
                                   f"({phase.kind})")
        elapsed = time.perf_counter() - self.started
        eta = ""
        if costs is not None:
            predicted = _total(c["seconds"] for c in costs["runs"].values())
            spent = sum(m["seconds"] for m in costs.get("measured", {}).values())
            eta = f"; ETA {max(predicted - spent, 0.0) / 60:.1f} min (predicted)" if predicted is not None else ""
        self.log(f"table: {phase.line.name}, sigma {phase.sigma:g}, {phase.kind} ({len(phase.indices)} images); "
                 f"{elapsed / 60:.1f} min so far{eta}")
        try:
            result = self.run_phase(phase)
        except TableInterrupted as stop:        # the seconds spent so far still count when the table resumes
            self._measured(costs, phase, stop.seconds, None)
            raise
        self._measured(costs, phase, result.seconds, result.samples)
        return result

    def _measured(self, costs: Optional[dict], phase: Phase, seconds: float, samples: Optional[int]) -> None:
        """Adds a run's compute seconds after the pilot (each invocation's, interrupted ones too) to cost.json;
        its samples once it has finished (a line-sigma's phases add up). A SIGKILLed invocation's seconds
        are lost (nothing runs to save them)."""
        if costs is None or phase.kind == "pilot" or not seconds and samples is None:
            return
        key = f"{phase.line.name} | sigma {phase.sigma:g}"
        measured = costs.setdefault("measured", {}).setdefault(key, {"seconds": 0.0, "samples": 0})
        measured["seconds"] += seconds
        if samples is not None:
            phases = measured.setdefault("phases", {})
            phases[f"{phase.kind} {min(phase.indices, default=-1)} x{len(phase.indices)}"] = samples
            measured["samples"] = sum(phases.values())
        (self.out / "cost.json").write_text(json.dumps(costs, indent=1, allow_nan=False) + "\n")

    def _fix_plan(self, plan: TablePlan) -> None:
        """plan.json: written once; a rerun reads it back (same rows give the same plan)."""
        path = self.out / "plan.json"
        if path.exists():
            held = TablePlan.read(path)
            if held != plan:
                raise UserError(f"{path} holds another plan than these rows give; use another --out")
            return
        plan.write(path)

    def _plan_from(self, indices, pilot, results: Dict[tuple, PhaseResult]) -> TablePlan:
        counts_by_line = {}
        for line in self.spec.lines:
            counts_by_line[line.name] = {
                sigma: {r: max(certified(rows, r) for rows in results[(line.name, sigma)].rows.values())
                        for r in self.spec.radii}
                for sigma in self.spec.sigmas}
        plan = plan_from_pilot(indices, pilot, counts_by_line, self.margin, self.reach)
        self._fix_plan(plan)
        return plan

    def _predict(self, plan: TablePlan, pilot_results: Dict[tuple, PhaseResult]) -> dict:
        """Predicted samples and seconds of the main phase, printed and written to cost.json."""
        spec, path = self.spec, self.out / "cost.json"
        held = json.loads(path.read_text(), parse_constant=lambda name: None) if path.exists() else None
        if held is not None and held.get("plan") == plan.mode:
            return held                             # predicted before this folder's main phase began
        runs: Dict[str, dict] = {}
        for line in spec.lines:
            for sigma in spec.sigmas:
                key = f"{line.name} | sigma {sigma:g}"
                radii = plan.radii_for(sigma)
                pilot = pilot_results.get((line.name, sigma))
                if self.mode == "fixed":
                    samples = len(plan.main) * (spec.n0 + spec.n_max)
                    runs[key] = asdict_cost(RunCost(line.name, sigma, len(plan.main), samples, float("nan")))
                elif pilot is None or not (pilot.probe_rate or pilot.seconds):
                    runs[key] = asdict_cost(RunCost(line.name, sigma, len(plan.main), float("nan"), float("nan")))
                else:
                    rate = pilot.probe_rate or pilot.samples / pilot.seconds
                    runs[key] = asdict_cost(predict_run(line.name, sigma, list(pilot.rows.values()), radii,
                                                        len(plan.main), spec.n0, spec.alpha, spec.n_max, rate,
                                                        spec.radii))
                    runs[key].update(samples_per_second=rate, rate_from="probe" if pilot.probe_rate else "pilot",
                                     pilot_samples_per_second=pilot.samples / pilot.seconds if pilot.seconds else None)
        total = {key: _total(c[key] for c in runs.values()) for key in ("samples", "seconds")}
        pilot_samples = sum(r.samples for r in pilot_results.values())
        costs = {"plan": plan.mode, "runs": runs, "predicted": total, "pilot_samples": pilot_samples,
                 "pilot_seconds": sum(r.seconds for r in pilot_results.values())}
        path.write_text(json.dumps(costs, indent=1, allow_nan=False) + "\n")
        seconds, samples = total["seconds"], total["samples"]
        if samples is None:
            self.log("table: no cost prediction without a pilot (--plan all); summary.json will have the measured cost")
        else:
            when = f", {seconds / 60:.1f} min on this machine" if seconds is not None else " (no rate measured yet)"
            self.log(f"table: main phase predicted {samples:,.0f} samples{when} (pilot: {pilot_samples:,} samples)")
        return costs

    def _report(self, plan: TablePlan, indices, pilot_results, main_results, costs) -> dict:
        rows_by_line: Dict[str, LineRows] = {}
        for line in self.spec.lines:
            per: LineRows = {}
            for sigma in self.spec.sigmas:
                combined: Dict[str, List[dict]] = {}
                for results in (pilot_results, main_results):
                    found = results.get((line.name, sigma))
                    if found is not None:
                        for config, rows in found.rows.items():
                            combined.setdefault(config, []).extend(rows)
                if combined:
                    per[sigma] = combined
            rows_by_line[line.name] = per
        pilot_samples = sum(r.samples for r in pilot_results.values())
        main_samples = sum(r.samples for r in main_results.values())
        return self._write_outputs(plan, len(indices), rows_by_line, lambda sigma, r: r in plan.radii_for(sigma),
                                   pilot_samples, main_samples, costs)

    def _write_outputs(self, plan: TablePlan, images: int, rows_by_line: Dict[str, LineRows], settles,
                       pilot_samples: int, main_samples: int, costs: dict,
                       bounds: Optional[Dict[str, List[CellBound]]] = None) -> dict:
        """table.md, table.tex, curves.png and summary.json from every line's rows; `settles(sigma, r)`:
        the runs whose rows count at r; `bounds` (race): the most each cell can be below `all`'s."""
        spec = self.spec
        table = {name: line_cells(per, spec.radii, images, settles) for name, per in rows_by_line.items()}
        acr = {name: line_acr(per) if self.mode == "fixed" else None for name, per in rows_by_line.items()}
        gaps = None if bounds is None else {name: [100.0 * b.undecided_gap / images for b in line_bounds]
                                            for name, line_bounds in bounds.items()}
        text = caption(spec.title, images, spec.sigmas, spec.alpha, self.mode, spec.n_max)
        (self.out / "table.md").write_text(markdown(table, acr, spec.radii, text, gaps))
        (self.out / "table.tex").write_text(latex(table, acr, spec.radii, text))
        plot(self.out / "curves.png", spec.title, rows_by_line, table, spec.radii, images, settles)
        by_config = self._write_by_config(images, rows_by_line, settles)
        runs = len(spec.lines) * len(spec.sigmas)
        measured = costs.get("measured", {})
        extra = {"plan": dataclasses.asdict(plan),
                 "samples": {"total": pilot_samples + main_samples, "pilot": pilot_samples, "main": main_samples,
                             "fixed_n": images * (spec.n0 + spec.n_max) * runs},
                 "seconds": {"predicted": costs["predicted"]["seconds"],
                             "measured": sum(m["seconds"] for m in measured.values()) if measured else None,
                             "pilot": costs.get("pilot_seconds")},
                 "builds": self.model_set.builds, "compiles": self.model_set.compiles, "shared_passes": self.shared_passes,
                 "images": images, "version": _version(), "command": self.command, "seed": spec.seed,
                 "device": spec.run.get("device", "cpu"), "host": socket.gethostname(), "spec": spec.as_dict()}
        write_summary(self.out / "summary.json", table, acr, dict(extra, by_config=by_config), gaps)
        self.log(f"table: wrote {self.out / 'table.md'}, table.tex, table_by_config.md, table_by_config.tex, "
                 f"curves.png, summary.json "
                 f"({extra['samples']['total']:,} samples; fixed-n would draw {extra['samples']['fixed_n']:,})")
        return extra

    def _write_by_config(self, images: int, rows_by_line: Dict[str, LineRows], settles) -> dict:
        """table_by_config.md / .tex: a row per sigma and configuration (the paper's sigma x sigma' layout);
        returns summary.json's `by_config`."""
        spec = self.spec
        rows = layout.config_rows([(line.name, line.group) for line in spec.lines], rows_by_line, spec.radii, images,
                                  settles, with_acr=self.mode == "fixed")
        text = layout.by_config_caption(spec.title, images, self.mode, spec.n_max, any(line.group for line in spec.lines))
        (self.out / "table_by_config.md").write_text(layout.by_config_markdown(rows, spec.radii, text))
        (self.out / "table_by_config.tex").write_text(layout.by_config_latex(rows, spec.radii, text))
        return layout.by_config_summary(rows, spec.radii, text, self.mode)

    # -- the race plan ---------------------------------------------------------------------------

    def _build_race(self, indices: Sequence[int], dry_run: bool) -> Optional[dict]:
        """The race (engine/table/race.py): a pilot of each sigma's first run (for the prediction), the
        first runs on every image, then each line's extensions until its cells are within the tolerance."""
        spec = self.spec
        pilot = pilot_indices(indices, self.pilot_size)
        first = {sigma: initial_radii(spec.radii, sigma) for sigma in spec.sigmas}
        plan = TablePlan("race", tuple(pilot), tuple(indices), {f"{s:g}": list(first[s]) for s in spec.sigmas}, 0.0,
                         {}, 0.0, self.tolerance)
        self._fix_plan(plan)
        for text in plan.lines():
            self.log(text)
        pilot_results = run_phases(self, [Phase(line, sigma, pilot, first[sigma], self.phase_path(line, sigma, "main"),
                                                "pilot") for line in spec.lines for sigma in spec.sigmas])
        costs = self._predict_race(pilot, len(indices), pilot_results)
        if dry_run:
            return None
        chosen = set(pilot)
        rest = [i for i in indices if i not in chosen]
        # reversed, so the first run keeps the last pilot run's models (one compile less)
        main = run_phases(self, [Phase(line, sigma, rest, first[sigma], self.phase_path(line, sigma, "main"), "first")
                                 for line, sigma in reversed([(line, sigma) for line in spec.lines for sigma in spec.sigmas])],
                          costs)
        rows_by_line, bounds, extensions = {}, {}, 0
        for line in spec.lines:
            rules = {sigma: self.request(Phase(line, sigma, (), spec.radii, self.out / "runs" / "rule.tsv", "")).sequential
                     for sigma in spec.sigmas}
            race = LineRace(spec, line, indices, rules, self.phase_path)

            def run_extension(sigma, radii, images, kind, line=line, race=race):
                nonlocal extensions
                extensions += self._step(Phase(line, sigma, images, radii, self.phase_path(line, sigma, kind),
                                               kind, race.starts(sigma, radii, images)), costs).samples
            bounds[line.name] = run_race(race, self.tolerance, run_extension, self.log, self.out / "race.json")
            rows_by_line[line.name] = race.rows_by_sigma()
        pilot_samples = sum(r.samples for r in pilot_results.values())
        main_samples = sum(r.samples for r in main.values()) + extensions
        return self._write_outputs(plan, len(indices), rows_by_line, lambda sigma, r: True, pilot_samples,
                                   main_samples, costs, bounds)

    def _predict_race(self, pilot: Sequence[int], images: int, pilot_results: Dict[tuple, PhaseResult]) -> dict:
        """The race's samples and seconds after the pilot, predicted from the pilot's rows (cost.json)."""
        spec, path = self.spec, self.out / "cost.json"
        if path.exists():
            return json.loads(path.read_text(), parse_constant=lambda name: None)
        chosen = set(pilot)
        runs: Dict[str, dict] = {}
        for line in spec.lines:
            pilot_rows = {sigma: [r for r in next(iter(pilot_results[(line.name, sigma)].rows.values()))
                                  if int(r["idx"]) in chosen] for sigma in spec.sigmas}
            samples = predict_race(pilot_rows, spec.radii, images, spec.n0, spec.alpha, spec.n_max, self.tolerance)
            for sigma in spec.sigmas:
                result = pilot_results[(line.name, sigma)]
                rate = result.probe_rate or (result.samples / result.seconds if result.seconds else None)
                left = max(samples[sigma] - result.samples, 0.0)
                runs[f"{line.name} | sigma {sigma:g}"] = {
                    "line": line.name, "sigma": sigma, "images": images, "samples": left,
                    "seconds": left / rate if rate else None, "samples_per_second": rate,
                    "rate_from": "probe" if result.probe_rate else "pilot"}
        total = {key: _total(c[key] for c in runs.values()) for key in ("samples", "seconds")}
        pilot_samples = sum(r.samples for r in pilot_results.values())
        costs = {"plan": "race", "runs": runs, "predicted": total, "pilot_samples": pilot_samples,
                 "pilot_seconds": sum(r.seconds for r in pilot_results.values())}
        path.write_text(json.dumps(costs, indent=1, allow_nan=False) + "\n")
        when = f", {total['seconds'] / 60:.1f} min on this machine" if total["seconds"] is not None else ""
        self.log(f"table: the race predicted {total['samples']:,.0f} samples after the pilot{when} "
                 f"(pilot: {pilot_samples:,} samples)")
        return costs


def asdict_cost(cost: RunCost) -> dict:
    """A run's cost for cost.json: strict JSON, an unknown number is null."""
    return {k: (None if isinstance(v, float) and v != v else v) for k, v in dataclasses.asdict(cost).items()}


def _total(values) -> Optional[float]:
    """The sum, or None when any part is unknown."""
    values = list(values)
    return None if any(v is None for v in values) else float(sum(values))


def _version() -> str:
    try:
        return version("diffsmooth-engine")
    except PackageNotFoundError:        # a source checkout on sys.path, not installed
        return "unknown"


def command_line() -> str:
    return " ".join(sys.argv)

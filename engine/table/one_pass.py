"""One pass over the samples for several lines of a table at one sigma (a sweep across lines).

Lines that denoise (dds, diffsmooth) at the same sigma, on the same images, settling the same radii
with the same data, denoiser and run options, differ only in what scores the denoised samples. Their
runs are then one sweep (base_classifier/configurations.py): each noisy sample is denoised once and
every line's configurations vote on it. The sweep's configurations are exactly the lines' own (each
line's run, planned on its own, names them: no cross product of one line's classifiers with another
line's methods), and each configuration's rows go to the file the line's own run would write, with
the settings file (or sweep index) that run would record. A configuration of a sweep votes on the
same samples as its single run (noise keyed by seed, image and sample index) and stops at its own
look, so every line's rows equal those of its separate run, and the race decides as it would.

Resume: a line whose file already holds every image of the phase leaves the pass (its rows are read
back); a pass left with one line is that line's ordinary run. Interrupted, the pass keeps the rows
of the images it finished (every configuration's row of an image is written together).

Only the runs a table shares in full go through here (the race's first runs, the pilot plan's pilot
and main runs); the race's extensions rerun a few images of one line and stay per line. RS lines
never join: they do not denoise, so a shared pass would save only the noise draw.
"""

from __future__ import annotations

import dataclasses
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from diffsmooth.engine.errors import Terminated
from diffsmooth.engine.runs.dataset_run import run_dataset
from diffsmooth.engine.runs.execute import build_voter
from diffsmooth.engine.runs.plan import ResolvedRun, plan_run
from diffsmooth.engine.runs.results import read_rows
from diffsmooth.engine.table.pilot_rate import timed_batches

DENOISED = ("dds", "diffsmooth")                   # the methods that draw the UNet
# request options that may differ between the lines of one pass (what scores the denoised samples)
PER_LINE = ("method", "classifier", "local_sigma", "m", "out")


@dataclass(frozen=True)
class SharedPass(ResolvedRun):
    """The lines' runs as one sweep: every line's configurations, each writing to its line's file."""

    files: Tuple[Path, ...] = ()

    @property
    def is_sweep(self) -> bool:
        return True

    def result_files(self):
        return dict(zip(self.configurations, self.files))

    def recorded(self) -> dict:
        raise TypeError("a shared pass has no settings of its own: each line's run records its file's")

    def lock_targets(self):
        raise TypeError("a shared pass holds no lock of its own: each line's run locks its file")


def pass_key(builder, phase) -> Optional[tuple]:
    """What phases must share to run as one pass (None: the phase runs alone)."""
    if phase.line.method not in DENOISED:
        return None
    options = builder.request(phase)
    fixed = tuple((k, repr(getattr(options, k))) for k in sorted(f.name for f in dataclasses.fields(options))
                  if k not in PER_LINE)
    return phase.sigma, tuple(phase.indices), None if phase.radii is None else tuple(phase.radii), phase.kind, fixed


def groups(builder, phases: Sequence) -> List[List]:
    """The phases in order, those that can share a pass gathered at the place of the first of them."""
    out: List[List] = []
    where: Dict[tuple, int] = {}
    for phase in phases:
        key = pass_key(builder, phase)
        if key is not None and key in where:
            out[where[key]].append(phase)
            continue
        if key is not None:
            where[key] = len(out)
        out.append([phase])
    return out


def run_phases(builder, phases: Sequence, costs: Optional[dict] = None) -> Dict[tuple, object]:
    """Every phase's PhaseResult by (line name, sigma); phases that can share a pass run as one when
    the builder's `one_pass` is on, else each alone (TableBuilder._step)."""
    results: Dict[tuple, object] = {}
    for group in (groups(builder, phases) if builder.one_pass else [[p] for p in phases]):
        if len(group) > 1:
            results.update(shared_step(builder, group, costs))
        else:
            results[(group[0].line.name, group[0].sigma)] = builder._step(group[0], costs)
    return results


def _planned(builder, phase) -> ResolvedRun:
    run = plan_run(builder.request(phase))
    return dataclasses.replace(run, indices=tuple(phase.indices))


def _done(run: ResolvedRun) -> bool:
    want = set(run.indices)
    for path in run.result_files().values():
        if not (path.is_file() and path.stat().st_size):
            return False
        if not {int(r["idx"]) for r in read_rows(path, torn_tail="ignore")} >= want:
            return False
    return True


def shared_run(runs: Sequence[ResolvedRun]) -> Optional[SharedPass]:
    """The runs as one sweep, or None when they cannot share one: other models or fast path (checked
    again on the planned runs), two configurations with one name, or one classifier name for two files."""
    first = runs[0]
    same = dataclasses.replace(first.sources, classifier=None)
    if any(dataclasses.replace(r.sources, classifier=None) != same or (r.device, r.batch, r.fast) !=
           (first.device, first.batch, first.fast) or r.shards.num_shards > 1 for r in runs):
        return None
    configs, files, paths = [], [], {}
    for run in runs:
        for config, path in run.result_files().items():
            configs.append(config)
            files.append(path)
        for name, path in run.classifier_paths.items():
            if paths.setdefault(name, path) != path:
                return None
    if len({c.name for c in configs}) != len(configs):
        return None
    fields = {f.name: getattr(first, f.name) for f in dataclasses.fields(ResolvedRun)}
    fields.update(configurations=tuple(configs), classifier_paths=paths, out=first.out.parent)
    return SharedPass(**fields, files=tuple(files))


def shared_step(builder, phases: Sequence, costs: Optional[dict]) -> Dict[tuple, object]:
    """The phases (one sigma, the same images and radii) as one pass; each line's PhaseResult."""
    # here, not at the top: build.py imports this module
    from diffsmooth.engine.table.build import PhaseResult, TableInterrupted

    order = [line.name for line in builder.spec.lines]
    phases = sorted(phases, key=lambda p: order.index(p.line.name))     # the configurations in the spec's order
    runs = [_planned(builder, phase) for phase in phases]
    todo = [k for k, run in enumerate(runs) if not _done(run)]
    shared = shared_run([runs[k] for k in todo]) if len(todo) > 1 else None
    if shared is None:                          # nothing left to share: each line's ordinary run (or its rows)
        return {(p.line.name, p.sigma): builder._step(p, costs) for p in phases}
    phase = phases[0]
    names = " + ".join(phases[k].line.name for k in todo)
    if builder.stop.signal:
        raise TableInterrupted(f"stopped by {builder.stop.signal} before {names} sigma {phase.sigma:g} ({phase.kind})")
    builder.log(f"table: {names}, sigma {phase.sigma:g}, {phase.kind} ({len(phase.indices)} images), one pass: the "
                f"denoiser runs once per batch for {len(todo)} lines; "
                f"{(time.perf_counter() - builder.started) / 60:.1f} min so far")
    key = ("one pass", phase.sigma, tuple(phases[k].line.name for k in todo))
    if key not in builder.voters:
        builder.voters = {key: build_voter(shared, builder.log, builder.model_set)}
    voter = builder.voters[key]
    predicting = phase.kind == "pilot" and not (builder.out / "cost.json").exists()
    r = shared.request
    start = time.perf_counter()

    def stopped(message: str):
        seconds = time.perf_counter() - start
        for k in todo:                          # the seconds spent still count when the table resumes
            builder._measured(costs, phases[k], seconds / len(todo), None)
        return TableInterrupted(message, seconds)

    with ExitStack() as stack:
        for k in todo:                          # each line's file: its own lock and settings, as its own run
            stack.enter_context(runs[k].hold_locks())
            runs[k].check_resumable(record=True)
        clock = stack.enter_context(timed_batches(voter, predicting))
        try:
            summary = run_dataset(voter, shared.dataset, list(shared.indices), list(shared.files), mode=r.mode, n0=r.n0,
                                  n=r.n, alpha=r.alpha, batch=shared.batch, progress=not r.quiet,
                                  sequential=shared.sequential, window=r.window,
                                  keep_states=shared.sequential is not None and builder.mode == "race")
        except Terminated:
            raise stopped(f"stopped by SIGTERM during {names} sigma {phase.sigma:g} ({phase.kind})") from None
    seconds = time.perf_counter() - start
    builder.log(summary.line())
    if summary.interrupted:
        raise stopped(f"stopped during {names} sigma {phase.sigma:g} ({phase.kind})")
    builder.shared_passes += 1
    rate = clock.rate(shared.batch) if clock is not None else None
    if rate is not None:
        builder.log(f"table: timing, {names} sigma {phase.sigma:g} (one pass): {rate:,.0f} samples/s "
                    f"from {clock.describe(shared.batch)}")
    elif predicting and seconds > 0:            # one batch: the pass's samples over its seconds
        rate = summary.samples_computed / seconds
    out: Dict[tuple, object] = {}
    for k, (p, run) in enumerate(zip(phases, runs)):
        rows = {c.name: sorted(read_rows(path, torn_tail="ignore"), key=lambda row: int(row["idx"]))
                for c, path in run.result_files().items()}
        share = seconds / len(todo) if k in todo else 0.0
        result = PhaseResult(rows, share, builder._samples(rows, p, {c.name: path for c, path in run.result_files().items()}),
                             rate)
        builder._measured(costs, p, share, result.samples)
        out[(p.line.name, p.sigma)] = result
    return out

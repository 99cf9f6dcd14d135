"""Running a table's phases, the one way: each group of phases that can share a pass (one sigma, the same
images and radii, lines that denoise: engine/table/one_pass.py) runs as one sweep, and a phase alone is a
pass of one. A pass skips what its files already hold, holds every line's file lock and settings, keeps
the voter of the last pass (its stages stay in the table's model set), times the pilot's batches, and
turns Ctrl-C / SIGTERM into TableInterrupted with the compute seconds spent so far."""

from __future__ import annotations

import time
from contextlib import ExitStack
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from diffsmooth.engine.errors import Terminated
from diffsmooth.engine.runs.assemble import ModelSources
from diffsmooth.engine.runs.dataset_run import Jobs, run_dataset
from diffsmooth.engine.runs.execute import build_voter
from diffsmooth.engine.runs.model_set import ModelSet
from diffsmooth.engine.runs.request import RunRequest
from diffsmooth.engine.runs.resolve import DATA_OPTIONS, ResolvedRun, RunInputs, open_run_inputs, resolve_run
from diffsmooth.engine.runs.sources import ModelOptions, resolve_sources
from diffsmooth.engine.table.folder import TableFolder
from diffsmooth.engine.table.one_pass import groups, shared_run
from diffsmooth.engine.table.phases import Phase, PhaseResult, StopRequest, TableInterrupted, ordered_starts, probe_rate
from diffsmooth.engine.table.pilot_rate import timed_batches
from diffsmooth.engine.table.ranks import Ranks
from diffsmooth.engine.table.spec import TableSpec


class PhaseRunner:
    """Runs phases of `spec` into `folder`. `request(phase)`: the phase's run as the command line would ask
    it; `keep_states`: sequential rows keep their states (the race goes on from them); `one_pass`: phases
    that can share a pass run as one; `ranks`: torchrun's ranks share every pass (engine/table/ranks.py); `inputs`:
    what the table's runs read, opened once (TableInputs)."""

    def __init__(self, spec: TableSpec, folder: TableFolder, request: Callable[[Phase], RunRequest],
                 log: Callable[[str], None], keep_states: bool = False, one_pass: bool = True, ranks: Ranks = Ranks(),
                 inputs: Optional[TableInputs] = None):
        self.spec, self.folder, self.request, self.log, self.ranks = spec, folder, request, log, ranks
        self.keep_states, self.one_pass = keep_states, one_pass
        self.voters: Dict[tuple, object] = {}   # the last pass's voter, by what it runs
        self.model_set = ModelSet()             # the stages built so far, reused by every run of the same architecture
        self.inputs = inputs or TableInputs()   # the data opened once, each line's model sources once
        self.stop = StopRequest()
        self.started = time.perf_counter()
        self.shared_passes = 0                  # passes this invocation ran for several lines at once
        self.samples_computed = 0               # noisy samples this process ran through the models (padding included)
        self.phase_shares: List[dict] = []      # each pass's samples per rank (summary.json's ranks.phases)

    def run(self, phases: Sequence[Phase], costs: Optional[dict] = None) -> Dict[tuple, PhaseResult]:
        """Every phase's PhaseResult by (line name, sigma), in order; phases that can share a pass run as one."""
        results: Dict[tuple, PhaseResult] = {}
        for group in (groups(self.request, phases) if self.one_pass else [[p] for p in phases]):
            results.update(self.run_group(group, costs))
        return results

    def step(self, phase: Phase, costs: Optional[dict] = None) -> PhaseResult:
        """One phase alone (a pass of one)."""
        return self.run_group([phase], costs)[phase.key]

    def planned(self, phase: Phase) -> ResolvedRun:
        """The phase's run on its images."""
        return self.plan(self.request(phase), phase.indices)

    def plan(self, request: RunRequest, indices: Optional[Sequence[int]] = None) -> ResolvedRun:
        """A run of the table planned on what the table has opened (indices None: the whole selection)."""
        return resolve_run(request, self.inputs.of(request, indices))

    def run_group(self, phases: Sequence[Phase], costs: Optional[dict]) -> Dict[tuple, PhaseResult]:
        """The phases as one pass of what their files still lack; each phase's PhaseResult."""
        order = [line.name for line in self.spec.lines]
        phases = sorted(phases, key=lambda p: order.index(p.line.name))     # the configurations in the spec's order
        runs = [self.planned(phase) for phase in phases]
        todo = self.ranks.agree(lambda: [k for k, run in enumerate(runs) if not self._done(run)])   # rank 0's reading
        if len(todo) > 1 and shared_run([runs[k] for k in todo]) is None:     # cannot share: each line on its own
            out: Dict[tuple, PhaseResult] = {}
            for phase in phases:
                out.update(self.run_group([phase], costs))
            return out
        # rows a pass wrote to rank files but never merged (a rank killed after its last image): merged now
        self.ranks.merge([path for k, run in enumerate(runs) if k not in todo for path in self.merged(run).values()])
        seconds, rate = self._pass([phases[k] for k in todo], [runs[k] for k in todo], costs) if todo else (0.0, None)
        out = {}
        for k, (phase, run) in enumerate(zip(phases, runs)):
            files = self.merged(run)
            rows = self.folder.rows(files)
            self.ranks.same_rows(f"rows of {phase.line.name} sigma {phase.sigma:g} (the folder on a shared disk?)", rows)
            share = seconds / len(todo) if k in todo else 0.0
            phase_rate = rate if k in todo else self._probe_if_untimed(phase, run)
            result = PhaseResult(rows, share, self.folder.samples(rows, phase, files, self.spec.n0, self.spec.n_max),
                                 phase_rate)
            self.folder.measured(costs, phase, share, result.samples)
            out[phase.key] = result
        return out

    def _pass(self, phases: List[Phase], runs: List[ResolvedRun], costs: Optional[dict]):
        """Run the phases' runs as one pass (one run: that run itself); (compute seconds, pilot rate or None)."""
        run = runs[0] if len(runs) == 1 else shared_run(runs)
        phase, names = phases[0], " + ".join(p.line.name for p in phases)
        what = f"{names} sigma {phase.sigma:g} ({phase.kind})"
        stop = self.ranks.agreed_stop(self.stop.signal)        # a stop on any rank stops every rank here
        if stop:
            raise TableInterrupted(f"stopped by {stop} before {what}")
        self.log(self._progress_line(phases, costs))
        key = (phase.line.name, phase.sigma) if len(runs) == 1 else ("one pass", phase.sigma, tuple(p.line.name for p in phases))
        if key not in self.voters:
            self.voters = {key: build_voter(run, self.log, self.model_set)}
        voter = self.voters[key]
        predicting = phase.kind == "pilot" and not self.folder.predicted
        files = [path for r in runs for path in r.result_files().values()]
        starts = [ordered_starts(p, [c.name for c in r.result_files()]) for p, r in zip(phases, runs)]
        common = set.intersection(*(set(s) for s in starts))
        jobs = Jobs.of(run.request, starts={i: [state for s in starts for state in s[i]] for i in common},
                       keep_states=self.keep_states and run.request.sequential is not None,
                       stop_wrong_class=run.request.sequential is not None)
        start = time.perf_counter()

        def stopped(message: str) -> TableInterrupted:
            seconds = time.perf_counter() - start
            for p in phases:                    # the seconds spent still count when the table resumes
                self.folder.measured(costs, p, seconds / len(phases), None)
            return TableInterrupted(message, seconds)

        with ExitStack() as stack:
            for r in runs:                      # each line's file: its own lock and settings, as its own run
                stack.enter_context(r.hold_locks())
                r.check_resumable(record=True)      # under torchrun: rank 0 records, the others check
            clock = stack.enter_context(timed_batches(voter, predicting))
            skip = frozenset.intersection(*(self._finished(path) for path in files)) if self.ranks.distributed \
                else frozenset()
            self.ranks.barrier()                # rank 0 has recorded the settings before any rank goes on
            try:
                summary = run_dataset(voter, run, files, jobs, blocks=self.ranks.plan.blocks(), skip=skip)
            except Terminated:                  # SIGTERM inside a run (engine/runs/dataset_run.py): the whole table stops
                raise stopped(f"stopped by SIGTERM during {what}") from None
        self.ranks.merge(files)                 # and every rank reads the rows rank 0 wrote
        self.samples_computed += summary.samples_computed
        self.phase_shares.append(pass_shares(what, self.ranks.gather((summary.samples_computed, summary.samples_counted))))
        seconds = time.perf_counter() - start
        self.log(summary.line())
        if summary.interrupted:
            raise stopped(f"stopped during {what}")
        self.shared_passes += len(runs) > 1
        rate = clock.rate(run.batch) if clock is not None else None
        if rate is not None:
            self.log(f"table: timing, {what}: {rate:,.0f} samples/s from {clock.describe(run.batch)}")
        elif predicting and seconds > 0:
            rate = summary.samples_computed / seconds
            self.log(f"table: timing, {what}: the pilot ran in one batch; its samples over its compute seconds "
                     f"give the rate")
        return seconds, rate

    def _progress_line(self, phases: List[Phase], costs: Optional[dict]) -> str:
        phase = phases[0]
        elapsed = (time.perf_counter() - self.started) / 60
        eta = ""
        if costs is not None and all(c["seconds"] is not None for c in costs["runs"].values()):
            spent = sum(m["seconds"] for m in costs.get("measured", {}).values())
            predicted = sum(c["seconds"] for c in costs["runs"].values())
            eta = f"; ETA {max(predicted - spent, 0.0) / 60:.1f} min (predicted)"
        if len(phases) == 1:
            return (f"table: {phase.line.name}, sigma {phase.sigma:g}, {phase.kind} ({len(phase.indices)} images); "
                    f"{elapsed:.1f} min so far{eta}")
        return (f"table: {' + '.join(p.line.name for p in phases)}, sigma {phase.sigma:g}, {phase.kind} "
                f"({len(phase.indices)} images), one pass: the denoiser runs once per batch for {len(phases)} lines; "
                f"{elapsed:.1f} min so far{eta}")

    def _probe_if_untimed(self, phase: Phase, run: ResolvedRun) -> Optional[float]:
        """A pilot whose rows a former invocation wrote, before any prediction: this machine's rate from a probe."""
        if phase.kind != "pilot" or self.folder.predicted:
            return None
        index = phase.indices[0]
        key = (phase.line.name, phase.sigma)
        if key not in self.voters:
            self.voters = {key: build_voter(run, self.log, self.model_set)}
        rate = probe_rate(self.voters[key], run.dataset[index][0], index, run.batch)
        self.log(f"table: timing probe, {phase.describe()}: {rate:,.0f} samples/s at batch {run.batch}")
        return rate

    def merged(self, run: ResolvedRun) -> Dict[str, Path]:
        """{configuration: the result file the table reads} (under torchrun too: rank 0 writes it)."""
        return {c.name: path for c, path in run.result_files().items()}

    def _finished(self, merged: Path) -> frozenset:
        """Images with a row in `merged` or in any rank's file of it."""
        return frozenset().union(*(self.folder.done(path) for path in self.ranks.all_files(merged)))

    def _done(self, run: ResolvedRun) -> bool:
        want = set(run.indices)
        return all(self._finished(path) >= want for path in self.merged(run).values())


class TableInputs:
    """What a table's runs read, opened once per table: the dataset and its selection (the images checked once,
    not in every phase) and the model sources of each line's options (a diffusers folder read once)."""

    def __init__(self):
        self.data: Dict[tuple, RunInputs] = {}              # by the data options: one for a table
        self.sources: Dict[tuple, ModelSources] = {}        # by the model options and the data's kind

    def of(self, request: RunRequest, indices: Optional[Sequence[int]] = None) -> RunInputs:
        """The request's inputs, on `indices` (None: the whole selection)."""
        key = tuple(getattr(request, name) for name in DATA_OPTIONS)
        opened = self.data.get(key)
        if opened is None:
            self.data[key] = opened = open_run_inputs(request)
            self.sources[(ModelOptions.of(request), opened.kind)] = opened.sources
        options = (ModelOptions.of(request), opened.kind)
        if options not in self.sources:
            self.sources[options] = resolve_sources(*options)
        return opened._replace(indices=list(opened.indices if indices is None else indices),
                               sources=self.sources[options])


def pass_shares(what: str, per_rank: Sequence[tuple]) -> dict:
    """One pass's samples per rank, (computed, counted) each: what each rank ran through the models (a short
    block's padding included) and the samples whose votes it counted, and the busiest rank's over the mean."""
    computed, counted = [c for c, _ in per_rank], [c for _, c in per_rank]
    mean = sum(counted) / len(counted)
    return {"pass": what, "computed": computed, "counted": counted,
            "busiest_over_mean": max(counted) / mean if mean else None}

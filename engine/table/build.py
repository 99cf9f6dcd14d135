"""`diffsmooth table`: every run of a table, in order, into one folder; the plan fixed before the main
phase; the cost said before it is spent; the outputs written from the rows.

DIR/table.json   the spec, plan, pilot size, margin, reach and tolerance (a rerun with others is refused)
DIR/plan.json    the plan (auto: written after the pilot, before the main phase draws a sample)
DIR/race.json    race: the extensions so far and each cell's bound (engine/table/race_build.py)
DIR/cost.json    predicted samples and seconds of the main phase; measured ones as runs finish or stop
DIR/runs/        one ordinary resumable result file per run (a folder per run for sweeps)
DIR/table.md, table.tex, curves.png, summary.json
DIR/table_by_config.md, table_by_config.tex   a row per sigma and configuration (engine/table/by_config.py)
DIR/.lock        held while a `diffsmooth table` runs on DIR: a second one on the same folder is refused

Where things happen: the plan's class decides which runs a table makes (engine/table/plans.py); the
PhaseRunner draws their samples (engine/table/runner.py); the folder keeps their files
(engine/table/folder.py). Every run is an ordinary result file, so a table killed at any point and rerun
with the same command continues (finished images are skipped) and gives the same table.
"""

from __future__ import annotations

import sys
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Optional

from diffsmooth.engine.runs.locks import hold_lock
from diffsmooth.engine.runs.request import RunRequest
from diffsmooth.engine.table.defaults import MARGIN, PILOT_IMAGES, PLAN, RACE_REACH_SIGMAS, TOLERANCE_POINTS
from diffsmooth.engine.table.folder import TableFolder
from diffsmooth.engine.table.outputs import RunFacts, write_outputs
from diffsmooth.engine.table.phases import Phase, PhaseResult, TableInterrupted, phase_path, stop_between_runs
from diffsmooth.engine.table.plan_table import PlanTable
from diffsmooth.engine.table.plans import table_plan
from diffsmooth.engine.table.ranks import Ranks
from diffsmooth.engine.table.runner import PhaseRunner, TableInputs
from diffsmooth.engine.table.spec import LineSpec, TableSpec

__all__ = ["TableBuilder", "TablePlanning", "TableInterrupted", "Phase", "PhaseResult", "command_line"]


@dataclass(frozen=True)
class TablePlanning:
    """How a table is planned (`--plan`, `--pilot`, `--margin`, `--reach`, `--tolerance`): each plan reads its own."""

    plan: str = PLAN
    pilot: int = PILOT_IMAGES
    margin: float = MARGIN
    reach: float = RACE_REACH_SIGMAS
    tolerance: float = TOLERANCE_POINTS


class TableBuilder:
    """Runs a TableSpec's plan (`planning`) into `out`; `log` takes one line at a time; `inputs`: the data and
    sources the table has opened (its preflight's; None: opened by the first run)."""

    def __init__(self, spec: TableSpec, out, planning: TablePlanning = TablePlanning(),
                 log: Callable[[str], None] = print, command: str = "", progress: bool = True, one_pass: bool = True,
                 inputs: Optional[TableInputs] = None):
        self.spec, self.log, self.command, self.progress = spec, log, command, progress
        self.plan = table_plan(planning.plan, pilot=planning.pilot, margin=planning.margin, reach=planning.reach,
                               tolerance=planning.tolerance)
        self.ranks = Ranks.join(spec.run.get("device", "cpu"))      # torchrun's, or this process alone
        self.folder = TableFolder(out, log, writer=self.ranks.writer)
        # lines that denoise at a sigma draw the UNet once (engine/table/one_pass.py)
        self.runner = PhaseRunner(spec, self.folder, self.request, log, self.plan.keeps_states, one_pass, self.ranks,
                                  inputs)
        self.outcome = None                     # the finished plan's Outcome (build)

    @property
    def out(self) -> Path:
        return self.folder.out

    def request(self, phase: Phase) -> RunRequest:
        """The phase's run as `diffsmooth certify` would be asked for it."""
        options = self.spec.request_options(phase.line, phase.sigma)
        options["quiet"] = not self.progress
        if phase.radii is None:
            return RunRequest.parse("certify", out=str(phase.path), **options)
        # every run of the table looks at the same sample counts, whichever radii it settles (the race's rows
        # bound `all`'s only then; engine/table/race.py)
        return RunRequest.parse("certify", sequential=True, radii=tuple(phase.radii), schedule_radii=self.spec.radii,
                                decide_largest=phase.decides, n_max=self.spec.n_max, out=str(phase.path), **options)

    def phase_path(self, line: LineSpec, sigma: float, kind: str) -> Path:
        return phase_path(self.out, line, sigma, kind)

    def selection(self) -> List[int]:
        """The spec's image selection (dataset, skip, max)."""
        return list(self.probe_run().indices)

    def probe_run(self):
        """The first line's first run as planned on the whole selection (its images, batch and device are every
        run's); the first call opens the table's data (engine/table/runner.py's TableInputs)."""
        line = self.spec.lines[0]
        return self.runner.plan(self.request(Phase(line, self.spec.sigmas[0], (), None, self.out / "runs" / "probe.tsv",
                                                   "")))

    def claim_folder(self) -> None:
        """Record what this folder holds; refuse a folder holding another table."""
        self.folder.claim(dict(spec_fingerprint=self.spec.fingerprint(), **self.plan.identity(), spec=self.spec.as_dict()))

    def run_phase(self, phase: Phase) -> PhaseResult:
        """One phase alone, into its file (what a table's plan runs, one at a time)."""
        return self.runner.step(phase)

    def build(self, dry_run: bool = False) -> Optional[dict]:
        """Run the table; holds the folder's lock (DIR/.lock) throughout, so a second `diffsmooth table`
        on the same folder stops at once (under torchrun rank 0 holds it for all ranks). The runs inside take
        their own files' locks as usual."""
        ranks = self.ranks
        with hold_lock(self.out, "table folder", folder=True) if ranks.writer else nullcontext():
            ranks.same("spec", self.spec.fingerprint())
            indices = self.selection()          # the data and options refused before the folder is claimed
            ranks.agree(self.claim_folder)
            (self.out / "runs").mkdir(parents=True, exist_ok=True)
            with stop_between_runs() as self.runner.stop:
                table = PlanTable(self.spec, self.runner, self.folder, self.request, self.log)
                outcome = self.plan.execute(table, indices, dry_run)
            if outcome is None:
                return None
            self.outcome = outcome              # the rows the outputs are written from (a study reads them here)
            computed = ranks.gather(self.runner.samples_computed)      # each rank's share of the work
            facts = RunFacts(self.runner, self.command, computed)
            summary = ranks.agree(lambda: write_outputs(self.out, self.spec, self.plan, len(indices), outcome, facts,
                                                        self.log))
        ranks.finish()
        return summary


def command_line() -> str:
    return " ".join(sys.argv)

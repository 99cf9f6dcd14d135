"""What a plan sees of the table it runs (engine/table/plans.py): the spec, the phases it may run, the folder's
few records a plan keeps (the fixed plan, the cost prediction, the race's decisions), the log. Narrow on purpose:
a plan never reaches into the builder, its ranks or its folder's other files."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Dict, Optional, Sequence

from diffsmooth.engine.certify.sequential import SequentialRule
from diffsmooth.engine.table.folder import TableFolder
from diffsmooth.engine.table.phases import Phase, PhaseResult, phase_path
from diffsmooth.engine.table.planning import TablePlan
from diffsmooth.engine.table.runner import PhaseRunner
from diffsmooth.engine.table.spec import LineSpec, TableSpec


class PlanTable:
    """The table as its plan runs it; built by the TableBuilder from its spec, phase runner, folder and requests."""

    def __init__(self, spec: TableSpec, runner: PhaseRunner, folder: TableFolder, request: Callable,
                 log: Callable[[str], None]):
        self.spec, self.log = spec, log
        self._runner, self._folder, self._request = runner, folder, request

    def phase_path(self, line: LineSpec, sigma: float, kind: str) -> Path:
        """The result file of a line's run at a sigma ("main", "pilot", or an extension's kind)."""
        return phase_path(self._folder.out, line, sigma, kind)

    def run(self, phases: Sequence[Phase], costs: Optional[dict] = None) -> Dict[tuple, PhaseResult]:
        """Run the phases (those that share the denoiser at a sigma as one pass); results by (line, sigma)."""
        return self._runner.run(phases, costs)

    def step(self, phase: Phase, costs: Optional[dict] = None) -> PhaseResult:
        """Run one phase alone (a race's extension)."""
        return self._runner.step(phase, costs)

    def rule(self, line: LineSpec, sigma: float) -> SequentialRule:
        """The sequential rule a line's runs at a sigma use (every run of the table looks at the same counts)."""
        probe = Phase(line, sigma, (), self.spec.radii, self._folder.out / "runs" / "rule.tsv", "")
        return self._request(probe).sequential

    def fix_plan(self, plan: TablePlan) -> None:
        """Record the plan (plan.json) once, every rank agreeing; a rerun must find the same plan."""
        self._runner.ranks.agree(lambda: self._folder.fix_plan(plan))

    def prediction(self, mode: str) -> Optional[dict]:
        """The cost prediction recorded before this folder's runs began, if any."""
        return self._folder.prediction(mode)

    def write_costs(self, costs: dict) -> None:
        self._folder.write_costs(costs)

    def agreed(self, read):
        """What `read()` gives on rank 0, on every rank (a decision the folder records travels as a message)."""
        return self._runner.ranks.agree(read)

    @property
    def race_record(self) -> Path:
        """race.json: the race's decisions, replayed by a rerun and by every rank."""
        return self._folder.out / "race.json"

    @property
    def writer(self) -> bool:
        """Whether this process writes the folder's shared files (rank 0, or the only process)."""
        return self._folder.writer

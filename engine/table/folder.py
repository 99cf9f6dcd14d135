"""A table's folder: what it holds (table.json, refused for another table), its plan (plan.json, written
once), its cost (cost.json: predicted, then measured as runs finish) and the rows its runs wrote."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Callable, Dict, List, Optional

from diffsmooth.engine.errors import UserError
from diffsmooth.engine.runs.results import read_rows
from diffsmooth.engine.runs.row_states import drawn_samples, read_states, states_path
from diffsmooth.engine.table.phases import Phase
from diffsmooth.engine.table.planning import TablePlan

IDENTITY_NAMES = (("spec_fingerprint", "spec"), ("plan", "plan"), ("pilot", "pilot size"), ("margin", "margin"),
                  ("reach", "reach"), ("tolerance", "tolerance"))


class TableFolder:
    """DIR of `diffsmooth table --out DIR`; `log` takes one line at a time. `writer`: this process writes the
    folder's own files (under torchrun, rank 0 alone: engine/table/ranks.py)."""

    def __init__(self, out, log: Callable[[str], None], writer: bool = True):
        self.out, self.log, self.writer = Path(out), log, writer

    # -- what the folder holds -------------------------------------------------------------------

    def claim(self, identity: dict) -> None:
        """Record what this folder holds (table.json); refuse a folder holding another table. A race asked
        again with a smaller tolerance and nothing else changed continues: its rows stay valid (every row is
        about `all` on the same paths)."""
        path = self.out / "table.json"
        if not path.exists():
            self.out.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(identity, indent=1, allow_nan=False) + "\n")
            return
        try:
            held = json.loads(path.read_text())
        except ValueError:
            raise UserError(f"{path} is damaged (not JSON); use another --out") from None
        if _tightens(held, identity):
            self.log(f"table: race, the tolerance goes from {held['tolerance']:g} to {identity['tolerance']:g} points: "
                     f"the finished rows stay, and more images are settled until every cell is within it")
            held["tolerance"] = identity["tolerance"]
            plan = self.out / "plan.json"
            if plan.exists():
                dataclasses.replace(TablePlan.read(plan), tolerance=identity["tolerance"]).write(plan)
            path.write_text(json.dumps(held, indent=1, allow_nan=False) + "\n")
            return
        if {k: held.get(k) for k in identity} != json.loads(json.dumps(identity)):
            changed = [name for k, name in IDENTITY_NAMES if held.get(k) != identity.get(k)]
            raise UserError(f"{self.out} holds a table with another {' / '.join(changed) or 'spec'}: "
                            f"rerun with the same spec and options, or use another --out")

    def fix_plan(self, plan: TablePlan) -> None:
        """plan.json: written once; a rerun reads it back (same rows give the same plan)."""
        path = self.out / "plan.json"
        if path.exists():
            if TablePlan.read(path) != plan:
                raise UserError(f"{path} holds another plan than these rows give; use another --out")
            return
        plan.write(path)

    # -- cost.json ------------------------------------------------------------------------------

    def prediction(self, mode: str) -> Optional[dict]:
        """cost.json as predicted before this folder's main phase began (None: not yet, or another plan's)."""
        path = self.out / "cost.json"
        held = json.loads(path.read_text(), parse_constant=lambda name: None) if path.exists() else None
        return held if held is not None and held.get("plan") == mode else None

    @property
    def predicted(self) -> bool:
        return (self.out / "cost.json").exists()

    def write_costs(self, costs: dict) -> None:
        if not self.writer:
            return
        (self.out / "cost.json").write_text(json.dumps(costs, indent=1, allow_nan=False) + "\n")

    def measured(self, costs: Optional[dict], phase: Phase, seconds: float, samples: Optional[int]) -> None:
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
        self.write_costs(costs)

    # -- rows ------------------------------------------------------------------------------------

    @staticmethod
    def done(path: Path) -> set:
        """The images with a complete row in a result file (none when it is missing or empty)."""
        return {int(r["idx"]) for r in read_rows(path, torn_tail="ignore")} if path.is_file() and path.stat().st_size \
            else set()

    @staticmethod
    def rows(files: Dict[str, Path]) -> Dict[str, List[dict]]:
        """{configuration: rows by image index} of a run's result files."""
        return {name: sorted(read_rows(path, torn_tail="ignore"), key=lambda r: int(r["idx"]))
                for name, path in files.items()}

    @staticmethod
    def samples(rows: Dict[str, List[dict]], phase: Phase, files: Dict[str, Path], n0: int, n_max: int) -> int:
        """Samples the phase's images drew (a file may hold other phases' images too); a row that went on
        from an earlier row's state drew only the samples after it (its own state says from where)."""
        if phase.radii is None:
            return len(phase.indices) * (n0 + n_max)
        mine = set(phase.indices)
        per_image: Dict[int, int] = {}
        for name, config_rows in rows.items():
            states = read_states(states_path(files[name]))
            for r in config_rows:
                if int(r["idx"]) in mine:
                    per_image[int(r["idx"])] = max(per_image.get(int(r["idx"]), 0), drawn_samples(r, states, n0))
        return sum(per_image.values())


def _tightens(held: dict, identity: dict) -> bool:
    """A finished or interrupted table asked again with a smaller tolerance (a plan with one: the race), and
    nothing else changed."""
    same = {k: held.get(k) for k in identity if k != "tolerance"} == json.loads(json.dumps(
        {k: v for k, v in identity.items() if k != "tolerance"}))
    return (same and isinstance(identity.get("tolerance"), (int, float)) and isinstance(held.get("tolerance"), (int, float))
            and identity["tolerance"] < held["tolerance"])

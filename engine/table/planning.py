"""Which sigma runs settle which radius: a table's plan as plan.json holds it (TablePlan, for the four
plans of engine/table/plans.py: race, auto, all, fixed), and the assignment of the `auto` plan.

fixed: fixed-n CERTIFY at n = n-max for every sigma (the paper's way). all: every sigma run settles
every radius with the sequential rule. race: engine/table/race.py. auto: a pilot of P images, an even stride through the
selection (image folders come in class order), settles every radius for every sigma; then each
radius goes to the sigma runs that can still win it, and the other images settle only their sigma's
radii. A radius goes to the sigma with the most pilot certificates there (ties: the larger sigma,
which reaches further), to its better neighbour in the sigma list, and to every sigma within the
slack: max(1 image, `margin` x P) certificates below the best (no slack where no pilot image is
certified: the two largest candidates try). The neighbour joins only within its reach, r <= `reach`
x sigma: settling r needs pA >= Phi(r / sigma), so the samples an image needs grow like
1 / (1 - Phi(r / sigma)) (an image with every vote stops the sequential rule, alpha 0.001 and n-max
100,000, after 600 samples at r / sigma = 2, 2,000 at 2.5, 10,300 at 3, 52,400 at 3.5), for a cell
the pilot says it loses. A sigma within the slack joins however far: capping those too saved more
samples on the RS demo but cost the DiffSmooth demo 4 points in one cell at n-max 100,000
(simulated; bench/results/table_demo_diffsmooth_100x10000). Each certificate keeps Cohen's
guarantee at alpha whatever the plan: the plan only chooses which radii a sequential run stops for.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from diffsmooth.engine.errors import UserError
from diffsmooth.engine.table.defaults import MARGIN, RACE_REACH_SIGMAS


def pilot_indices(indices: Sequence[int], pilot: int) -> List[int]:
    """`pilot` indices spread evenly through the selection (not its first ones)."""
    if pilot >= len(indices):
        return list(indices)
    return [indices[(2 * k + 1) * len(indices) // (2 * pilot)] for k in range(pilot)]


def assign_radii(counts: Dict[float, Dict[float, int]], pilot: int, margin: float = MARGIN,
                 reach: float = RACE_REACH_SIGMAS) -> Dict[float, List[float]]:
    """{sigma: radii it settles} from the pilot's certified counts {sigma: {radius: images}}."""
    sigmas = sorted(counts)
    radii = sorted({r for per in counts.values() for r in per})
    slack = max(1, math.ceil(margin * pilot))
    assigned: Dict[float, List[float]] = {s: [] for s in sigmas}
    for r in radii:
        by = [counts[s].get(r, 0) for s in sigmas]
        best = max(range(len(sigmas)), key=lambda k: (by[k], sigmas[k]))
        chosen = {best} | ({k for k in range(len(sigmas)) if by[k] >= by[best] - slack} if by[best] else set())
        neighbours = [k for k in (best - 1, best + 1) if 0 <= k < len(sigmas) and r <= reach * sigmas[k]]
        if neighbours:
            chosen.add(max(neighbours, key=lambda k: (by[k], sigmas[k])))
        for k in chosen:
            assigned[sigmas[k]].append(r)
    return assigned


@dataclass(frozen=True)
class TablePlan:
    """The plan fixed before the main phase draws a sample (written to plan.json)."""

    mode: str
    pilot: Tuple[int, ...]                      # image indices of the pilot (auto)
    main: Tuple[int, ...]                       # the images the main result files hold (auto: all but the pilot's;
                                                # race: every image, its pilot runs being the first runs of its first images)
    radii: Dict[str, List[float]]               # sigma (as text) -> radii its main runs settle
    margin: float                               # auto's (0 for the other plans)
    pilot_counts: Dict[str, Dict[str, Dict[str, int]]]     # line -> sigma -> radius -> certified pilot images
    reach: float = RACE_REACH_SIGMAS                           # auto: the best's neighbour settles r <= reach x sigma (0: race)
    tolerance: Optional[float] = None                      # race: the most a cell may be below `all`'s (points)

    def radii_for(self, sigma: float) -> List[float]:
        return self.radii[f"{sigma:g}"]

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=1, allow_nan=False) + "\n")

    @classmethod
    def read(cls, path: Path) -> "TablePlan":
        try:
            d = json.loads(path.read_text())
            return cls(d["mode"], tuple(d["pilot"]), tuple(d["main"]), d["radii"], d["margin"], d["pilot_counts"],
                       d["reach"], d.get("tolerance"))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise UserError(f"{path}: not a plan this version wrote ({exc}); remove it to plan again") from None


def plan_without_pilot(mode: str, indices: Sequence[int], sigmas: Sequence[float], radii: Sequence[float]) -> TablePlan:
    """`all` and `fixed`: every sigma settles every radius on every image."""
    return TablePlan(mode, (), tuple(indices), {f"{s:g}": list(radii) for s in sigmas}, 0.0, {})


def plan_from_pilot(indices: Sequence[int], pilot: Sequence[int], counts_by_line: Dict[str, Dict[float, Dict[float, int]]],
                    margin: float, reach: float = RACE_REACH_SIGMAS) -> TablePlan:
    """`auto`: a radius goes to a sigma when any line assigns it there (the runs of one sigma share
    their radii, so every line's winners are kept)."""
    merged: Dict[float, set] = {}
    for counts in counts_by_line.values():
        for sigma, radii in assign_radii(counts, len(pilot), margin, reach).items():
            merged.setdefault(sigma, set()).update(radii)
    pilot_set = set(pilot)
    return TablePlan("auto", tuple(pilot), tuple(i for i in indices if i not in pilot_set),
                     {f"{s:g}": sorted(r) for s, r in sorted(merged.items())}, margin,
                     {line: {f"{s:g}": {f"{r:g}": int(c) for r, c in per.items()} for s, per in counts.items()}
                      for line, counts in counts_by_line.items()}, reach)

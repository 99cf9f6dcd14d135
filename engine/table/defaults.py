"""The table's defaults, each defined once: `diffsmooth table`'s options (diffsmooth/cli/table.py), the spec
reader (spec.py), `--check` (check.py) and the planner (build.py, planning.py, race.py) read them from here;
tests/engine/table/test_defaults_once.py checks that they do. The numbers a table shares with `certify`
(n0, n, alpha, seed, m) are engine/choices.py's; the studies behind these: docs/table-studies.md.
"""

from __future__ import annotations

from diffsmooth.engine.choices import DEFAULT_M

# How a table is planned (`--plan`, `--pilot`, `--tolerance`, `--margin`, `--reach`)
PLAN = "race"                       # the sigmas race for each radius (plans.PLAN_NAMES lists the others)
PILOT_IMAGES = 25                   # pilot images of a spec's table: an even stride through the selection
DEMO_PILOT_IMAGES = 4               # ... of the demo table (16 images)
TOLERANCE_POINTS = 0.5              # race: the most, in points, a cell may be below `--plan all`'s
MARGIN = 0.05                       # auto: a sigma within max(1 image, MARGIN x pilot) of the best settles a radius too
RACE_REACH_SIGMAS = 2.5             # a sigma's first radii, and auto's cap: r <= 2.5 sigma (docs/table-studies.md)

# What a spec leaves out (engine/table/spec.py)
SIGMAS = (0.25, 0.5, 1.0)                       # the paper's smoothing noises
RADII = tuple(r / 4 for r in range(9))          # 0, 0.25, ..., 2.0 (radius 0 is always added)
TITLE = "certified accuracy"
LOCAL_SIGMA_FRACTION = 0.5          # a diffsmooth line without local_sigma: sigma' = sigma / 2 (the paper's)


def local_sigmas(sigma: float) -> tuple:
    """A diffsmooth line's sigma' at `sigma` when the spec names none."""
    return (LOCAL_SIGMA_FRACTION * sigma,)


def local_noises(sigma: float) -> tuple:
    """A diffsmooth line's m at `sigma` when the spec names none (engine/choices.py's DEFAULT_M)."""
    return (DEFAULT_M,)

"""A sequential rule's chance of certifying each radius when the label's vote rate is p, by running the engine's own
rule (engine/certify/sequential.py `run_rule`: its looks, levels, unanimity bound and futility stop) on simulated
vote paths at a grid of rates, dense where the chance turns from 0 to 1. What a rerun of a sequential run sees
(engine/table/rerun_cells.py)."""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence, Tuple

import numpy as np
from scipy.stats import norm

from diffsmooth.engine.certify.sequential import SequentialRule, run_rule

PATHS = 128                     # vote paths per grid rate
SPREAD = 6.0                    # the dense grid spans the last look's needed rate +- this many binomial sds
POINTS = 17                     # grid rates per radius


def grid(rule: SequentialRule, needed: np.ndarray) -> np.ndarray:
    """The rates at which the chance is simulated: around each reachable radius's needed rate at n-max, plus 1/2 and
    1 (below 1/2 no rule certifies)."""
    n = rule.n_max
    points = [np.array([0.5, 1.0])]
    for count in needed[needed <= n]:
        v = count / n
        sd = max(np.sqrt(v * (1 - v) / n), 1.0 / n)
        points.append(v + sd * np.linspace(-SPREAD, SPREAD, POINTS))
    return np.unique(np.clip(np.concatenate(points), 0.5, 1.0))


@lru_cache(maxsize=32)
def _chances(rule: SequentialRule, radii: Tuple[float, ...], needed: Tuple[int, ...]) -> Tuple[np.ndarray, np.ndarray]:
    rates = grid(rule, np.asarray(needed))
    rng = np.random.default_rng(0)
    paths = np.repeat(rates, PATHS)
    votes = rng.binomial(np.asarray(rule.chunks())[None, :], paths[:, None])
    lower, _ = run_rule(rule, votes)
    thresholds = norm.cdf(np.asarray(radii) / rule.sigma)
    certified = (lower[:, None] > 0.5) & (lower[:, None] >= thresholds[None, :])
    chance = certified.reshape(len(rates), PATHS, len(radii)).mean(axis=1)
    return rates, np.maximum.accumulate(chance, axis=0).T          # a chance never falls as the rate grows


def chances(rule: SequentialRule, radii: Sequence[float], needed: Sequence[int]) -> Tuple[np.ndarray, np.ndarray]:
    """(rates, chance[radius, rate]): the rule's chance of certifying each radius at each grid rate (0 below 1/2).
    Cached per rule: the lines of a table share each sigma's rule."""
    return _chances(rule, tuple(float(r) for r in radii), tuple(int(k) for k in needed))

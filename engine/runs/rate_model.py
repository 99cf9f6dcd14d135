"""Vote rates for the simulator drawn from each image's posterior, with room for rates of exactly 1.

Jeffreys' estimate (engine/runs/simulation.py) replays an image that stopped with all n of n votes at
p = (n + 1/2) / (n + 1): it then misses a vote within a few n more samples. Measured images say
otherwise: of the 104 DiffSmooth demo images with every vote that the race reran to r / sigma = 3,
96 kept every vote to 6,306 samples (Jeffreys' estimate expects 6; the mixture below 103;
bench/results/table_race_sim/rate_calibration.md). Many images' true rate is 1 or so close to it
that no table's n-max tells the difference. The prior here mixes a point mass at p = 1 (weight w)
with Jeffreys' Beta(1/2, 1/2); w is fitted to the rows by maximum marginal likelihood (EM), and a
simulated seed draws every image's rate from its posterior: p = 1 with the posterior weight of the
point mass if it has every vote, else from Beta(k + 1/2, n - k + 1/2). The stopping rule that ended a
row does not change the posterior (the likelihood of a stopped path is p^k (1 - p)^(n - k)).
"""

from __future__ import annotations

import numpy as np
from scipy.special import betaln

JEFFREYS = 0.5


def _continuous_evidence(votes: np.ndarray, drawn: np.ndarray) -> np.ndarray:
    """log P(path | p ~ Beta(1/2, 1/2)), without the binomial coefficient (a path's, not a count's)."""
    return betaln(votes + JEFFREYS, drawn - votes + JEFFREYS) - betaln(JEFFREYS, JEFFREYS)


def unanimous_posterior(votes, drawn, weight: float) -> np.ndarray:
    """Each image's posterior probability that its rate is exactly 1 (0 once it missed a vote)."""
    votes, drawn = np.asarray(votes, np.float64), np.asarray(drawn, np.float64)
    every = votes >= drawn
    # P(path | p = 1) = 1 for a path with every vote: posterior odds = w / ((1 - w) * evidence)
    with np.errstate(divide="ignore"):
        log_odds = np.log(weight) - np.log1p(-weight) - _continuous_evidence(votes, drawn)
    return np.where(every, 1.0 / (1.0 + np.exp(-np.clip(log_odds, -700, 700))), 0.0)


def fit_unanimous_weight(votes, drawn, iterations: int = 200) -> float:
    """The point mass's weight w maximising the rows' marginal likelihood (EM; 0 when no image has
    every vote)."""
    votes, drawn = np.asarray(votes, np.float64), np.asarray(drawn, np.float64)
    if not np.any(votes >= drawn) or len(votes) == 0:
        return 0.0
    weight = 0.5
    for _ in range(iterations):
        new = float(np.mean(unanimous_posterior(votes, drawn, weight)))
        if abs(new - weight) < 1e-10:
            break
        weight = min(max(new, 1e-12), 1 - 1e-12)
    return weight


def draw_rates(votes, drawn, weight: float, rng) -> np.ndarray:
    """One draw of every image's rate from its posterior under the mixture prior with weight w."""
    votes, drawn = np.asarray(votes, np.float64), np.asarray(drawn, np.float64)
    one = rng.random(len(votes)) < unanimous_posterior(votes, drawn, weight)
    continuous = rng.beta(votes + JEFFREYS, drawn - votes + JEFFREYS)
    return np.where(one, 1.0, continuous)

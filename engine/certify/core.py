"""CERTIFY and PREDICT of Cohen et al. (2019), "Certified Adversarial Robustness via Randomized
Smoothing", Algorithm "certify and predict"; read next to the paper as Cohen's `core.py`.

The math works on integer vote counts in plain Python + scipy: selection counts (n0 samples) pick
the class cA, estimation counts (n further samples) give nA, the one-sided Clopper-Pearson bound
pA_lower holds with probability >= 1 - alpha, and the l2 radius is sigma * Phi^-1(pA_lower); the
smoothed classifier abstains when pA_lower < 1/2. CERTIFY and PREDICT are written as *jobs*:
generators that ask for sample ranges (`Request`) and are sent their vote counts, so one
scheduler (certify/scheduler.py) can pack many images' requests into each batch. `Smooth` runs
them on a Monte Carlo pipeline (certify/monte_carlo.py). Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Generator, Optional, Sequence, Tuple

import numpy as np
from scipy.stats import beta, binomtest, norm

from diffsmooth.engine.errors import UserError, check_alpha

if TYPE_CHECKING:                       # the pipeline (and torch) are only needed by callers
    from diffsmooth.engine.certify.monte_carlo import MonteCarloPipeline

ABSTAIN = -1


# --------------------------------------------------------------------------------------------
# The math: counts in, (class, radius) out


def lower_confidence_bounds(n_a, n, alpha) -> np.ndarray:
    """Vectorised one-sided (1 - alpha) Clopper-Pearson lower bounds on p (arrays broadcast):
    the alpha quantile of Beta(n_a, n - n_a + 1), and 0 where n_a = 0. The one formula of the project."""
    n_a, n, alpha = np.broadcast_arrays(*(np.asarray(v, dtype=np.float64) for v in (n_a, n, alpha)))
    if np.any(n < 1) or np.any(n_a < 0) or np.any(n_a > n):
        raise ValueError("need 0 <= n_a <= n and n >= 1")
    if np.any(alpha <= 0) or np.any(alpha >= 1):
        raise ValueError("alpha must be in (0, 1)")
    return np.where(n_a > 0, beta.ppf(alpha, np.maximum(n_a, 1.0), n - n_a + 1), 0.0)


def upper_confidence_bounds(n_a, n, alpha) -> np.ndarray:
    """Vectorised one-sided (1 - alpha) Clopper-Pearson upper bounds: 1 - the lower bound of the failures."""
    n_a, n = np.broadcast_arrays(np.asarray(n_a, dtype=np.float64), np.asarray(n, dtype=np.float64))
    return 1.0 - lower_confidence_bounds(n - n_a, n, alpha)


def lower_confidence_bound(n_a: int, n: int, alpha: float) -> float:
    """One-sided (1 - alpha) Clopper-Pearson lower bound on p from n_a successes in n trials."""
    check_alpha(alpha)
    if n < 1 or not 0 <= n_a <= n:
        raise ValueError(f"need 0 <= n_a <= n and n >= 1, got n_a={n_a}, n={n}")
    return float(lower_confidence_bounds(n_a, n, alpha))


def certified_radius(n_a: int, n: int, alpha: float, sigma: float) -> Optional[float]:
    """l2 radius sigma * Phi^-1(pA_lower), or None (abstain) when pA_lower < 1/2."""
    p_lower = lower_confidence_bound(n_a, n, alpha)
    if p_lower < 0.5:
        return None
    return float(sigma * norm.ppf(p_lower))


def top_class(counts: Sequence[int]) -> int:
    """Index of the largest count; the first maximum wins ties (numpy/torch argmax order)."""
    best = 0
    for i, c in enumerate(counts):
        if c > counts[best]:
            best = i
    return best


def certify_from_counts(selection: Sequence[int], estimation: Sequence[int],
                        alpha: float, sigma: float) -> Tuple[int, float]:
    """CERTIFY: (cA, radius), or (ABSTAIN, 0.0) when pA_lower < 1/2 (as the reference)."""
    c_a = top_class(selection)
    radius = certified_radius(int(estimation[c_a]), int(sum(estimation)), alpha, sigma)
    if radius is None:
        return ABSTAIN, 0.0
    return c_a, radius


def predict_from_counts(counts: Sequence[int], alpha: float) -> int:
    """PREDICT: the top class if a two-sided binomial test rejects a tie with the runner-up."""
    check_alpha(alpha)
    order = sorted(range(len(counts)), key=lambda i: (-counts[i], i))
    c1 = int(counts[order[0]])
    c2 = int(counts[order[1]]) if len(order) > 1 else 0
    if c1 + c2 == 0 or binomtest(c1, c1 + c2, 0.5).pvalue > alpha:
        return ABSTAIN
    return order[0]


def max_certifiable_radius(n: int, alpha: float, sigma: float) -> float:
    """The radius when all n votes agree: sigma * Phi^-1(alpha^(1/n))."""
    return float(sigma * norm.ppf(alpha ** (1.0 / n)))


# --------------------------------------------------------------------------------------------
# The algorithms as jobs: ask for samples, receive counts, return the answer


@dataclass(frozen=True)
class Request:
    """Vote counts of samples first..first+num-1 of the job's image (noise keyed by sample index)."""

    first: int
    num: int


def certify_job(n0: int, n: int, alpha: float, sigma: float) -> Generator:
    """CERTIFY: samples 0..n0-1 select cA, samples n0..n0+n-1 bound pA. Both are asked for at once
    (the estimation counts every class, so it need not wait for the selection)."""
    selection, estimation = yield Request(0, n0), Request(n0, n)
    return certify_from_counts([int(c) for c in selection], [int(c) for c in estimation], alpha, sigma)


def predict_job(n: int, alpha: float) -> Generator:
    """PREDICT: the binomial test on the counts of samples 0..n-1."""
    counts = yield Request(0, n)
    return predict_from_counts([int(c) for c in counts], alpha)


def count_job(first: int, num: int) -> Generator:
    """Just the counts of samples first..first+num-1."""
    return (yield Request(first, num))


def drive(job: Generator, count: Callable[[int, int], object]):
    """Run a job one request at a time with count(first, num) -> counts (replays, tests)."""
    try:
        ask = next(job)
        while True:
            if isinstance(ask, Request):
                ask = job.send(count(ask.first, ask.num))
            else:
                ask = job.send(tuple(count(r.first, r.num) for r in ask))
    except StopIteration as done:
        return done.value


# --------------------------------------------------------------------------------------------
# The smoothed classifier: samples in, counts out, then the math above


def check_certify_parameters(n0: int, n: int, alpha: float, batch: int) -> None:
    """UserError for parameters CERTIFY cannot work with."""
    if n0 < 1:
        raise UserError(f"n0 must be >= 1, got {n0}")
    if n < 1:
        raise UserError(f"n must be >= 1, got {n}")
    check_alpha(alpha)
    if batch < 1:
        raise UserError(f"batch must be >= 1, got {batch}")


class Smooth:
    """g(x) = the most probable vote of the base classifier under N(x, sigma^2 I)."""

    ABSTAIN = ABSTAIN

    def __init__(self, pipeline: "MonteCarloPipeline"):
        self.pipeline = pipeline
        self.sigma = pipeline.sigma

    def certify(self, x, n0: int, n: int, alpha: float, batch: int, image_index: int = 0) -> Tuple[int, float]:
        """(cA, radius) with P[g(x + delta) = cA for all ||delta|| < radius] >= 1 - alpha,
        or (ABSTAIN, 0.0). Samples 0..n0-1 select, samples n0..n0+n-1 estimate."""
        check_certify_parameters(n0, n, alpha, batch)
        return self.pipeline.run_one(x, image_index, certify_job(n0, n, alpha, self.sigma), batch)

    def predict(self, x, n: int, alpha: float, batch: int, image_index: int = 0) -> int:
        """g(x), or ABSTAIN; wrong with probability at most alpha when it does not abstain."""
        check_certify_parameters(1, n, alpha, batch)
        return self.pipeline.run_one(x, image_index, predict_job(n, alpha), batch)

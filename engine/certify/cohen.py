"""CERTIFY and PREDICT of Cohen, Rosenfeld & Kolter (ICML 2019), "Certified Adversarial Robustness
via Randomized Smoothing", as written in the paper's pseudocode; DiffSmooth certifies the same way
with its own base classifier f.

    CERTIFY(f, sigma, x, n0, n, alpha):
        counts0 <- SAMPLEUNDERNOISE(f, x, n0, sigma);  cA <- top index in counts0
        counts  <- SAMPLEUNDERNOISE(f, x, n, sigma);   pA <- LOWERCONFBOUND(counts[cA], n, 1 - alpha)
        if pA > 1/2 return prediction cA and radius sigma * Phi^-1(pA)  else ABSTAIN

    PREDICT(f, sigma, x, n, alpha):
        counts <- SAMPLEUNDERNOISE(f, x, n, sigma);  cA, cB <- top two indices
        if BINOMPVALUE(nA, nA + nB, 0.5) <= alpha return cA  else ABSTAIN

The math works on integer counts in plain numpy + scipy (no torch). The algorithms are jobs
(certify/jobs.py): SAMPLEUNDERNOISE is a `Request` whose counts [configurations, classes] are sent
back, so one job certifies one configuration or every configuration of a sweep alike. Samples
0..n0-1 select and samples n0..n0+n-1 estimate; the noise of each is keyed by its index.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generator, List, Optional, Sequence

import numpy as np
from scipy.stats import beta, binomtest, norm

from diffsmooth.engine.certify.jobs import Request
from diffsmooth.engine.errors import UserError, check_alpha

ABSTAIN = -1


@dataclass(frozen=True)
class Certificate:
    """CERTIFY's answer for one image and configuration: the class and the l2 radius (ABSTAIN and 0.0
    when pA_lower <= 1/2), with the samples it drew (selection included). Unpacks as Cohen's
    (prediction, radius) pair."""

    prediction: int
    radius: float
    samples: int
    top_votes: Optional[int] = None     # estimation votes for the selected class (nA), where known
    state: Optional[object] = field(default=None, compare=False)   # sequential: where it stopped (SequentialState)

    def __iter__(self):
        return iter((self.prediction, self.radius))


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
    """LOWERCONFBOUND: one-sided (1 - alpha) Clopper-Pearson lower bound on p from n_a of n."""
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
    return int(np.argmax(counts))


def certify_from_counts(selection: Sequence[int], estimation: Sequence[int],
                        alpha: float, sigma: float) -> Certificate:
    """CERTIFY from the selection and estimation counts of one configuration."""
    c_a = top_class([int(c) for c in selection])
    n = int(sum(int(c) for c in estimation))
    radius = certified_radius(int(estimation[c_a]), n, alpha, sigma)
    samples = int(sum(int(c) for c in selection)) + n
    if radius is None:
        return Certificate(ABSTAIN, 0.0, samples, int(estimation[c_a]))
    return Certificate(c_a, radius, samples, int(estimation[c_a]))


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


def check_certify_parameters(n0: int, n: int, alpha: float) -> None:
    """UserError for parameters CERTIFY cannot work with."""
    if n0 < 1:
        raise UserError(f"n0 must be >= 1, got {n0}")
    if n < 1:
        raise UserError(f"n must be >= 1, got {n}")
    check_alpha(alpha)


# --------------------------------------------------------------------------------------------
# The algorithms as jobs: ask for samples, receive counts [configurations, classes], answer per row


def certify_job(n0: int, n: int, alpha: float, sigma: float) -> Generator:
    """CERTIFY of every configuration voting on the image's samples: a list of Certificates, one per
    count row. Selection and estimation are asked for at once (the estimation counts every class,
    so it need not wait for cA)."""
    selection, estimation = yield Request(0, n0), Request(n0, n)
    return [certify_from_counts(s, e, alpha, sigma) for s, e in zip(selection, estimation)]


def predict_job(n: int, alpha: float) -> Generator:
    """PREDICT of every configuration on the counts of samples 0..n-1: a list of classes (or ABSTAIN)."""
    counts = yield Request(0, n)
    return [predict_from_counts([int(c) for c in row], alpha) for row in counts]


def only(results: List):
    """The one configuration's result of a job run by a single-configuration voter."""
    if len(results) != 1:
        raise ValueError(f"expected the result of one configuration, got {len(results)}")
    return results[0]

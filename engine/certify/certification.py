"""CERTIFY and PREDICT of Cohen et al. (2019), on integer vote counts; plain Python + scipy.

Read next to the paper: selection counts (n0 samples) pick the class cA, estimation counts
(n samples) give nA, the one-sided Clopper-Pearson bound pA_lower holds with probability
>= 1 - alpha, and the l2 radius is sigma * Phi^-1(pA_lower) when pA_lower >= 1/2.
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

from scipy.stats import beta, binomtest, norm

ABSTAIN = -1


def _check(n_a: int, n: int, alpha: float) -> None:
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if n < 1 or not 0 <= n_a <= n:
        raise ValueError(f"need 0 <= n_a <= n and n >= 1, got n_a={n_a}, n={n}")


def lower_confidence_bound(n_a: int, n: int, alpha: float) -> float:
    """One-sided (1 - alpha) Clopper-Pearson lower bound on p from n_a successes in n trials."""
    _check(n_a, n, alpha)
    if n_a == 0:
        return 0.0
    return float(beta.ppf(alpha, n_a, n - n_a + 1))


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
    """CERTIFY: (cA, radius), or (ABSTAIN, 0.0) when pA_lower < 1/2 (FACTS §3, as Cohen's core.py)."""
    c_a = top_class(selection)
    radius = certified_radius(int(estimation[c_a]), int(sum(estimation)), alpha, sigma)
    if radius is None:
        return ABSTAIN, 0.0
    return c_a, radius


def predict_from_counts(counts: Sequence[int], alpha: float) -> int:
    """PREDICT: the top class if a two-sided binomial test rejects a tie with the runner-up."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    order = sorted(range(len(counts)), key=lambda i: (-counts[i], i))
    c1 = int(counts[order[0]])
    c2 = int(counts[order[1]]) if len(order) > 1 else 0
    if c1 + c2 == 0 or binomtest(c1, c1 + c2, 0.5).pvalue > alpha:
        return ABSTAIN
    return order[0]


def max_certifiable_radius(n: int, alpha: float, sigma: float) -> float:
    """The radius when all n votes agree: sigma * Phi^-1(alpha^(1/n))."""
    return float(sigma * norm.ppf(alpha ** (1.0 / n)))

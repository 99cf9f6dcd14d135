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

Measured continuations reject this mixture on both demo lines (bench/results/rate_model/README.md): images with
every vote miss one later far more often than it expects (RS: 63 of 306 images with every vote at 371 samples
missed by 8,000, where it expects 5; 3 of 48 with every vote at 8,000 missed in 4,000 more, where it expects 0.2).
Jeffreys' Beta(1/2, 1/2) puts too little mass just below 1, so the point mass takes images whose rate is 0.9999.
The priors below (fit_rate_prior, draw_prior_rates) fit the continuous part too. `beta-mixture` (a point mass at 1
and Beta(a, b), all three fitted) predicts every measured continuation of rows that ran to 8,000 samples on both
lines and the DiffSmooth reruns; fitted to rows of a few hundred samples it overstates unanimity on the RS line,
where `beta` (no point mass) is calibrated.
"""

from __future__ import annotations

import numpy as np
from scipy.special import betaln, expit, gammaln

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


# ----------------------------------------------------------------------------------------------------------------------
# Priors with more than one free parameter (bench/results/rate_model/README.md compares them on measured probes).
#
# A prior is a mixture of components, each a Beta(a, b) or a point mass at a rate q; an image's path of k votes in n
# samples has likelihood p^k (1 - p)^(n - k) (the stopping rule drops out, as above), so its evidence under a Beta
# component is B(k + a, n - k + b) / B(a, b) and under a point mass q^k (1 - q)^(n - k). Families (RATE_PRIORS):
#
# - `mixture`: today's, a point mass at 1 (weight w) and Jeffreys' Beta(1/2, 1/2); w by EM (fit_unanimous_weight);
# - `mixture-eps`: a point mass at 1 - eps (weight w) and Jeffreys; w and eps fitted;
# - `beta-mixture`: a point mass at 1 (weight w) and Beta(a, b) with a and b fitted (empirical Bayes);
# - `beta`: Beta(a, b) alone, a and b fitted;
# - `beta-eps`: a point mass at 1 - eps (weight w) and Beta(a, b); w, eps, a and b fitted (`beta-mixture` at eps 0).
#
# Every fit maximises the rows' marginal likelihood (fit_rate_prior); draw_prior_rates draws each image's rate from
# its posterior, as draw_rates does for `mixture`.

RATE_PRIORS = ("mixture", "mixture-eps", "beta-mixture", "beta", "beta-eps")


class RatePrior:
    """A mixture prior over a vote rate: `weights` over `components`, each ("beta", a, b) or ("point", q)."""

    def __init__(self, name: str, weights, components, params: dict):
        self.name, self.params = name, dict(params)
        self.weights = np.asarray(weights, np.float64)
        self.components = tuple(tuple(c) for c in components)

    def __repr__(self) -> str:
        return f"RatePrior({self.name}, {', '.join(f'{k}={v:.6g}' for k, v in self.params.items())})"

    def log_evidence(self, votes, drawn) -> np.ndarray:
        """[images, components]: log P(path | component)."""
        votes, drawn = np.asarray(votes, np.float64), np.asarray(drawn, np.float64)
        misses = drawn - votes
        out = np.empty((len(votes), len(self.components)))
        for j, component in enumerate(self.components):
            if component[0] == "beta":
                a, b = component[1], component[2]
                out[:, j] = betaln(votes + a, misses + b) - betaln(a, b)
            else:
                q = component[1]
                with np.errstate(divide="ignore", invalid="ignore"):
                    hit = np.where(votes > 0, votes * np.log(q) if q > 0 else -np.inf, 0.0)
                    miss = np.where(misses > 0, misses * np.log1p(-q) if q < 1 else -np.inf, 0.0)
                out[:, j] = hit + miss
        return out

    def _joint(self, votes, drawn) -> np.ndarray:
        with np.errstate(divide="ignore"):
            return self.log_evidence(votes, drawn) + np.log(self.weights)[None, :]

    def log_marginal(self, votes, drawn) -> np.ndarray:
        """log P(path) of each image under the prior."""
        joint = self._joint(votes, drawn)
        top = np.max(joint, axis=1, keepdims=True)
        top = np.where(np.isfinite(top), top, 0.0)
        return (top + np.log(np.sum(np.exp(joint - top), axis=1, keepdims=True)))[:, 0]

    def responsibilities(self, votes, drawn) -> np.ndarray:
        """[images, components]: each component's posterior weight."""
        joint = self._joint(votes, drawn)
        return np.exp(joint - self.log_marginal(votes, drawn)[:, None])

    def log_predictive(self, votes, drawn, more_votes, more) -> np.ndarray:
        """log P(more_votes of the next `more` samples | the row's path), a count's probability (with the binomial
        coefficient)."""
        votes, drawn = np.asarray(votes, np.float64), np.asarray(drawn, np.float64)
        more_votes, more = np.asarray(more_votes, np.float64), np.asarray(more, np.float64)
        coefficient = gammaln(more + 1) - gammaln(more_votes + 1) - gammaln(more - more_votes + 1)
        return (coefficient + self.log_marginal(votes + more_votes, drawn + more)
                - self.log_marginal(votes, drawn))

    def keep_chance(self, votes, drawn, more) -> np.ndarray:
        """P(each of the next `more` samples votes for the class | the row's path)."""
        more = np.asarray(more, np.float64)
        return np.exp(self.log_predictive(votes, drawn, more, more))

    def posterior_mean(self, votes, drawn) -> np.ndarray:
        """E[p | the row's path]."""
        votes, drawn = np.asarray(votes, np.float64), np.asarray(drawn, np.float64)
        r = self.responsibilities(votes, drawn)
        means = np.empty_like(r)
        for j, component in enumerate(self.components):
            if component[0] == "beta":
                a, b = component[1], component[2]
                means[:, j] = (votes + a) / (drawn + a + b)
            else:
                means[:, j] = component[1]
        return np.sum(r * means, axis=1)

    def draw(self, votes, drawn, rng) -> np.ndarray:
        """One draw of every image's rate from its posterior."""
        votes, drawn = np.asarray(votes, np.float64), np.asarray(drawn, np.float64)
        r = self.responsibilities(votes, drawn)
        pick = np.minimum((rng.random(len(votes))[:, None] > np.cumsum(r, axis=1)).sum(axis=1), r.shape[1] - 1)
        out = np.empty(len(votes))
        for j, component in enumerate(self.components):
            mine = pick == j
            if component[0] == "beta":
                a, b = component[1], component[2]
                out[mine] = _beta_draw(votes[mine] + a, drawn[mine] - votes[mine] + b, rng)
            else:
                out[mine] = component[1]
        return out


def _beta_draw(a: np.ndarray, b: np.ndarray, rng) -> np.ndarray:
    """Beta(a, b) draws as X / (X + Y) of Gamma draws computed on the log scale, so a tiny b gives rates near 1 but
    never NaN (numpy's beta can return NaN when both parameters are far below 1)."""
    if len(a) == 0:
        return np.empty(0)
    x, y = _log_gamma_draw(a, rng), _log_gamma_draw(b, rng)
    return np.exp(x - np.logaddexp(x, y))


def _log_gamma_draw(shape: np.ndarray, rng) -> np.ndarray:
    """log of Gamma(shape, 1) draws; for shape < 1 via Gamma(shape + 1) * U^(1 / shape) (log scale: no underflow)."""
    shape = np.asarray(shape, np.float64)
    small = shape < 1
    g = np.log(rng.gamma(np.where(small, shape + 1, shape)))
    u = rng.random(len(shape))
    return np.where(small, g + np.log(np.maximum(u, 1e-300)) / np.where(small, shape, 1.0), g)


def _prior(name: str, theta: np.ndarray) -> RatePrior:
    """The family's prior at unconstrained parameters theta (logit weight, log shapes, log eps)."""
    if name == "mixture":
        w = expit(theta[0])
        return RatePrior(name, [w, 1 - w], [("point", 1.0), ("beta", JEFFREYS, JEFFREYS)], {"w": w})
    if name == "mixture-eps":
        w, eps = expit(theta[0]), float(np.exp(theta[1]))
        return RatePrior(name, [w, 1 - w], [("point", 1.0 - eps), ("beta", JEFFREYS, JEFFREYS)], {"w": w, "eps": eps})
    if name == "beta-mixture":
        w, a, b = expit(theta[0]), float(np.exp(theta[1])), float(np.exp(theta[2]))
        return RatePrior(name, [w, 1 - w], [("point", 1.0), ("beta", a, b)], {"w": w, "a": a, "b": b})
    if name == "beta":
        a, b = float(np.exp(theta[0])), float(np.exp(theta[1]))
        return RatePrior(name, [1.0], [("beta", a, b)], {"a": a, "b": b})
    if name == "beta-eps":
        w, eps, a, b = expit(theta[0]), float(np.exp(theta[1])), float(np.exp(theta[2])), float(np.exp(theta[3]))
        return RatePrior(name, [w, 1 - w], [("point", 1.0 - eps), ("beta", a, b)], {"w": w, "eps": eps, "a": a, "b": b})
    raise ValueError(f"unknown rate prior {name!r} ({', '.join(RATE_PRIORS)})")


_STARTS = {
    "mixture": [[0.0]],
    "mixture-eps": [[0.0, np.log(1e-4)], [0.0, np.log(1e-5)], [0.0, np.log(1e-3)], [1.0, np.log(3e-5)]],
    "beta-mixture": [[0.0, np.log(2.0), np.log(0.2)], [-1.0, np.log(5.0), np.log(0.05)], [1.0, 0.0, np.log(0.5)]],
    "beta": [[np.log(2.0), np.log(0.1)], [np.log(5.0), np.log(0.02)], [0.0, np.log(0.5)]],
    "beta-eps": [[0.0, np.log(1e-5), np.log(2.0), np.log(0.2)], [-1.0, np.log(1e-6), np.log(2.0), np.log(0.1)],
                 [0.0, np.log(1e-4), np.log(2.0), np.log(0.3)], [1.0, np.log(1e-7), np.log(3.0), np.log(0.3)]],
}
_BOUNDS = {"mixture": [(-30, 30)], "mixture-eps": [(-30, 30), (np.log(1e-9), np.log(0.5))],
           "beta-mixture": [(-30, 30), (np.log(1e-3), np.log(1e4)), (np.log(1e-3), np.log(1e3))],
           "beta": [(np.log(1e-3), np.log(1e4)), (np.log(1e-4), np.log(1e3))],
           "beta-eps": [(-30, 30), (np.log(1e-12), np.log(0.5)), (np.log(1e-3), np.log(1e4)), (np.log(1e-3), np.log(1e3))]}


def fit_rate_prior(votes, drawn, name: str = "beta-mixture") -> RatePrior:
    """The family `name`'s prior maximising the rows' marginal likelihood (votes of drawn estimation samples per
    image; rows with nothing drawn carry no information and are left out). `mixture` is fit_unanimous_weight's EM.
    Where no row has every vote a point mass's weight is 0 (the likelihood's maximum): `beta-mixture` is then
    `beta`'s fit with w = 0, and `mixture-eps` Jeffreys' prior (eps 0, weighing nothing)."""
    votes, drawn = np.asarray(votes, np.float64), np.asarray(drawn, np.float64)
    keep = drawn > 0
    votes, drawn = votes[keep], drawn[keep]
    if name not in RATE_PRIORS:
        raise ValueError(f"unknown rate prior {name!r} ({', '.join(RATE_PRIORS)})")
    if name == "mixture":
        w = fit_unanimous_weight(votes, drawn)
        return _prior(name, np.array([_logit(w)]))
    unanimous = bool(np.any(votes >= drawn))
    if not unanimous and name == "mixture-eps":
        return _prior(name, np.array([-np.inf, -np.inf]))
    if not unanimous and name == "beta-mixture":
        beta = fit_rate_prior(votes, drawn, "beta")
        return _prior(name, np.array([-np.inf, np.log(beta.params["a"]), np.log(beta.params["b"])]))
    if len(votes) == 0:
        return _prior(name, np.asarray(_STARTS[name][0], np.float64))
    from scipy.optimize import minimize

    def loss(theta):
        value = -float(np.sum(_prior(name, theta).log_marginal(votes, drawn)))
        return value if np.isfinite(value) else 1e300

    best = None
    for start in _STARTS[name]:
        result = minimize(loss, np.asarray(start, np.float64), method="L-BFGS-B", bounds=_BOUNDS[name])
        if best is None or result.fun < best.fun:
            best = result
    return _prior(name, best.x)


def _logit(w: float) -> float:
    with np.errstate(divide="ignore"):
        return float(np.log(w) - np.log1p(-w))


def draw_prior_rates(votes, drawn, prior: RatePrior, rng) -> np.ndarray:
    """One draw of every image's rate from its posterior under `prior` (fit_rate_prior's); for the `mixture`
    family the same law as draw_rates(votes, drawn, w, rng)."""
    return prior.draw(votes, drawn, rng)

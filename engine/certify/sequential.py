"""Anytime-valid CERTIFY at target radii: sample in growing chunks, stop once every listed radius
is settled. Plain numpy/scipy; read it next to the math below.

The bound: a confidence sequence (CS) for pA = P(f(x + eps) = cA) from the beta-binomial
mixture martingale (Robbins 1970; Howard, Ramdas, McAuliffe & Sekhon, "Time-uniform,
nonparametric, nonasymptotic confidence sequences", Ann. Statist. 2021, the conjugate-mixture
example). After t estimation samples with s votes for cA and f = t - s others, for any p0

    M_t(p0) = B(a + s, b + f) / B(a, b) / (p0^s (1 - p0)^f)

is the likelihood ratio of "pA ~ Beta(a, b)" against "pA = p0". Under pA = p0 it is a nonnegative
martingale with mean 1, so Ville's inequality gives P(exists t: M_t(pA) >= 1/alpha) <= alpha. Hence
C_t = {p : M_t(p) < 1/alpha} contains pA at ALL times t simultaneously with probability >= 1 - alpha,
and it stays valid at any data-dependent stopping time and under any look schedule.
log M_t(p) is convex in p with its minimum (<= 0) at s/t, so C_t is an interval [L_t, U_t] found
by bisection. We use the Jeffreys prior a = b = 1/2 (the Krichevsky-Trofimov mixture): it keeps
mass near p = 1, where the large radii live; when all t votes agree the bound is
L_t = (alpha / sqrt(pi t))^(1/t) roughly, against Clopper-Pearson's fixed-n alpha^(1/t).
Running max / min of L_t / U_t stay valid (they are intersections of the C_t).

Why not Clopper-Pearson at every look: repeated looks at a fixed-n bound inflate the error far
beyond alpha (tests/test_sequential.py measures it); a union bound over every sample index
(alpha / n_max each) is valid but looser than the mixture. (Bonferroni over a short look schedule
fixed in advance, alpha / K per look, can be a little tighter at the last look for small K; the
mixture needs no schedule and is tight early, where most images stop.)
Hand-written: scipy has no confidence sequences, and the `confseq` package (Howard &
Waudby-Smith), which has this bound, ships only as a C++/Boost source build; this is about
twenty lines of numpy and vectorised over paths for the coverage test.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Generator, Hashable, List, Optional, Sequence, Tuple

import numpy as np
from scipy.special import betaln, xlog1py, xlogy
from scipy.stats import norm

from diffsmooth.engine.certify.core import ABSTAIN, Request, drive, top_class
from diffsmooth.engine.errors import UserError

PRIOR_A = PRIOR_B = 0.5          # Jeffreys prior of the mixture
FIRST_LOOK = 100                 # first chunk of estimation samples; the total then grows by GROWTH ...
MIN_STEP_CAP = 1000              # ... up to max(MIN_STEP_CAP, n_max // 20) samples between looks
GROWTH = 1.5                     # looks at 100, 200, 300, 500, 700, 1100, ...: finer than doubling
GROWTH_OLD = 2.0                 # the first release's schedule (100, 200, 400, 800, ...)
FUTILITY_MARGIN = 2.0            # default k of the futility stop (see futility_bounds)
_BISECTIONS = 64                 # enough for double precision on [0, 1]


def _log_mixture(p, s, f, log_norm):
    """log M_t(p) for arrays; log_norm = log B(a + s, b + f) - log B(a, b)."""
    return log_norm - xlogy(s, p) - xlog1py(f, -p)


def confidence_bounds(successes, trials, alpha: float) -> Tuple[np.ndarray, np.ndarray]:
    """(L_t, U_t): the mixture CS at level alpha for arrays of (successes, trials).

    Coverage is time-uniform: P(L_t <= p <= U_t for all t) >= 1 - alpha. The bisection returns
    the outer end of its bracket, so rounding can only widen the interval."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    s = np.asarray(successes, dtype=np.float64)
    t = np.asarray(trials, dtype=np.float64)
    s, t = np.broadcast_arrays(s, t)
    if np.any(t < 1) or np.any(s < 0) or np.any(s > t):
        raise ValueError("need 0 <= successes <= trials and trials >= 1")
    f = t - s
    log_norm = betaln(PRIOR_A + s, PRIOR_B + f) - betaln(PRIOR_A, PRIOR_B)
    level = np.log(1.0 / alpha)
    p_hat = s / t                                   # log M is smallest (<= 0) here
    # lower end: on [0, p_hat] log M decreases from +inf (s > 0) to <= 0
    lo, hi = np.zeros_like(p_hat), p_hat.copy()
    for _ in range(_BISECTIONS):
        mid = 0.5 * (lo + hi)
        out = _log_mixture(mid, s, f, log_norm) >= level
        lo, hi = np.where(out, mid, lo), np.where(out, hi, mid)
    lower = np.where(s > 0, lo, 0.0)
    # upper end: on [p_hat, 1] log M increases from <= 0 to +inf (f > 0)
    lo, hi = p_hat.copy(), np.ones_like(p_hat)
    for _ in range(_BISECTIONS):
        mid = 0.5 * (lo + hi)
        out = _log_mixture(mid, s, f, log_norm) >= level
        lo, hi = np.where(out, lo, mid), np.where(out, mid, hi)
    upper = np.where(f > 0, hi, 1.0)
    return lower, upper


def look_schedule(n_max: int, first: int = FIRST_LOOK, growth: float = GROWTH) -> List[int]:
    """Chunk sizes of the estimation samples between two looks: first, then (growth - 1) times
    the total so far in whole multiples of `first` (growth 2 doubles), at most
    max(1000, n_max // 20) per chunk, summing to n_max. It depends on n_max only, never on
    --batch, so results do not depend on the batch size. The engine, the sweep and the
    benchmark replay all use this one schedule. Any schedule is valid (the CS is time-uniform);
    finer looks stop closer to where the bound crosses a threshold, coarser ones batch better."""
    if growth <= 1:
        raise ValueError(f"growth must be > 1, got {growth}")
    cap = max(MIN_STEP_CAP, n_max // 20)
    sizes, done = [], 0
    while done < n_max:
        step = first * int(done * (growth - 1) / first + 0.5)
        size = min(cap, max(first, step), n_max - done)
        sizes.append(size)
        done += size
    return sizes


def futility_bounds(successes, trials, n_max: int, alpha: float, margin: float) -> np.ndarray:
    """The CS lower bound at n_max if the vote rate from here on were the optimistic rate
    p_hat + margin * sqrt(p_hat (1 - p_hat) / t) (capped at 1). Used only to decide when to stop:
    an image whose projection misses the next threshold would (most likely) not certify that
    radius even at n_max, so sampling on is futile. Stopping never affects validity (the
    reported L_t is time-uniform); a wrong futility call only gives a smaller, still valid radius."""
    s = np.asarray(successes, dtype=np.float64)
    t = np.asarray(trials, dtype=np.float64)
    p_hat = s / t
    rate = np.minimum(1.0, p_hat + margin * np.sqrt(p_hat * (1 - p_hat) / t))
    final = np.minimum(float(n_max), s + rate * (n_max - t))
    return confidence_bounds(final, np.broadcast_to(float(n_max), final.shape), alpha)[0]


@dataclass(frozen=True)
class SequentialRule:
    """What a sequential certificate asks: is the radius >= r for each r in radii?"""

    radii: Tuple[float, ...]
    sigma: float
    alpha: float
    n_max: int
    futility: Optional[float] = FUTILITY_MARGIN     # margin k of the futility stop; None = off
    growth: float = GROWTH                          # look schedule (look_schedule)

    def __post_init__(self):
        if not self.radii or any(r < 0 for r in self.radii):
            raise UserError(f"`radii` needs one or more radii >= 0, got {list(self.radii)}")
        if self.n_max < 1:
            raise UserError(f"n-max must be >= 1, got {self.n_max}")
        if not 0 < self.alpha < 1:
            raise UserError(f"alpha must be in (0, 1), got {self.alpha}")
        if self.futility is not None and self.futility < 0:
            raise UserError(f"the futility margin must be >= 0 (or off), got {self.futility}")
        if not self.growth > 1:
            raise UserError(f"the look growth must be > 1, got {self.growth}")
        object.__setattr__(self, "radii", tuple(sorted(float(r) for r in self.radii)))

    @property
    def thresholds(self) -> List[float]:
        """pA must reach Phi(r / sigma) for radius r."""
        return [float(norm.cdf(r / self.sigma)) for r in self.radii]

    def chunks(self) -> List[int]:
        return look_schedule(self.n_max, growth=self.growth)


def parse_radii(text: str) -> Tuple[float, ...]:
    """--radii '0.25,0.5,0.75,1.0' -> (0.25, 0.5, 0.75, 1.0)."""
    try:
        radii = tuple(float(r) for r in text.split(",") if r.strip())
    except ValueError:
        raise UserError(f"`radii` must be comma-separated numbers, got {text!r}") from None
    if not radii:
        raise UserError("`radii` must name at least one radius")
    return radii


class SequentialCertificate:
    """The running state of one image: votes for cA so far and the CS; `add` says when to stop.

    Stop when every listed radius is settled: L_t >= Phi(r_max / sigma) (all certified), or
    U_t < Phi(r_next / sigma) for the smallest radius not yet certified (out of reach), or (with
    rule.futility) the optimistic projection of L to n_max misses Phi(r_next / sigma), or n_max.
    Only L_t makes the certificate: the reported radius sigma * Phi^-1(L_t) is valid at the
    (random) stopping time because L_t is time-uniform at level alpha. U_t only decides WHEN to
    stop; if it is wrong, the run stops early with a smaller L_t, i.e. a more conservative but
    still valid radius. So the lower bound carries the full alpha (L and U come from one CS)."""

    def __init__(self, rule: SequentialRule):
        self.rule = rule
        self.thresholds = rule.thresholds
        self.successes = 0
        self.samples = 0
        self.lower, self.upper = 0.0, 1.0
        self.done = False

    def certified(self, threshold: float) -> bool:
        return self.lower > 0.5 and self.lower >= threshold

    def add(self, n_a: int, n: int) -> bool:
        """Record n more samples, n_a of them for cA; True once the answer is settled."""
        if self.done:
            raise RuntimeError("add() after the certificate was settled")
        self.successes += int(n_a)
        self.samples += int(n)
        lower, upper = confidence_bounds(self.successes, self.samples, self.rule.alpha)
        self.lower, self.upper = max(self.lower, float(lower)), min(self.upper, float(upper))
        pending = [thr for thr in self.thresholds if not self.certified(thr)]
        self.done = (not pending or self.upper < pending[0] or self.samples >= self.rule.n_max)
        if not self.done and self.rule.futility is not None:
            projected = futility_bounds(self.successes, self.samples, self.rule.n_max, self.rule.alpha,
                                        self.rule.futility)
            self.done = bool(projected < pending[0])
        return self.done

    def result(self, c_a: int) -> Tuple[int, float]:
        """(cA, sigma * Phi^-1(L_t)), or (ABSTAIN, 0.0) when L_t <= 1/2."""
        if self.lower <= 0.5:
            return ABSTAIN, 0.0
        return int(c_a), float(self.rule.sigma * norm.ppf(self.lower))


def sequential_many_job(n0: int, rule: SequentialRule) -> Generator:
    """Sequential CERTIFY of several configurations voting on one shared sample stream (a sweep) as
    a job: it is sent {key: counts}. Samples 0..n0-1 select each key's cA as in CERTIFY; the
    estimation looks follow from sample n0 on, exactly on `rule.chunks()`. Sampling goes on while
    any key is undecided; each key stops at its own look, so its result equals a
    single-configuration run's. Returns {key: (prediction, radius, samples incl. the n0)}."""
    if n0 < 1:
        raise UserError(f"n0 must be >= 1, got {n0}")
    chunks = rule.chunks()
    # The first look does not depend on the selection (all classes are counted): ask for both.
    selection, votes = yield Request(0, n0), Request(n0, chunks[0])
    c_a = {k: top_class([int(c) for c in v]) for k, v in selection.items()}
    states = {k: SequentialCertificate(rule) for k in selection}
    first = n0
    for look, size in enumerate(chunks):
        if look > 0:
            votes = yield Request(first, size)
        first += size
        for k, state in states.items():
            if not state.done:
                state.add(int(votes[k][c_a[k]]), size)
        if all(state.done for state in states.values()):
            break
    return {k: (*state.result(c_a[k]), n0 + state.samples) for k, state in states.items()}


def sequential_job(n0: int, rule: SequentialRule) -> Generator:
    """Sequential CERTIFY of one configuration as a job (sent counts [K]); returns (prediction,
    radius, samples used incl. the n0 selection samples). A run uses a prefix of the samples of a
    fixed-n run with the same seed."""
    inner = sequential_many_job(n0, rule)
    ask = next(inner)
    try:
        while True:
            got = yield ask
            ask = inner.send(tuple({0: c} for c in got) if isinstance(got, tuple) else {0: got})
    except StopIteration as done:
        return done.value[0]


def certify_sequential(count: Callable[[int, int], Sequence[int]], n0: int,
                       rule: SequentialRule) -> Tuple[int, float, int]:
    """sequential_job driven by count(first, num) -> the vote counts of those samples."""
    return drive(sequential_job(n0, rule), count)


def certify_sequential_many(count: Callable[[int, int], Dict[Hashable, Sequence[int]]], n0: int,
                            rule: SequentialRule) -> Dict[Hashable, Tuple[int, float, int]]:
    """sequential_many_job driven by count(first, num) -> {key: counts}."""
    return drive(sequential_many_job(n0, rule), count)


def parse_futility(text: Optional[str]) -> Optional[float]:
    """--futility '2' -> 2.0, 'off' -> None, not given -> FUTILITY_MARGIN."""
    if text is None:
        return FUTILITY_MARGIN
    if str(text).strip().lower() in ("off", "none", "no"):
        return None
    try:
        margin = float(text)
    except ValueError:
        raise UserError(f"`futility` must be a number >= 0 or 'off', got {text!r}") from None
    if not margin >= 0:
        raise UserError(f"`futility` must be a number >= 0 or 'off', got {text!r}")
    return margin


def rule_from_options(radii: Optional[str], sigma: float, alpha: float, n_max: int,
                      futility: Optional[str] = None) -> SequentialRule:
    """The rule of `certify --sequential --radii ... --n-max ... [--futility K|off]` (radii required)."""
    if not radii:
        raise UserError("`sequential` needs `radii`, e.g. 0.25,0.5,0.75,1.0")
    return SequentialRule(parse_radii(radii), float(sigma), float(alpha), int(n_max), parse_futility(futility))

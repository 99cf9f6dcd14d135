"""Sequential CERTIFY at target radii: sample in chunks on a look schedule fixed by n_max, stop
once every listed radius is settled. Plain numpy/scipy; three lower bounds (`SequentialRule.bound`):
"reach-cp" (the default), "split-cp" and "mixture".

Reach Clopper-Pearson ("reach-cp", the default) is split CP (below) at alpha minus a share
(UNANIMITY_SHARE) spent on the unanimity bound level^(1/t) of an image whose every vote went to cA
(`unanimity_lower`, valid at every sample count), with a look where such an image can first certify
each radius (`reach_look`); the union bound over the parts keeps the total at alpha.

Split Clopper-Pearson ("split-cp"). The looks t_1 < ... < t_K = n_max are the sample
counts of `look_schedule(n_max)`, fixed before any data. At look k < K the lower bound L_k is the
one-sided Clopper-Pearson bound at level alpha / (2(K - 1)), at the last look at alpha / 2, so the
levels sum to alpha; the certificate uses L = the running max of the L_k. Validity next to Cohen's:
  Cohen et al.: n fixed in advance, so P(CP lower bound at level alpha > pA) <= alpha.
  Here each t_k is fixed in advance, so P(L_k > pA) <= alpha_k for each k by the same argument, and
  P(max_k L_k > pA) <= sum_k alpha_k = alpha (union bound); L at any stopping time is <= max_k L_k.
The upper bound (CP at the same levels) and the futility stop only decide WHEN to stop and
spend no alpha: stopping early only reports a smaller, still valid L. The price: a look must fall
exactly on t_k (`SequentialCertificate.add` refuses any other sample total), and a budget cannot be
extended past n_max afterwards (the levels were split over these K looks).

Beta-binomial mixture ("mixture"): a confidence sequence valid at EVERY sample count (Robbins 1970;
Howard, Ramdas, McAuliffe & Sekhon, Ann. Statist. 2021, the conjugate-mixture example). After t
samples with s votes for cA and f = t - s others, for any p0

    M_t(p0) = B(a + s, b + f) / B(a, b) / (p0^s (1 - p0)^f)

is a nonnegative martingale with mean 1 under pA = p0, so Ville's inequality gives
P(exists t: M_t(pA) >= 1/alpha) <= alpha and C_t = {p : M_t(p) < 1/alpha} = [L_t, U_t] holds at all t
at once (Jeffreys prior a = b = 1/2; bisection, outer end of the bracket). It guards both sides
with one alpha, so its lower bound is looser than split CP's at the same looks; keep it for runs
whose budget may be extended later. docs/sequential-rules.md compares the two (simulated and measured).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from functools import cached_property
from typing import Callable, Generator, List, Optional, Sequence, Tuple

import numpy as np
from scipy.special import betaln, xlog1py, xlogy
from scipy.stats import norm

from diffsmooth.engine.certify.cohen import (
    ABSTAIN,
    Certificate,
    lower_confidence_bounds,
    top_class,
    upper_confidence_bounds,
)
from diffsmooth.engine.certify.jobs import Request, drive
from diffsmooth.engine.choices import SEQUENTIAL_BOUNDS
from diffsmooth.engine.errors import UserError

PRIOR_A = PRIOR_B = 0.5          # Jeffreys prior of the mixture
FIRST_LOOK = 100                 # looks every FIRST_LOOK estimation samples up to FINE_UNTIL, ...
FINE_UNTIL = 1000                # ... then the total grows by GROWTH per look, ...
CAP_DIVISOR = 40                 # ... at most max(MIN_STEP_CAP, n_max // CAP_DIVISOR) samples between looks
MIN_STEP_CAP = 1000
GROWTH = 1.2                     # chosen by simulation (docs/sequential-rules.md): K = 24 looks at 10k, 60 at 100k
FUTILITY_RULES = ("pace", "projection", "pace-floor")   # how the futility stop judges an image (futility_rule)
DEFAULT_FUTILITY_RULE = "pace-floor"
PACE_RULES = {"pace": 0.0, "pace-floor": 2.0}   # the pace rules and the fewest votes behind at which they stop (pace_futile)
PACE_SLOPE = 4.0                 # the pace margin grows as m (1 + PACE_SLOPE t / n_max) (pace_futile)
PROJECTION_MARGIN = 1.25         # default k of the projection rule (the previous default)
BOUNDS = SEQUENTIAL_BOUNDS       # SequentialRule.bound
DEFAULT_BOUND = "reach-cp"
SPLIT_BOUNDS = ("split-cp", "reach-cp")   # the bounds that look only at the schedule's sample counts
UNANIMITY_SHARE = 0.2            # reach-cp: the share of alpha spent on the unanimity bound (unanimity_lower)
LAST_LOOK_OLD = 0.5              # the last look's share of alpha before SequentialRule.last_look (kept out of schedule_key)
DEFAULT_LAST_LOOK = LAST_LOOK_OLD   # SequentialRule.last_look's default (docs/sequential-rules.md, "The last look's share")
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

    def bisect(lo, hi, falling: bool):
        """The bracket's outer end where log M crosses `level` (falling: on [0, p_hat], else on [p_hat, 1])."""
        for _ in range(_BISECTIONS):
            mid = 0.5 * (lo + hi)
            out = (_log_mixture(mid, s, f, log_norm) >= level) == falling
            lo, hi = np.where(out, mid, lo), np.where(out, hi, mid)
        return lo if falling else hi
    # lower end: on [0, p_hat] log M decreases from +inf (s > 0) to <= 0; upper: on [p_hat, 1] it increases to +inf (f > 0)
    return (np.where(s > 0, bisect(np.zeros_like(p_hat), p_hat.copy(), True), 0.0),
            np.where(f > 0, bisect(p_hat.copy(), np.ones_like(p_hat), False), 1.0))


def look_schedule(n_max: int, first: int = FIRST_LOOK, growth: float = GROWTH,
                  fine_until: int = FINE_UNTIL) -> List[int]:
    """Chunk sizes of the estimation samples between two looks: `first` each until `fine_until`
    (most images stop early), then (growth - 1) times the total so far in whole multiples of
    `first`, at most max(1000, n_max // 40) per chunk, summing to n_max. It depends on n_max only
    (never on --batch), so results do not depend on the batch size. The engine, the sweep and the
    benchmark replay all use this one schedule; split CP spends its alpha over exactly these looks."""
    if growth <= 1:
        raise ValueError(f"growth must be > 1, got {growth}")
    cap = max(MIN_STEP_CAP, n_max // CAP_DIVISOR)
    sizes, done = [], 0
    while done < n_max:
        step = first if done < fine_until else first * int(done * (growth - 1) / first + 0.5)
        size = min(cap, max(first, step), n_max - done)
        sizes.append(size)
        done += size
    return sizes


def split_levels(looks: int, alpha: float, last: float = LAST_LOOK_OLD) -> np.ndarray:
    """Split CP's per-look levels: alpha * last at look K, alpha * (1 - last) / (K - 1) at looks 1..K-1
    (sum alpha; last = 1/2: alpha / (2(K - 1)) and alpha / 2); a single look gets all of alpha."""
    if looks < 1:
        raise ValueError(f"need at least one look, got {looks}")
    if not 0 < last < 1:
        raise ValueError(f"the last look's share must be in (0, 1), got {last}")
    if looks == 1:
        return np.array([float(alpha)])
    return np.array([alpha * (1 - last) / (looks - 1)] * (looks - 1) + [alpha * last])


def reach_levels(regular: Sequence[bool], alpha: float, share: float = UNANIMITY_SHARE,
                 last: float = LAST_LOOK_OLD) -> np.ndarray:
    """reach-cp's per-look Clopper-Pearson levels: alpha * last at the last look (default alpha / 2, as
    split CP), the rest less the unanimity bound's share alpha * share split evenly over the other
    regular looks, 0 at the looks placed only for the unanimity bound (regular[k] False). The levels
    and the share sum to alpha: the union bound of split CP with one more term."""
    regular = np.asarray(regular, dtype=bool)
    if not regular[-1]:
        raise ValueError("the last look must be a regular look")
    if not (0 < share and 0 < last and last + share < 1):
        raise ValueError(f"the shares must be > 0 with last look + unanimity < 1, got {last} + {share}")
    earlier = int(regular.sum()) - 1
    if earlier == 0:
        return np.where(regular, alpha * (1 - share), 0.0)
    levels = np.where(regular, alpha * ((1 - last) - share) / earlier, 0.0)
    levels[-1] = alpha * last
    return levels


def unanimity_lower(successes, trials, level: float) -> np.ndarray:
    """level^(1/t) where all t votes so far went to cA, else 0: a lower bound valid at every sample
    count at once. At the true p the bound exceeds p at some t only if the first t(p) votes (t(p) the
    fewest with p^t <= level) all went to cA: one nested event of probability p^t(p) <= level."""
    s = np.asarray(successes, dtype=np.float64)
    t = np.asarray(trials, dtype=np.float64)
    return np.where((s == t) & (t > 0), level ** (1.0 / np.maximum(t, 1.0)), 0.0)


def reach_look(threshold: float, level: float) -> int:
    """The fewest samples at which every vote for cA lifts the unanimity bound at `level` to
    `threshold` (level^(1/t) >= threshold): the sample count at which such an image can first certify."""
    if threshold <= 0.5:
        return 1
    return max(1, math.ceil(math.log(level) / math.log(threshold) - 1e-9))


def with_reach_looks(chunks: Sequence[int], reach: Sequence[int]) -> Tuple[List[int], List[bool]]:
    """(chunk sizes, regular?) of the schedule `chunks` with the looks `reach` added (those inside
    (0, n_max) that are not already a look): the added looks are marked not regular."""
    regular_looks = np.cumsum(chunks).tolist()
    extra = sorted({int(t) for t in reach if 0 < t < regular_looks[-1]} - set(regular_looks))
    looks = sorted(regular_looks + extra)
    marks = [t in set(regular_looks) for t in looks]
    return np.diff([0] + looks).tolist(), marks


def split_cp_bounds(successes, trials, level) -> Tuple[np.ndarray, np.ndarray]:
    """(lower, upper): one-sided Clopper-Pearson bounds at `level` each (arrays broadcast)."""
    return lower_confidence_bounds(successes, trials, level), upper_confidence_bounds(successes, trials, level)


def _projected_successes(successes, trials, n_max: int, margin: float) -> np.ndarray:
    """Votes at n_max if the rate from here on were p_hat + margin * sqrt(p_hat (1 - p_hat) / t) (capped at 1)."""
    s = np.asarray(successes, dtype=np.float64)
    t = np.asarray(trials, dtype=np.float64)
    p_hat = s / t
    rate = np.minimum(1.0, p_hat + margin * np.sqrt(p_hat * (1 - p_hat) / t))
    return np.minimum(float(n_max), s + rate * (n_max - t))


def default_pace_margin(n_max: int) -> float:
    """The pace rule's default margin m: 0.21 at n_max 10,000 and 0.13 at 100,000 (each chosen by
    simulation on the project's two row sets, docs/sequential-rules.md), power-law in between and beyond.
    Larger n_max spreads the images over more final standard deviations, so a smaller m loses as little."""
    return round(0.21 * (n_max / 10_000) ** -0.208, 3)


def needed_votes(bound_at: Callable[[np.ndarray], np.ndarray], n_max: int, thresholds) -> np.ndarray:
    """Fewest votes c at n_max with bound_at(c) > 1/2 and >= each threshold (n_max + 1 where none does);
    bound_at must increase with c. Integer bisection, vectorised over the thresholds."""
    thresholds = np.asarray(thresholds, dtype=np.float64)
    lo, hi = np.full(thresholds.shape, -1, dtype=np.int64), np.full(thresholds.shape, n_max, dtype=np.int64)
    ok_hi = bound_at(hi.astype(np.float64))
    reachable = (ok_hi > 0.5) & (ok_hi >= thresholds)
    while np.any(hi - lo > 1):                      # invariant: bound(lo) misses, bound(hi) reaches
        mid = (lo + hi) // 2
        bound = bound_at(np.maximum(mid, 0).astype(np.float64))
        ok = (mid >= 0) & (bound > 0.5) & (bound >= thresholds)
        lo, hi = np.where(ok, lo, mid), np.where(ok, mid, hi)
    return np.where(reachable, hi, n_max + 1)


def pace_futile(successes, trials, need, n_max: int, margin: float, floor: float = 0.0) -> np.ndarray:
    """The pace rule: True where the votes trail the pace to `need` votes at n_max, t * need / n_max,
    by more than margin * (1 + 4 t / n_max) standard deviations of the final count, sqrt(n_max v (1 - v))
    with v = need / n_max, and by more than `floor` votes. A straight line in (samples, votes) fixed
    before any data, as a Wald SPRT's boundary: it waits out the early looks (p-hat is too noisy to
    tell a hopeless image from one that fixed-n would certify) and then stops steadily. Near the reach
    sd is about one vote, so without a floor one early miss stops an image that fixed-n would still
    certify; with `floor` > 0 it also stops once more votes went elsewhere than n_max - need allows
    (certainly futile). need > n_max (unreachable) is always futile."""
    s = np.asarray(successes, dtype=np.float64)
    t = np.asarray(trials, dtype=np.float64)
    need = np.asarray(need, dtype=np.float64)
    v = np.clip(need / n_max, 0.0, 1.0)
    sd = np.sqrt(n_max * v * (1 - v))
    trail = t * need / n_max - s
    beyond = (t - s > n_max - need) if floor > 0 else False
    return (need > n_max) | beyond | (trail > np.maximum(margin * (1 + PACE_SLOPE * t / n_max) * sd, floor))


def futility_bounds(successes, trials, n_max: int, alpha: float, margin: float,
                    final_level: Optional[float] = None) -> np.ndarray:
    """The lower bound at n_max if the vote rate from here on were optimistic (margin k standard
    errors above p_hat): the mixture CS at alpha, or with `final_level` split CP's last-look bound.
    Used only to decide when to stop: an image whose projection misses the next threshold would
    (most likely) not certify that radius even at n_max. It spends no alpha; a wrong call only
    gives a smaller, still valid radius."""
    final = _projected_successes(successes, trials, n_max, margin)
    if final_level is not None:
        return lower_confidence_bounds(final, float(n_max), final_level)
    return confidence_bounds(final, np.broadcast_to(float(n_max), final.shape), alpha)[0]


@dataclass(frozen=True)
class SequentialRule:
    """What a sequential certificate asks: is the radius >= r for each r in radii? And how it answers
    (`bound`, the futility margin, the look schedule; all fixed before any data)."""

    radii: Tuple[float, ...]
    sigma: float
    alpha: float
    n_max: int
    futility: Optional[float] = None                # the futility stop's margin (None: the rule's default)
    growth: float = GROWTH                          # look schedule (look_schedule)
    bound: str = DEFAULT_BOUND                      # "reach-cp", "split-cp" or "mixture"
    futility_rule: Optional[str] = DEFAULT_FUTILITY_RULE   # "pace-floor" / "pace" (pace_futile), "projection", None: off
    schedule_radii: Optional[Tuple[float, ...]] = None      # reach-cp's added looks are placed for these (None: radii)
    unanimity: float = UNANIMITY_SHARE              # reach-cp: the share of alpha of the unanimity bound
    last_look: float = DEFAULT_LAST_LOOK            # split-cp / reach-cp: the share of alpha of the last look's CP bound
    decide_largest: bool = False                    # also stop once the largest radius is decided (a table's race)

    def __post_init__(self):
        if not self.radii or any(r < 0 for r in self.radii):
            raise UserError(f"`radii` needs one or more radii >= 0, got {list(self.radii)}")
        if self.n_max < 1:
            raise UserError(f"n-max must be >= 1, got {self.n_max}")
        if not 0 < self.alpha < 1:
            raise UserError(f"alpha must be in (0, 1), got {self.alpha}")
        if self.futility_rule is None:
            object.__setattr__(self, "futility", None)
        elif self.futility_rule not in FUTILITY_RULES:
            raise UserError(f"the futility rule must be one of {', '.join(FUTILITY_RULES)}, got {self.futility_rule!r}")
        elif self.futility is None:
            margin = default_pace_margin(self.n_max) if self.futility_rule in PACE_RULES else PROJECTION_MARGIN
            object.__setattr__(self, "futility", margin)
        elif not self.futility >= 0:
            raise UserError(f"the futility margin must be >= 0 (or off), got {self.futility}")
        if not self.growth > 1:
            raise UserError(f"the look growth must be > 1, got {self.growth}")
        if self.bound not in BOUNDS:
            raise UserError(f"`bound` must be one of {', '.join(BOUNDS)}, got {self.bound!r}")
        object.__setattr__(self, "radii", tuple(sorted(float(r) for r in self.radii)))
        schedule = self.radii if self.schedule_radii is None else self.schedule_radii
        if not schedule or any(not r >= 0 for r in schedule):
            raise UserError(f"the schedule's radii must be one or more radii >= 0, got {list(schedule)}")
        object.__setattr__(self, "schedule_radii", tuple(sorted(float(r) for r in schedule)))
        if not 0 < self.unanimity < 0.5:
            raise UserError(f"the unanimity share must be in (0, 1/2), got {self.unanimity}")
        if not 0 < self.last_look < 1 or (self.bound == "reach-cp" and not self.last_look + self.unanimity < 1):
            raise UserError(f"the last look's share of alpha must be > 0 and, with the unanimity share "
                            f"{self.unanimity:g}, below 1, got {self.last_look}")

    @property
    def thresholds(self) -> List[float]:
        """pA must reach Phi(r / sigma) for radius r."""
        return [float(norm.cdf(r / self.sigma)) for r in self.radii]

    @cached_property
    def _schedule(self) -> Tuple[List[int], List[bool]]:
        """(chunk sizes, regular look?): reach-cp adds a look where a unanimous image can first certify
        each schedule radius; the other bounds use look_schedule as it is (every look regular)."""
        chunks = look_schedule(self.n_max, growth=self.growth)
        if self.bound != "reach-cp":
            return chunks, [True] * len(chunks)
        level = self.alpha * self.unanimity
        reach = [reach_look(float(norm.cdf(r / self.sigma)), level) for r in self.schedule_radii]
        return with_reach_looks(chunks, reach)

    def chunks(self) -> List[int]:
        return list(self._schedule[0])

    def looks(self) -> List[int]:
        """The sample counts t_1 < ... < t_K = n_max at which the rule looks."""
        return np.cumsum(self.chunks()).tolist()

    @cached_property
    def _levels(self) -> np.ndarray:
        if self.bound == "reach-cp":
            return reach_levels(self._schedule[1], self.alpha, self.unanimity, self.last_look)
        return split_levels(len(self._schedule[0]), self.alpha, self.last_look)

    def levels(self) -> np.ndarray:
        """The Clopper-Pearson level at each look (split CP: sums to alpha; reach-cp: sums to alpha
        less the unanimity share, 0 at the looks added for the unanimity bound)."""
        return self._levels.copy()

    def bounds(self, successes, trials, look: int) -> Tuple[np.ndarray, np.ndarray]:
        """(lower, upper) at look index `look` (trials = looks()[look]; any trials for the mixture)."""
        if self.bound == "mixture":
            return confidence_bounds(successes, trials, self.alpha)
        level = float(self._levels[look])
        if level > 0:
            lower, upper = split_cp_bounds(successes, trials, level)
        else:                                       # a look added for the unanimity bound only
            shape = np.broadcast_shapes(np.shape(successes), np.shape(trials))
            lower, upper = np.zeros(shape), np.ones(shape)
        if self.bound == "reach-cp":
            lower = np.maximum(lower, unanimity_lower(successes, trials, self.alpha * self.unanimity))
        return lower, upper

    def final_bound(self, votes) -> np.ndarray:
        """The lower bound this rule reports at n_max from `votes` (its last look, or the mixture)."""
        votes = np.asarray(votes, dtype=np.float64)
        if self.bound == "mixture":
            return confidence_bounds(votes, np.broadcast_to(float(self.n_max), votes.shape), self.alpha)[0]
        return self.bounds(votes, np.broadcast_to(float(self.n_max), votes.shape), len(self._levels) - 1)[0]

    @cached_property
    def needed(self) -> np.ndarray:
        """Fewest votes at n_max that certify each radius (n_max + 1: none does)."""
        return needed_votes(self.final_bound, self.n_max, self.thresholds)

    def projected_lower(self, successes, trials) -> np.ndarray:
        """The projection rule's lower bound at n_max with this rule's bound."""
        final_level = None if self.bound == "mixture" else float(self._levels[-1])
        return futility_bounds(successes, trials, self.n_max, self.alpha, self.futility, final_level)

    def futile(self, successes, trials, pending: np.ndarray) -> np.ndarray:
        """True where the futility stop gives up on radius index `pending` (spends no alpha)."""
        if self.futility_rule in PACE_RULES:
            return pace_futile(successes, trials, self.needed[pending], self.n_max, self.futility,
                               PACE_RULES[self.futility_rule])
        return self.projected_lower(successes, trials) < np.asarray(self.thresholds)[pending]

    @property
    def schedule_key(self) -> str:
        """Everything that fixes the looks, their levels and the stops, except the radii settled: two
        rules with the same key look at the same sample counts with the same bounds. last_look joins the
        key only when it is not LAST_LOOK_OLD, so the keys of rules from before it stay as they were."""
        key = [self.bound, self.alpha, self.n_max, self.sigma, self.growth, self.futility_rule,
               self.futility, self.unanimity, list(self.schedule_radii)]
        return json.dumps(key if self.last_look == LAST_LOOK_OLD else key + [self.last_look])

    def describe_futility(self) -> Optional[str]:
        """'pace-floor:0.13', 'pace:0.13', 'projection:1.25' or None (off): the recorded setting."""
        return None if self.futility is None else f"{self.futility_rule}:{self.futility:g}"


def look_decision(rule: SequentialRule, successes, trials, look: int, lower, upper):
    """One look of the rule for arrays of images: (running lower, running upper, stop).

    Stop when every radius is certified (L > 1/2 and L >= Phi(r / sigma)), or the smallest
    uncertified threshold is above U, or (with rule.futility) the futility stop gives up on it, or
    at n_max; with rule.decide_largest also once U is below the largest radius's threshold. The
    running L never exceeds the running U (a look whose lower bound passes U is clamped to it: a
    smaller L is as valid, and only paths whose looks contradict each other change), so once U is
    below a threshold no later look certifies that radius. The engine (SequentialCertificate) and
    the simulator both call this."""
    lo, hi = rule.bounds(successes, trials, look)
    upper = np.minimum(upper, hi)
    lower = np.minimum(np.maximum(lower, lo), upper)
    thresholds = np.asarray(rule.thresholds)
    certified = (lower[..., None] > 0.5) & (lower[..., None] >= thresholds)
    all_done = certified.all(axis=-1)
    pending = np.argmin(certified, axis=-1)                         # the smallest uncertified radius
    stop = all_done | (upper < thresholds[pending]) | (np.asarray(trials) >= rule.n_max)
    if rule.decide_largest:
        stop = stop | (upper < thresholds[-1])
    if rule.futility is not None:
        stop = stop | (~all_done & rule.futile(successes, trials, pending))
    return lower, upper, stop


def run_rule(rule: SequentialRule, votes, after=None) -> Tuple[np.ndarray, np.ndarray]:
    """(final lower bound, estimation samples used) of the rule on many vote paths at once:
    votes[i, j] = votes for cA in chunk j of rule.chunks() of path i. Vectorised `add`. `after`
    (estimation samples per path): the rule goes on from an earlier run's stop there, as
    SequentialCertificate.resume does: it decides at that look and at later ones only."""
    final, used, _ = run_rule_bounds(rule, votes, after)
    return final, used


def run_rule_bounds(rule: SequentialRule, votes, after=None) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """run_rule's (final lower bound, estimation samples used) and the running upper bound at each stop
    (what a row's state keeps)."""
    votes = np.asarray(votes)
    after = np.zeros(votes.shape[0]) if after is None else np.asarray(after, dtype=np.float64)
    chunks = rule.chunks()
    m = votes.shape[0]
    s = np.zeros(m)
    lower, upper = np.zeros(m), np.ones(m)
    done = np.zeros(m, dtype=bool)
    used = np.zeros(m, dtype=np.int64)
    final, final_upper = np.zeros(m), np.ones(m)
    t = 0
    for j, size in enumerate(chunks):
        live = ~done
        idx = np.flatnonzero(live)
        s[idx] += votes[idx, j]
        t += size
        lo, hi, stop = look_decision(rule, s[idx], np.full(len(idx), float(t)), j, lower[idx], upper[idx])
        lower[idx], upper[idx] = lo, hi
        newly = idx[stop & (t >= after[idx])]
        used[newly] = t
        final[newly], final_upper[newly] = lower[newly], upper[newly]
        done[newly] = True
        if done.all():
            break
    return final, used, final_upper


def radius_from_lower(lower, sigma: float) -> np.ndarray:
    """sigma * Phi^-1(L) where L > 1/2, else 0 (abstain)."""
    lower = np.asarray(lower, dtype=np.float64)
    return np.where(lower > 0.5, sigma * norm.ppf(np.clip(lower, 0.5, 1.0)), 0.0)


@dataclass(frozen=True)
class SequentialState:
    """Where one row's sequential certificate stopped, so that a rule settling more radii can go on
    from that look instead of from the first sample (the table's race extends images this way): the
    selected class, its votes among the estimation samples, the estimation samples, the running
    bounds, the radii the row's rule settled and that rule's `schedule_key`."""

    selected: int
    successes: int
    samples: int
    lower: float
    upper: float
    radii: Tuple[float, ...]
    schedule: str
    started: int = 0            # the estimation sample this run drew first (0: from the first; else it went on)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, doc: dict) -> "SequentialState":
        fields = {f.name: doc[f.name] for f in dataclasses.fields(cls) if f.name in doc}
        return cls(**dict(fields, radii=tuple(float(r) for r in doc["radii"])))


def continues(rule: "SequentialRule", state: SequentialState) -> bool:
    """True when `rule` can go on from `state` exactly as if it had run from the first sample: the same
    looks and levels, a superset of the radii (such a rule had not stopped before this look: a rule
    settling fewer radii stops no later on the same path; docs/table.md), and the state on a look.
    A rule that decides its largest radius goes on from any such state of its schedule: it runs from
    where an earlier run left that radius undecided, to the first later look that decides it."""
    radii = rule.decide_largest or set(state.radii) <= set(rule.radii)
    return (state.schedule == rule.schedule_key and radii
            and state.samples in rule.looks() and 0 <= state.successes <= state.samples)


class SequentialCertificate:
    """The running state of one image: votes for cA so far and the bounds; `add` says when to stop.

    Decisions are `look_decision`'s (shared with the vectorised `run_rule`). Only the lower bound
    makes the certificate; U and the futility stop only decide WHEN to stop. Under split CP
    each update must end exactly on the next look of the schedule (a padded or packed batch must
    never move a look: the levels were spent on those sample counts)."""

    def __init__(self, rule: SequentialRule):
        self.rule = rule
        self.thresholds = rule.thresholds
        self.looks = rule.looks()
        self.successes = 0
        self.samples = 0
        self.look = 0                   # index of the next look
        self.lower, self.upper = 0.0, 1.0
        self.done = False

    @classmethod
    def resume(cls, rule: SequentialRule, state: SequentialState) -> "SequentialCertificate":
        """The certificate at the look where `state` stopped, with `rule`'s decision at that look (the
        same bounds, so the decision a run of `rule` from the first sample takes there)."""
        if not continues(rule, state):
            raise ValueError("this state is not from a run of this rule's schedule with a subset of its radii")
        cert = cls(rule)
        cert.successes, cert.samples = state.successes, state.samples
        look = cert.looks.index(state.samples)
        lower, upper, stop = look_decision(rule, np.array([float(state.successes)]), np.array([float(state.samples)]),
                                           look, np.array([state.lower]), np.array([state.upper]))
        cert.lower, cert.upper, cert.look, cert.done = float(lower[0]), float(upper[0]), look + 1, bool(stop[0])
        return cert

    def certified(self, threshold: float) -> bool:
        return self.lower > 0.5 and self.lower >= threshold

    def add(self, n_a: int, n: int) -> bool:
        """Record n more samples, n_a of them for cA; True once the answer is settled."""
        if self.done:
            raise RuntimeError("add() after the certificate was settled")
        if not 0 <= int(n_a) <= int(n):
            raise ValueError(f"need 0 <= n_a <= n, got n_a={n_a}, n={n}")
        total = self.samples + int(n)
        if self.rule.bound in SPLIT_BOUNDS and total != self.looks[self.look]:
            raise RuntimeError(f"split CP looks only at the schedule's sample counts: the next look is at "
                               f"{self.looks[self.look]} samples, this update ends at {total}")
        self.successes += int(n_a)
        self.samples = total
        look = min(self.look, len(self.looks) - 1)
        lower, upper, stop = look_decision(self.rule, np.array([float(self.successes)]),
                                           np.array([float(self.samples)]), look,
                                           np.array([self.lower]), np.array([self.upper]))
        self.lower, self.upper = float(lower[0]), float(upper[0])
        self.look += 1
        self.done = bool(stop[0])
        return self.done

    def result(self, c_a: int, n0: int) -> Certificate:
        """cA with radius sigma * Phi^-1(L), or ABSTAIN when L <= 1/2; samples = n0 + those used;
        top_votes = cA's votes among the estimation samples (what a simulator needs to replay the image)."""
        state = SequentialState(int(c_a), self.successes, self.samples, self.lower, self.upper, self.rule.radii,
                                self.rule.schedule_key)
        if self.lower <= 0.5:
            return Certificate(ABSTAIN, 0.0, n0 + self.samples, self.successes, state)
        return Certificate(int(c_a), float(self.rule.sigma * norm.ppf(self.lower)), n0 + self.samples, self.successes,
                           state)


def sequential_job(n0: int, rule: SequentialRule, start: Optional[Sequence[SequentialState]] = None,
                   label: Optional[int] = None) -> Generator:
    """Sequential CERTIFY as a job, for every configuration voting on the image's samples (one count
    row each). Samples 0..n0-1 select each row's cA as in CERTIFY; the estimation looks follow from
    sample n0 on, exactly on `rule.chunks()`. Sampling goes on while any row is undecided; each row
    stops at its own look, so a sweep's row equals its single-configuration run. Returns a list of
    Certificates (samples: the n0 selection samples plus the estimation samples the row used).
    `start` (one state per row) goes on from where an earlier run of the same image stopped when every
    state `continues` with this rule (else the job starts afresh): the rows equal a run from the first
    sample, without drawing those samples again.
    `label` (the wrong-class stop, a table's runs): a row whose cA is not the label stops after the
    selection and abstains with no estimation sample; it could only certify a wrong class, which no
    cell counts.
    The other rows are those of a run without it (the same samples, the same decisions)."""
    if n0 < 1:
        raise UserError(f"n0 must be >= 1, got {n0}")
    if start is not None and all(continues(rule, s) for s in start):
        return (yield from _continued_job(n0, rule, start))
    chunks = rule.chunks()
    if label is None:
        # The first look does not depend on the selection (all classes are counted): ask for both.
        selection, votes = yield Request(0, n0), Request(n0, chunks[0])
    else:
        selection, votes = (yield Request(0, n0)), None
    c_a = [top_class([int(c) for c in row]) for row in selection]
    states = [SequentialCertificate(rule) for _ in c_a]
    if label is not None:
        for c, state in zip(c_a, states):
            state.done = c != int(label)
        if all(state.done for state in states):
            return [state.result(c, n0) for c, state in zip(c_a, states)]
        votes = yield Request(n0, chunks[0])
    first = n0
    for look, size in enumerate(chunks):
        if look > 0:
            votes = yield Request(first, size)
        first += size
        for row, state in enumerate(states):
            if not state.done:
                state.add(int(votes[row][c_a[row]]), size)
        if all(state.done for state in states):
            break
    return [state.result(c, n0) for c, state in zip(c_a, states)]


def _continued_job(n0: int, rule: SequentialRule, start: Sequence[SequentialState]) -> Generator:
    """sequential_job from each row's state: the rows' decisions at their own looks under `rule`, then
    the samples from the earliest undecided row's look on (a row further on skips the chunks it counted)."""
    states = [SequentialCertificate.resume(rule, s) for s in start]
    chunks, looks = rule.chunks(), rule.looks()
    pending = [state.look for state in states if not state.done]
    started = max(s.samples for s in start)                 # nothing to draw: the rows are the states' own
    if pending:
        first_look = min(pending)
        started = looks[first_look - 1]
        first = n0 + started
        for look in range(first_look, len(chunks)):
            votes = yield Request(first, chunks[look])
            first += chunks[look]
            for row, state in enumerate(states):
                if not state.done and state.look == look:
                    state.add(int(votes[row][start[row].selected]), chunks[look])
            if all(state.done for state in states):
                break
    out = [state.result(s.selected, n0) for s, state in zip(start, states)]
    return [dataclasses.replace(c, state=dataclasses.replace(c.state, started=started)) for c in out]


def certify_sequential(count: Callable[[int, int], np.ndarray], n0: int, rule: SequentialRule) -> List[Certificate]:
    """sequential_job driven by count(first, num) -> the counts [configurations, classes] of those samples."""
    return drive(sequential_job(n0, rule), count)

"""The race plan: sigmas race for each radius, and a sigma leaves a radius once its rows show it
cannot change the cell by more than the tolerance. Pure logic on rows; the builder runs the
extensions it asks for, the simulator (engine/table/race_sim.py) replays it on vote paths.

Why a row says more than its own radius (docs/table.md has the argument in full). Let `all` be the
sequential rule settling every radius of the table (R). A run settling a subset S of R looks at the
same sample counts with the same levels, and stops no later than `all` on the same sample path:
every reason `all` has to stop (all radii certified, the upper bound below its smallest uncertified
radius's threshold, the futility stop on that radius, n-max) is a reason for S too, since S's
smallest uncertified radius is at least `all`'s (and the futility stop is monotone in the votes a
radius needs). At S's stop both have the same running bounds, so for each radius r a row is
  certified  where its lower bound already reaches Phi(r / sigma): `all` certifies r too;
  settled    where `all` would stop at this very look (its row equals this one), or where the row's
             run settled every radius up to r (the rule with radii R cut at r certifies r exactly
             when `all` does: until r is certified both have the same smallest uncertified radius);
  undecided  otherwise: `all` goes on, and only running it (radii R up to r) tells.
For a cell (the best over sigmas) that gives the deterministic interval
[max_s certified_s, max_s (certified_s + undecided_s)] for `all`'s value; the table reports the
lower end. An extension decides r for an undecided image, going on from the look where its row stopped
(the row's state; counter-based noise: the samples `all` draws) to the first look where `all` would
certify r, never could (the running upper bound below Phi(r / sigma): the rule never lets the running
lower bound pass it), or would stop; that settles it exactly (docs/table.md, *Deciding one radius*).

What a row proves is read from its state where it kept one: the running upper bound (never above its
stopping look's, and the one every rule on this schedule shares at that look), and every radius decided
by a row that stopped at the same look (the same samples of the same path: the same state). A decision
is never undone: a certified radius stays certified or, if a later look's upper bound clamps the lower
one below it, ruled out; a radius ruled out stays ruled out (the running upper bound only falls); a look
where `all` stops is one no extension goes past. So each extension decides at least one undecided
(image, contender, radius) and a line's race takes at most images x contenders x radii of them
(`extension_bound`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Hashable, List, Optional, Sequence, Tuple

import numpy as np
from scipy.stats import beta

from diffsmooth.engine.certify.sequential import SequentialRule
from diffsmooth.engine.table.defaults import RACE_REACH_SIGMAS


def initial_radii(radii: Sequence[float], sigma: float, reach: float = RACE_REACH_SIGMAS,
                  smallest: bool = True) -> Tuple[float, ...]:
    """The first run of a sigma settles the largest r <= reach x sigma (the smallest radius if none), and
    with `smallest` the table's smallest radius too. Beyond the reach the samples an image needs grow like
    1 / (1 - Phi(r / sigma)); below it a row's lower bound already certifies the smaller radii of every
    image that certified it."""
    within = [r for r in radii if r <= reach * sigma + 1e-12]
    largest = max(within) if within else min(radii)
    return tuple(sorted({min(radii), largest} if smallest else {largest}))


def prefix(radii: Sequence[float], k: int) -> Tuple[float, ...]:
    """The radii of the table up to index k: what an extension at radius index k settles."""
    return tuple(sorted(radii))[:k + 1]


def settled_prefix(radii: Sequence[float], settled: Sequence[float]) -> int:
    """The largest index k such that a run settling `settled` settled every table radius up to k (-1: none)."""
    k = -1
    for r in sorted(radii):
        if r not in settled:
            break
        k += 1
    return k


@dataclass
class Rows:
    """One contender's (a sigma, or a sigma and configuration of a sweep) latest row per image, as
    arrays in the table's image order."""

    radius: np.ndarray          # the row's radius (0 when it abstained)
    correct: np.ndarray         # the row certified the label
    abstained: np.ndarray       # predict -1: its class could still be the label under `all` (see may_count)
    votes: np.ndarray           # top_votes: votes of the selected class among the estimation samples
    drawn: np.ndarray           # estimation samples (samples - n0)
    prefix_to: np.ndarray       # the row's run settled every radius up to this index (-1: not radius 0)
    may_count: Optional[np.ndarray] = None   # the selected class is the label, or not recorded (None: every image)
    decided_at: Optional[np.ndarray] = None  # the row's run decided this radius index (-1 / None: no such run)
    upper: Optional[np.ndarray] = None       # the running upper bound at the row's stop (its state; 1: not kept)
    decided: Optional[np.ndarray] = None     # [image, radius index]: a row at this look decided it (None: decided_at's)

    def __post_init__(self):
        images = len(self.radius)
        if self.may_count is None:
            self.may_count = np.ones(images, dtype=bool)
        if self.decided_at is None:
            self.decided_at = np.full(images, -1, dtype=np.int64)
        if self.upper is None:
            self.upper = np.ones(images)
        if self.decided is None:
            self.decided = np.zeros((images, 0), dtype=bool)

    def decided_here(self, k: int) -> np.ndarray:
        """True where a row that stopped at the image's latest look decided radius index k."""
        if self.decided.shape[1] > k:
            return self.decided[:, k] | (self.decided_at == k)
        return self.decided_at == k

    @classmethod
    def from_rows(cls, rows: Sequence[dict], n0: int, prefix_to: Sequence[int],
                  decided_at: Optional[Sequence[int]] = None, upper: Optional[Sequence[float]] = None,
                  decided: Optional[np.ndarray] = None) -> "Rows":
        """From result rows (sequential rows carry top_votes, and `selected` since it was added) in image
        order, with each row's run's prefix (and the radius its run decided, if one did; the running upper
        bound and the radii decided at the row's look, where the rows' states tell). A row whose selected
        class is not its label never counts in a cell under any rule (the rows of `all` select on the same
        samples): it is settled."""
        may_count = np.array([r.get("selected") in (None, "") or int(r["selected"]) == int(r["label"]) for r in rows],
                             dtype=bool)
        return cls(np.array([float(r["radius"]) for r in rows]), np.array([int(r["correct"]) == 1 for r in rows]),
                   np.array([int(r["predict"]) < 0 for r in rows]), np.array([int(r["top_votes"]) for r in rows]),
                   np.array([int(r["samples"]) - n0 for r in rows]), np.asarray(prefix_to, dtype=np.int64), may_count,
                   None if decided_at is None else np.asarray(decided_at, dtype=np.int64),
                   None if upper is None else np.asarray(upper, dtype=np.float64),
                   None if decided is None else np.asarray(decided, dtype=bool))


@dataclass(frozen=True)
class CellStatus:
    """One contender at one radius, per image."""

    certified: np.ndarray       # `all` certifies it (correct)
    undecided: np.ndarray       # only running `all` tells (the image may count)
    chance: np.ndarray          # posterior chance that the image's vote rate reaches the votes the radius needs


def _looks_of(rule: SequentialRule, rows: Rows) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(look index, on a look of the rule?, trials) of each row's stop."""
    looks = np.asarray(rule.looks())
    look = np.searchsorted(looks, rows.drawn)
    on_look = (rows.drawn > 0) & (look < len(looks)) & (looks[np.minimum(look, len(looks) - 1)] == rows.drawn)
    return look, on_look, np.maximum(rows.drawn, 1).astype(np.float64)


def look_upper(rule: SequentialRule, rows: Rows) -> np.ndarray:
    """Each row's upper bound at the look where it stopped (1 where the row is not on a look): this look's,
    never below the running upper bound, so a test on it alone is sound and cautious."""
    look, on_look, trials = _looks_of(rule, rows)
    upper = np.ones(len(rows.drawn))
    for j in np.unique(look[on_look]):
        at = on_look & (look == j)
        upper[at] = rule.bounds(rows.votes[at].astype(np.float64), trials[at], int(j))[1]
    return upper


def running_upper(rule: SequentialRule, rows: Rows) -> np.ndarray:
    """The running upper bound at each row's stop: its state's where it kept one (the min over every look
    so far, the one `all` has at that look on the same path), else its stopping look's (look_upper)."""
    return np.minimum(look_upper(rule, rows), rows.upper)


def all_would_stop(rule: SequentialRule, rows: Rows, upper: Optional[np.ndarray] = None) -> np.ndarray:
    """True where `all` (rule: every radius of the table) stops at the look where the row stopped
    (`upper`: look_upper's, when the caller has it)."""
    thresholds = np.asarray(rule.thresholds)
    certified = (~rows.abstained[:, None]) & (rows.radius[:, None] >= np.asarray(rule.radii)[None, :])
    done = certified.all(axis=1)
    pending = np.argmin(certified, axis=1)
    _, on_look, trials = _looks_of(rule, rows)
    upper = running_upper(rule, rows) if upper is None else upper
    stop = done | (rows.drawn >= rule.n_max) | (on_look & (upper < thresholds[pending]))
    if rule.futility is not None:
        stop |= on_look & ~done & rule.futile(rows.votes.astype(np.float64), trials, pending)
    return stop


def cell_status(rule: SequentialRule, rows: Rows, k: int) -> CellStatus:
    """Certified, undecided and the chance of certifying, for radius index k of `rule` (the table's radii)."""
    r = rule.radii[k]
    certified = rows.correct & (rows.radius >= r)
    reachable = rule.needed[k] <= rule.n_max
    upper = running_upper(rule, rows)
    # the running upper bound below the radius's threshold: the running lower bound never passes it
    # (engine/certify/sequential.py look_decision), so no later look of `all` certifies the radius
    ruled_out = upper < rule.thresholds[k]
    undecided = ((rows.correct | (rows.abstained & rows.may_count)) & ~certified & (rows.prefix_to < k)
                 & ~rows.decided_here(k) & ~ruled_out & ~all_would_stop(rule, rows, upper) & reachable)
    need = min(1.0, rule.needed[k] / rule.n_max)
    chance = beta.sf(need, rows.votes + 0.5, np.maximum(rows.drawn - rows.votes, 0) + 0.5)
    return CellStatus(certified, undecided, chance)


@dataclass(frozen=True)
class Extension:
    """Rerun `images` of a contender's sigma with the table's radii up to index k."""

    contender: Hashable
    k: int
    images: Tuple[int, ...]            # positions in the table's image order
    likeliest: bool = True             # the likely winner settles; else the contender shows it cannot lift the cell

    @property
    def role(self) -> str:
        return "likely winner" if self.likeliest else "shows it loses"


@dataclass(frozen=True)
class CellBound:
    """A cell as reported (the best certified count) and the most `all`'s count can exceed it."""

    radius: float
    certified: int
    undecided_gap: int


def cell_bounds(rules: Dict[Hashable, SequentialRule], rows: Dict[Hashable, Rows]) -> List[CellBound]:
    """Per radius: the best certified count over contenders and max_s (certified + undecided) - that."""
    radii = next(iter(rules.values())).radii
    out = []
    for k, r in enumerate(radii):
        status = {c: cell_status(rules[c], rows[c], k) for c in rules}
        low = max(int(s.certified.sum()) for s in status.values())
        high = max(int(s.certified.sum() + s.undecided.sum()) for s in status.values())
        out.append(CellBound(r, low, high - low))
    return out


def next_extension(rules: Dict[Hashable, SequentialRule], rows: Dict[Hashable, Rows], tolerance: int,
                   order: Sequence[Hashable], history: Sequence[Tuple[Hashable, int]] = (),
                   status_of: Callable[[SequentialRule, Rows, int], CellStatus] = cell_status) -> Optional[Extension]:
    """The next extension the race needs, or None once every cell is within `tolerance` images of
    `all`'s. Radii in increasing order; at the first radius where some contender could still lift
    the cell by more than the tolerance, the contender with the most expected certificates (the
    likely winner) settles all its undecided images, or, if another is likelier, this one settles
    just enough of its undecided images to fall within the tolerance, least likely to certify first.
    The order only changes the cost: the bound is deterministic whichever images are settled.
    `status_of` reads a contender's rows (a study may pass another reading of what the rows know)."""
    radii = rules[order[0]].radii
    for k in range(len(radii)):
        status = {c: status_of(rules[c], rows[c], k) for c in order}
        low = {c: int(s.certified.sum()) for c, s in status.items()}
        high = {c: low[c] + int(s.undecided.sum()) for c, s in status.items()}
        expected = {c: low[c] + float(s.chance[s.undecided].sum()) for c, s in status.items()}
        best = max(low.values())
        open_ = [c for c in order if high[c] > best + tolerance]
        if not open_:
            continue
        likeliest = max(order, key=lambda c: (expected[c], order.index(c)))
        contender = max(open_, key=lambda c: (expected[c], order.index(c)))
        undecided = np.flatnonzero(status[contender].undecided)
        if contender != likeliest:
            least_likely_first = undecided[np.argsort(status[contender].chance[undecided], kind="stable")]
            asked_before = sum(1 for earlier in history if tuple(earlier) == (contender, k))
            undecided = least_likely_first[:(high[contender] - best - tolerance) * 2 ** asked_before]
        return Extension(contender, k, tuple(int(i) for i in sorted(undecided)), contender == likeliest)
    return None


def extension_bound(images: int, contenders: int, radii: int) -> int:
    """The most extensions a line's race can ask for: each decides at least one undecided (image,
    contender, radius), and no decision is undone (the module's docstring)."""
    return images * contenders * radii


def tolerance_images(points: float, images: int) -> int:
    """The tolerance in whole images: floor(points / 100 x images)."""
    return int(np.floor(points / 100.0 * images + 1e-9))

"""What another run on the same images would see: each image's vote rate for its label as a Beta posterior read
from its row, and each run's rule as counts (the fewest label votes of n that certify each radius). The comparison
with the paper's cells (engine/table/rerun_cells.py) draws reruns from them.

A row's posterior (Jeffreys, Beta(votes + 1/2, n - votes + 1/2)):
  sequential rows (`top_votes`, `samples`, `selected`): the selected class's votes among the estimation samples; a row
      whose selected (or certified) class is not its label never certifies the label (the rerun selects on its own
      samples; near a tie it could pick the label, where it would not certify it either);
  fixed-n rows (the reference TSV: no counts): a certified row's votes are recovered from its printed radius (the
      middle of the counts that print it); a row certified for another class never certifies the label; an abstained
      row says only that the bound missed 1/2, so the abstained rows mirror the certified ones just above that
      threshold (the density of the label's votes taken as continuous across it: for each certified row within a few
      standard deviations above, one abstained row gets the count as far below) and the others never certify.
A sequential run is modelled by its rule's chance of certifying each radius at a vote rate, simulated on its own looks
(engine/table/rule_odds.py); a race or auto run as `--plan all`'s rule, settling every radius of the table (the race's
cells are within its tolerance of all's)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Dict, List, Optional, Sequence

import numpy as np
from scipy.stats import beta, binom, norm

from diffsmooth.engine.certify.cohen import lower_confidence_bounds
from diffsmooth.engine.certify.sequential import SequentialRule, needed_votes
from diffsmooth.engine.table.rule_odds import chances

JEFFREYS = 0.5                  # the prior's two shapes
NODES = 32                      # an image's posterior as this many rates (evenly spaced quantiles)
MIRROR_SDS = 4.0                # abstained rows mirror the certified rows this many binomial sds above the threshold


@dataclass(frozen=True)
class Rule:
    """A run's certification: fixed-n, n estimation samples of which `needed[k]` label votes certify radius k (n + 1:
    never); a sequential rule (n its n-max) also carries its chance of certifying each radius at a grid of vote rates
    (engine/table/rule_odds.py)."""

    n: int
    needed: np.ndarray
    rates: Optional[np.ndarray] = None
    chance: Optional[np.ndarray] = None

    def chances_at(self, p: np.ndarray) -> List[np.ndarray]:
        """A sequential rule's chance of certifying each radius at vote rates p (linear between its grid's rates; 0
        below them)."""
        at = np.clip(np.searchsorted(self.rates, p, side="right"), 1, len(self.rates) - 1)
        low, high = self.rates[at - 1], self.rates[at]
        weight = np.clip((p - low) / (high - low), 0.0, 1.0)
        below = p < self.rates[0]
        return [np.where(below, 0.0, c[at - 1] + weight * (c[at] - c[at - 1])) for c in self.chance]

    def reaches(self) -> np.ndarray:
        """Per radius: can any count certify it (all n votes for the label)?"""
        return self.needed <= self.n


@dataclass(frozen=True)
class Rates:
    """One run's images in the table's order: the label's vote rate ~ Beta(a, b); `never` rows never certify it."""

    a: np.ndarray
    b: np.ndarray
    never: np.ndarray


def rate_nodes(rates: Rates, nodes: int = NODES) -> np.ndarray:
    """[images, nodes]: each image's vote rate at `nodes` evenly spaced quantiles of its posterior (0: never)."""
    levels = (np.arange(nodes) + 0.5) / nodes
    p = beta.ppf(levels[None, :], rates.a[:, None], rates.b[:, None])
    return np.where(rates.never[:, None], 0.0, p)


def certify_chances(p: np.ndarray, n0: int, rule: Rule) -> np.ndarray:
    """[images, nodes, radii]: the chance that a run with `rule` certifies an image at each radius when its label's
    vote rate is p ([images, nodes]; 0: never). The label is taken as selected where it holds at least half of the n0
    selection votes (a two-class view: the most one rival can take)."""
    selected = binom.sf(math.ceil(n0 / 2) - 1, n0, p)
    if rule.chance is None:
        certify = binom.sf(rule.needed[None, None, :] - 1, rule.n, p[:, :, None])
    else:
        certify = np.stack(rule.chances_at(p), axis=-1)
    return np.where(p[:, :, None] > 0, selected[:, :, None] * certify, 0.0)


@lru_cache(maxsize=64)
def _radii_by_count(n: int, alpha: float, sigma: float) -> np.ndarray:
    """The fixed-n CERTIFY radius of every count 0..n (-1: abstains, the bound below 1/2)."""
    lower = lower_confidence_bounds(np.arange(n + 1), n, alpha)
    return np.where(lower >= 0.5, sigma * norm.ppf(np.clip(lower, 0.5, 1.0)), -1.0)


def fixed_rule(n: int, alpha: float, sigma: float, radii: Sequence[float]) -> Rule:
    """Fixed-n CERTIFY (engine/certify/cohen.py): the fewest votes whose bound is >= 1/2 and whose radius is >= r."""
    by_count = _radii_by_count(int(n), float(alpha), float(sigma))
    needed = np.array([np.searchsorted(by_count, float(r) - 1e-12, side="left") for r in radii], dtype=np.int64)
    return Rule(int(n), needed)


def sequential_rule(rule: SequentialRule, radii: Sequence[float]) -> Rule:
    """A sequential run: its last look's needed votes at n-max (its reach) and its chance of certifying each radius,
    simulated on its own looks (engine/table/rule_odds.py)."""
    thresholds = norm.cdf(np.asarray(radii, dtype=np.float64) / rule.sigma)
    needed = needed_votes(rule.final_bound, rule.n_max, thresholds).astype(np.int64)
    rates, chance = chances(rule, radii, needed)
    return Rule(rule.n_max, needed, rates, chance)


def recover_count(radius: float, n: int, alpha: float, sigma: float) -> int:
    """The count of n whose fixed-n radius prints as `radius` (3 significant digits rounded down): the middle of
    those that do, else the nearest."""
    by_count = _radii_by_count(int(n), float(alpha), float(sigma))
    if radius <= 0:
        return int(np.searchsorted(by_count, 0.0, side="left"))
    unit = 10.0 ** (math.floor(math.log10(radius)) - 2)
    low = int(np.searchsorted(by_count, radius - 1e-12, side="left"))
    high = int(np.searchsorted(by_count, radius + unit - 1e-12, side="left")) - 1
    if low <= high:
        return (low + high) // 2
    return int(np.argmin(np.abs(by_count - radius)))


def _sequential_rates(rows: List[dict], n0: int):
    """(votes, drawn, never) of sequential rows."""
    votes, drawn, never = [], [], []
    for row in rows:
        label, predict = int(row["label"]), int(row["predict"])
        selected = row.get("selected")
        wrong = (selected not in (None, "") and int(selected) != label) or (predict >= 0 and predict != label)
        used = int(row["samples"]) - n0
        votes.append(int(row["top_votes"]))
        drawn.append(max(used, 0))
        never.append(wrong or used <= 0)
    return np.array(votes), np.array(drawn), np.array(never)


def _fixed_rates(rows: List[dict], n: int, alpha: float, sigma: float):
    """(votes, drawn, never) of fixed-n rows, the abstained rows mirrored (the module's note)."""
    votes, never, abstained = np.zeros(len(rows), dtype=np.int64), np.ones(len(rows), dtype=bool), []
    for k, row in enumerate(rows):
        if int(row["correct"]) == 1:
            votes[k], never[k] = recover_count(float(row["radius"]), n, alpha, sigma), False
        elif int(row["predict"]) < 0:
            abstained.append(k)
    first = int(np.searchsorted(_radii_by_count(int(n), float(alpha), float(sigma)), 0.0, side="left"))
    v = min(first / n, 1.0)                   # first > n: no count certifies (a smoke run's n = 1)
    band = MIRROR_SDS * math.sqrt(n * v * (1 - v)) + 1
    above = np.sort(votes[~never & (votes < first + band)])
    for k, count in zip(abstained, above):
        votes[k], never[k] = max(2 * first - 1 - int(count), 0), False
    return votes, np.full(len(rows), n), never


def run_rates(rows: List[dict], order: Sequence[int], n0: int, n: int, alpha: float, sigma: float) -> Rates:
    """The run's rows as label-rate posteriors in the table's image order (`order`: indices); a missing image never
    certifies. Sequential rows are read from their counts, fixed-n rows from their radii (`n`: the run's n)."""
    if not rows:
        ones = np.ones(len(order))
        return Rates(ones, ones, ones.astype(bool))
    votes, drawn, never = _sequential_rates(rows, n0) if is_sequential(rows) else _fixed_rates(rows, n, alpha, sigma)
    where: Dict[int, int] = {int(row["idx"]): k for k, row in enumerate(rows)}
    take = np.array([where.get(int(i), -1) for i in order], dtype=np.int64)
    missing = take < 0
    take = np.where(missing, 0, take)
    return Rates(votes[take] + JEFFREYS, drawn[take] - votes[take] + JEFFREYS, never[take] | missing)


def is_sequential(rows: List[dict]) -> bool:
    """Rows of a sequential run (they carry their counts)."""
    return bool(rows) and rows[0].get("top_votes") not in (None, "")


def run_rule(rows: List[dict], n_max: int, alpha: float, sigma: float, radii: Sequence[float],
             sequential: Optional[SequentialRule] = None) -> Rule:
    """The run's own rule: fixed-n CERTIFY at n-max, or `sequential` (the table's rule at this sigma) for sequential
    rows."""
    if is_sequential(rows):
        rule = sequential or SequentialRule(tuple(radii), sigma, alpha, n_max)
        return sequential_rule(rule, radii)
    return fixed_rule(n_max, alpha, sigma, radii)

"""How far Monte Carlo noise alone moves a table's cells on these images: joint draws of two runs of the same set-up
(ours, and the reference: the paper's fixed-n CERTIFY at the spec's N, or our own plan) from each image's label-rate
posterior (engine/table/image_odds.py), every cell of every line from the same draw of each image, so a row's cells
stay as correlated as they are in a table. From the draws: each paper cell's 95% interval (the measured cell plus
where the difference of two runs falls), the best-of-lines bias, the cells no run can reach, and the test of a shift
in one direction across a row's or the table's cells."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from diffsmooth.engine.certify.sequential import SequentialRule
from diffsmooth.engine.table.image_odds import (
    Rates,
    Rule,
    certify_chances,
    fixed_rule,
    is_sequential,
    rate_nodes,
    run_rates,
    run_rule,
)

DRAWS = 2000                    # joint draws of the two runs: a p-value's resolution is 1 / DRAWS
LEVEL = 0.95                    # a cell's interval
SHIFT_LEVEL = 0.01              # a row's or the table's shift is marked below this p-value
ROUNDING = 0.05                 # the paper prints a cell to 0.1 point


@dataclass(frozen=True)
class Contender:
    """One run of a line (a sigma and configuration): its images' rates, its rule and the reference's, and the radii
    where it counts in the line's cell (ours: the plan's; the reference: the paper's best over every sigma)."""

    line: str
    n0: int
    rates: Rates
    own: Rule
    reference: Rule
    settles: np.ndarray
    reference_settles: np.ndarray


@dataclass
class LineDraws:
    """One line's cells in every draw ([draws, radii] counts), the best contender's expected count per radius, and
    the radii one of its runs can reach."""

    own: np.ndarray
    reference: np.ndarray
    best_expected: np.ndarray
    reach: np.ndarray


@dataclass(frozen=True)
class CellSpread:
    """A paper cell against Monte Carlo noise on these images: `interval` (percent) holds the paper's cell in 95% of
    reruns of this set-up, given the measured one; `reach` False: no run of the row can certify the radius; `bias`
    (points): how much the measured cell, a best of several runs, is expected above its best single run."""

    interval: Tuple[float, float]
    reach: bool
    bias: float


@dataclass(frozen=True)
class Shift:
    """A shift in one direction across cells: the mean of paper - measured (points) over `cells` reachable cells,
    `below` of them measured below the paper, and its two-sided p-value against Monte Carlo noise on these images."""

    points: float
    p_value: float
    cells: int
    below: int

    @property
    def marked(self) -> bool:
        return self.cells > 0 and self.p_value < SHIFT_LEVEL

    def as_dict(self) -> dict:
        return {"points": self.points, "p_value": self.p_value, "cells": self.cells, "below": self.below,
                "level": SHIFT_LEVEL, "marked": self.marked}


def _counts(rng, chance: np.ndarray, node: np.ndarray, settles: np.ndarray) -> np.ndarray:
    """[draws, radii]: one run's images certified at each radius (-1 where the run does not count there): in each
    draw an image is at its posterior node `node` [draws, images] and certified with one uniform against its chances
    there (a run's certificates are nested: an image certified at a radius is at every smaller one)."""
    images = np.arange(chance.shape[0])[None, :]
    u = rng.random(node.shape)
    counts = np.stack([(u < chance[:, :, k][images, node]).sum(axis=1) for k in range(chance.shape[2])], axis=1)
    return np.where(settles[None, :], counts, -1)


def draw_lines(contenders: Sequence[Contender], draws: int = DRAWS, seed: int = 0) -> Dict[str, LineDraws]:
    """Every line's cells in `draws` joint reruns: in each draw an image's vote rate is one of its posterior's nodes,
    shared by the two runs (ours and the reference), which then certify it independently (image_odds; runs and lines
    drawn independently)."""
    rng = np.random.default_rng(seed)
    out: Dict[str, LineDraws] = {}
    for c in contenders:
        p = rate_nodes(c.rates)
        node = rng.integers(p.shape[1], size=(draws, p.shape[0]))
        own = _counts(rng, certify_chances(p, c.n0, c.own), node, c.settles)
        reference = _counts(rng, certify_chances(p, c.n0, c.reference), node, c.reference_settles)
        expected = np.where(c.settles, own.mean(axis=0), 0.0)     # over the draws: the best's mean is never below
        reach = c.own.reaches() | c.reference.reaches()
        line = out.get(c.line)
        if line is None:
            out[c.line] = LineDraws(np.maximum(own, 0), np.maximum(reference, 0), expected, reach)
        else:
            line.own, line.reference = np.maximum(line.own, own), np.maximum(line.reference, reference)
            line.best_expected, line.reach = np.maximum(line.best_expected, expected), line.reach | reach
    return out


@dataclass
class RowDraws(LineDraws):
    """A published row's cells in every draw: the best of its lines, ours and the reference's."""

    images: int

    @classmethod
    def of(cls, lines: Dict[str, LineDraws], names: Sequence[str], images: int) -> "RowDraws":
        chosen = [lines[name] for name in names if name in lines]
        return cls(np.max([d.own for d in chosen], axis=0), np.max([d.reference for d in chosen], axis=0),
                   np.max([d.best_expected for d in chosen], axis=0), np.any([d.reach for d in chosen], axis=0), images)

    def differences(self) -> np.ndarray:
        """[draws, radii]: the reference's cell minus ours, in points."""
        return 100.0 * (self.reference - self.own) / self.images

    def cell(self, k: int, measured: int) -> CellSpread:
        """Radius index k's spread around the `measured` count (central LEVEL of the difference of two runs)."""
        diff = self.reference[:, k] - self.own[:, k]
        tail = (1 - LEVEL) / 2
        low, high = (np.quantile(diff, q, method="inverted_cdf") for q in (tail, 1 - tail))
        scale = 100.0 / self.images
        interval = (float(scale * max(measured + low, 0)), float(scale * min(measured + high, self.images)))
        return CellSpread(interval, bool(self.reach[k]), float(scale * (self.own[:, k].mean() - self.best_expected[k])))


def two_sided(observed: float, null: np.ndarray) -> float:
    """The two-sided Monte Carlo p-value of `observed` among the `null` draws (each tail counted with the observed)."""
    upper = (1 + np.sum(null >= observed - 1e-9)) / (len(null) + 1)
    lower = (1 + np.sum(null <= observed + 1e-9)) / (len(null) + 1)
    return float(min(1.0, 2 * min(upper, lower)))


def shift(parts: Sequence[Tuple[RowDraws, Sequence[int], Sequence[float], Sequence[float]]]) -> Shift:
    """The mean of paper - measured over the given cells, tested against the same mean in the draws (reference minus
    ours): a permutation-style Monte Carlo test that keeps the cells' correlation. A sign or binomial test over the
    cells would not: the cells of a row share its images (one image moves every radius it certifies), and rows share
    lines. `parts`: (a row's draws, its radius indices, the paper's cells there, the measured ones), in points."""
    observed, null = [], []
    for draws, ks, paper, measured in parts:
        if len(ks):
            observed.append(np.asarray(paper, dtype=np.float64) - np.asarray(measured, dtype=np.float64))
            null.append(draws.differences()[:, list(ks)])
    if not observed:
        return Shift(0.0, 1.0, 0, 0)
    gaps = np.concatenate(observed)
    statistic = float(gaps.mean())
    return Shift(statistic, two_sided(statistic, np.concatenate(null, axis=1).mean(axis=1)), len(gaps),
                 int(np.sum(gaps > ROUNDING)))


@dataclass(frozen=True)
class TableRuns:
    """What the comparison needs of a finished table: each line's rows ({line: {sigma: {config: rows}}}), the
    table's radii, settles(sigma, r), n0, n-max, alpha, and the sequential rule at a sigma (None: fixed-n rows)."""

    rows_by_line: Dict[str, Dict[float, Dict[str, List[dict]]]]
    radii: Sequence[float]
    settles: Callable[[float, float], bool]
    n0: int
    n_max: int
    alpha: float
    rule: Optional[Callable[[float], SequentialRule]] = field(default=None)


def image_order(runs: TableRuns) -> List[int]:
    """Every image of the table, by index."""
    return sorted({int(row["idx"]) for per in runs.rows_by_line.values() for configs in per.values()
                   for rows in configs.values() for row in rows})


def contenders(runs: TableRuns, reference: str = "fixed") -> List[Contender]:
    """Every (line, sigma, configuration) run as a Contender; `reference`: "fixed" (the paper: fixed-n CERTIFY at
    n-max, the best over every sigma) or "same" (another run of our own plan, as two seeds of one table)."""
    if reference not in ("fixed", "same"):
        raise ValueError(f"reference must be 'fixed' or 'same', got {reference!r}")
    order, radii = image_order(runs), list(runs.radii)
    out = []
    for line, per in runs.rows_by_line.items():
        for sigma, configs in sorted(per.items()):
            settles = np.array([bool(runs.settles(sigma, r)) for r in radii])
            for _, rows in sorted(configs.items()):
                rule = runs.rule(sigma) if runs.rule is not None and is_sequential(rows) else None
                own = run_rule(rows, runs.n_max, runs.alpha, sigma, radii, rule)
                rates = run_rates(rows, order, runs.n0, runs.n_max, runs.alpha, sigma)
                if reference == "same":
                    out.append(Contender(line, runs.n0, rates, own, own, settles, settles))
                else:
                    paper = fixed_rule(runs.n_max, runs.alpha, sigma, radii)
                    out.append(Contender(line, runs.n0, rates, own, paper, settles, np.ones(len(radii), dtype=bool)))
    return out

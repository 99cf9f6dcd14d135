"""The race plan replayed on simulated vote paths (no model): the same decisions as the table
(engine/table/race.py) on rows that the sequential rule produces on paired Binomial paths, so its
samples and cells compare with `all` and fixed-n on the same paths. A model of a table, not a
measurement: vote rates per image and sigma are given (from measured rows or a pilot's posterior).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

import numpy as np

from diffsmooth.engine.certify.cohen import lower_confidence_bounds
from diffsmooth.engine.certify.sequential import SequentialRule, radius_from_lower, run_rule
from diffsmooth.engine.runs.simulation import chunk_votes, shared_paths
from diffsmooth.engine.table.race import (
    INITIAL_REACH,
    Rows,
    initial_radii,
    next_extension,
    prefix,
    settled_prefix,
    tolerance_images,
)


class SimulatedSigma:
    """One sigma's images on one set of paths: rows of any radius set, cached, and each image's latest row."""

    def __init__(self, sigma: float, rates: np.ndarray, correct: np.ndarray, radii: Sequence[float], alpha: float,
                 n_max: int, rng, first: Tuple[float, ...]):
        self.sigma, self.correct, self.alpha, self.n_max = sigma, np.asarray(correct, bool), alpha, n_max
        self.radii = tuple(sorted(radii))
        self.rule = SequentialRule(self.radii, sigma, alpha, n_max)
        self.cuts, self.segments = shared_paths(np.asarray(rates, np.float64), [self.rule], n_max, rng)
        self.cache: Dict[Tuple[float, ...], tuple] = {}
        self.sets: List[Tuple[float, ...]] = [first] * len(rates)

    def run(self, radii: Tuple[float, ...]) -> tuple:
        """(radius, estimation samples, top votes) of every image under the rule settling `radii`."""
        if radii not in self.cache:
            rule = SequentialRule(radii, self.sigma, self.alpha, self.n_max, schedule_radii=self.radii)
            votes = chunk_votes(self.cuts, self.segments, rule)
            lower, used = run_rule(rule, votes)
            cumulative = np.concatenate([np.zeros((len(votes), 1)), np.cumsum(votes, axis=1)], axis=1)
            at = np.searchsorted(np.concatenate([[0], rule.looks()]), used)
            self.cache[radii] = (radius_from_lower(lower, self.sigma), used, cumulative[np.arange(len(votes)), at])
        return self.cache[radii]

    def rows(self) -> Rows:
        radius, used, votes = (np.empty(len(self.sets)) for _ in range(3))
        prefix_to = np.empty(len(self.sets), dtype=np.int64)
        for radii in set(self.sets):
            at = np.array([s == radii for s in self.sets])
            run = self.run(radii)
            radius[at], used[at], votes[at] = run[0][at], run[1][at], run[2][at]
            prefix_to[at] = settled_prefix(self.radii, radii)
        abstained = radius <= 0
        return Rows(radius, self.correct & ~abstained, abstained, votes.astype(np.int64), used.astype(np.int64),
                    prefix_to)

    def samples(self) -> float:
        return float(sum(self.run(s)[1][i] for i, s in enumerate(self.sets)))


@dataclass(frozen=True)
class RaceOutcome:
    samples: Dict[float, float]      # per sigma: first runs' estimation samples, extensions' n0 + estimation samples
    cells: np.ndarray                # certified images per radius
    extensions: int                  # extension runs the race asked for


def simulate_race(sims: Dict[float, SimulatedSigma], tolerance: int, n0: int) -> RaceOutcome:
    """Run the race to the end on simulated rows; an extension reruns its images from their first sample
    (n0 selection samples included)."""
    order = sorted(sims)
    rules = {s: sims[s].rule for s in order}
    samples = {s: sims[s].samples() for s in order}
    extensions = 0
    while True:
        ext = next_extension(rules, {s: sims[s].rows() for s in order}, tolerance, order)
        if ext is None:
            break
        sim = sims[ext.contender]
        for i in ext.images:
            radii = prefix(sim.radii, max(ext.k, sim.radii.index(max(sim.sets[i]))))
            sim.sets[i] = radii
            samples[ext.contender] += float(sim.run(radii)[1][i]) + n0
        extensions += 1
    rows = {s: sims[s].rows() for s in order}
    cells = np.array([max(int((rows[s].correct & (rows[s].radius >= r)).sum()) for s in order)
                      for r in sims[order[0]].radii])
    return RaceOutcome(samples, cells, extensions)


def simulate_plans(rates: Dict[float, np.ndarray], correct: Dict[float, np.ndarray], radii: Sequence[float],
                   alpha: float, n_max: int, n0: int, tolerance_points: float, rng,
                   reach: float = INITIAL_REACH) -> dict:
    """One seed of fixed-n, `all` and the race on the same paths: {plan: (samples with n0, cells in %)}."""
    sigmas = sorted(rates)
    images = len(rates[sigmas[0]])
    sims = {s: SimulatedSigma(s, rates[s], correct[s], radii, alpha, n_max, rng, initial_radii(radii, s, reach)) for s in sigmas}
    fixed_cells, all_cells, all_samples = np.zeros(len(radii)), np.zeros(len(radii)), 0.0
    for s in sigmas:
        sim = sims[s]
        fixed = radius_from_lower(lower_confidence_bounds(sim.segments.sum(axis=1), n_max, alpha), s)
        full = sim.run(sim.radii)
        all_samples += float(full[1].sum())
        for k, r in enumerate(sim.radii):
            fixed_cells[k] = max(fixed_cells[k], np.sum(sim.correct & (fixed > 0) & (fixed >= r)))    # > 0: not abstained
            all_cells[k] = max(all_cells[k], np.sum(sim.correct & (full[0] > 0) & (full[0] >= r)))
    race = simulate_race(sims, tolerance_images(tolerance_points, images), n0)
    runs = len(sigmas) * images * n0
    return {"fixed": (len(sigmas) * images * (n0 + n_max), 100 * fixed_cells / images),
            "all": (all_samples + runs, 100 * all_cells / images),
            "race": (sum(race.samples.values()) + runs, 100 * race.cells / images), "extensions": race.extensions}

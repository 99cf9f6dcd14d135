"""The race plan replayed on simulated vote paths (no model): the same decisions as the table
(engine/table/race.py) on rows that the sequential rule produces on paired Binomial paths, so its
samples and cells compare with `all` and fixed-n on the same paths. A model of a table, not a
measurement: vote rates per image and sigma are given (from measured rows or a pilot's posterior).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Optional, Sequence, Tuple

import numpy as np

from diffsmooth.engine.certify.sequential import DEFAULT_LAST_LOOK, SequentialRule, radius_from_lower, run_rule_bounds
from diffsmooth.engine.runs.simulation import chunk_votes, shared_paths
from diffsmooth.engine.table.race import Rows, next_extension, prefix, settled_prefix


@dataclass(frozen=True)
class RaceRule:
    """How every simulated run is certified: the table's radii, alpha and n-max, the wrong-class stop, the last look."""

    radii: Sequence[float]
    alpha: float
    n_max: int
    wrong_class_stop: bool = True
    last_look: float = DEFAULT_LAST_LOOK


class SimulatedSigma:
    """One sigma's images on one set of paths: rows of any radius set (cached), and each image's latest row.
    `correct`: the image's selected class is its label. `rule.wrong_class_stop` (the table's runs): rows record
    the selected class, and an image whose selected class is not its label stops after its n0 selection
    samples (engine/certify/sequential.py); off, every image runs the rule and an abstaining row's class
    is unknown to the race (rows written before `selected` existed). `rule.last_look`: every rule's
    SequentialRule.last_look (its default unless a study compares shares)."""

    def __init__(self, sigma: float, rates: np.ndarray, correct: np.ndarray, rule: RaceRule, rng,
                 first: Tuple[float, ...]):
        self.sigma, self.correct, self.alpha, self.n_max = sigma, np.asarray(correct, bool), rule.alpha, rule.n_max
        self.wrong_class_stop, self.last_look = bool(rule.wrong_class_stop), rule.last_look
        self.radii = tuple(sorted(rule.radii))
        self.rule = SequentialRule(self.radii, sigma, self.alpha, self.n_max, last_look=self.last_look)
        self.cuts, self.segments = shared_paths(np.asarray(rates, np.float64), [self.rule], self.n_max, rng)
        self.cache: Dict[Tuple[float, ...], tuple] = {}
        images = len(rates)                             # each image's latest row, and how it was run
        self.latest = {"radius": np.zeros(images), "used": np.zeros(images), "top": np.zeros(images),
                       "upper": np.ones(images), "decided": np.zeros((images, len(self.radii)), dtype=bool),
                       **{key: np.full(images, -1, dtype=np.int64) for key in ("prefix_to", "decided_at")}}
        self.first = tuple(first)
        self.settle(np.arange(images), self.first)

    def run(self, radii: Tuple[float, ...]) -> tuple:
        """(radius, estimation samples, top votes, running upper bound) of every image under the rule
        settling `radii`."""
        if radii not in self.cache:
            rule = SequentialRule(radii, self.sigma, self.alpha, self.n_max, schedule_radii=self.radii,
                                  last_look=self.last_look)
            self.cache[radii] = self._rows_of(rule, np.arange(len(self.correct)))
        return self.cache[radii]

    def _rows_of(self, rule: SequentialRule, images: np.ndarray, after=None) -> tuple:
        votes = chunk_votes(self.cuts, self.segments[images], rule)
        lower, used, upper = run_rule_bounds(rule, votes, after)
        cumulative = np.concatenate([np.zeros((len(votes), 1)), np.cumsum(votes, axis=1)], axis=1)
        at = np.searchsorted(np.concatenate([[0], rule.looks()]), used)
        radius, top = radius_from_lower(lower, self.sigma), cumulative[np.arange(len(votes)), at]
        if self.wrong_class_stop:                       # stopped after the selection, abstaining
            radius, used, top = (np.where(self.correct[images], a, 0) for a in (radius, used, top))
            upper = np.where(self.correct[images], upper, 1.0)
        return radius, used, top, upper

    def _move(self, images: np.ndarray, rows: tuple, prefix_to: int, decided: int) -> None:
        """The images' latest rows become `rows`; a row at the look of the one before keeps what that proved
        (the same state: its prefix and decided radii, as LineRace.latest reads the files)."""
        radius, used, top, upper = (values for values in rows)
        same = used == self.latest["used"][images]
        self.latest["prefix_to"][images] = np.where(same, np.maximum(self.latest["prefix_to"][images], prefix_to),
                                                    prefix_to)
        self.latest["decided"][images[~same]] = False
        if decided >= 0:
            self.latest["decided"][images, decided] = True
        self.latest["decided_at"][images] = decided
        for key, values in zip(("radius", "used", "top", "upper"), (radius, used, top, upper)):
            self.latest[key][images] = values

    def settle(self, images: np.ndarray, radii: Tuple[float, ...]) -> None:
        """The images' latest rows become those of a run settling `radii` from the first sample."""
        images = np.asarray(images, dtype=np.int64)
        self._move(images, tuple(values[images] for values in self.run(tuple(radii))), settled_prefix(self.radii, radii), -1)

    def decide(self, images: np.ndarray, k: int) -> None:
        """The images go on from their latest rows with the rule that decides radius index k (the race's
        extensions): to the first look at or after their rows' that decides it."""
        images = np.asarray(images, dtype=np.int64)
        rule = SequentialRule(prefix(self.radii, k), self.sigma, self.alpha, self.n_max, schedule_radii=self.radii,
                              decide_largest=True, last_look=self.last_look)
        self._move(images, self._rows_of(rule, images, self.latest["used"][images]), -1, k)

    def rows(self) -> Rows:
        latest = self.latest
        abstained = latest["radius"] <= 0
        return Rows(latest["radius"].copy(), self.correct & ~abstained, abstained, latest["top"].astype(np.int64),
                    latest["used"].astype(np.int64), latest["prefix_to"].copy(),
                    self.correct if self.wrong_class_stop else None, latest["decided_at"].copy(), latest["upper"].copy(),
                    latest["decided"].copy())

    def samples(self) -> float:
        return float(self.latest["used"].sum())


def race_samples(sims: Dict[float, SimulatedSigma], tolerance: int, extend: Optional[Callable] = None) -> Dict[float, float]:
    """Run the race to the end on simulated rows, as the table runs it: an extension at radius k goes on from
    where each image's row stopped (the rows' states) to the look that decides k; `extend(extension)` replaces
    that step (the studies' variants, studies/replay.py). Each sigma's estimation samples at the end."""
    order = sorted(sims)
    rules = {s: sims[s].rule for s in order}
    history = []
    while (ext := next_extension(rules, {s: sims[s].rows() for s in order}, tolerance, order, history)) is not None:
        if extend is None:
            sims[ext.contender].decide(np.asarray(ext.images, dtype=np.int64), ext.k)
        else:
            extend(ext)
        history.append((ext.contender, ext.k))
    return {s: sims[s].samples() for s in order}

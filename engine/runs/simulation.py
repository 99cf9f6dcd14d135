"""The sequential-rule simulator's core: replay images from their rows as Binomial vote paths (no model).

An image's vote rate p for its selected class comes from its row: a sequential row carries the
selected class's estimation votes (`top_votes`) and the samples drawn, so p is Jeffreys' estimate
(top_votes + 1/2) / (samples - n0 + 1), never exactly 1: an image that stopped early with every vote
for its class would otherwise replay as certain at any n-max. A fixed-n row only prints a radius,
so the nA whose radius prints the same is found (`recover_votes`). Paths of i.i.d. votes with that
p then run through fixed-n CERTIFY and through sequential rules (the engine's vectorised
`run_rule`), all on the SAME paths, so differences are paired. A model of a measurement, not a
measurement: it assumes the selection picks the same class and that votes are i.i.d. given p.
studies/sequential_sim.py prints tables from it; the table command predicts its cost with it.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np
from scipy.stats import norm

from diffsmooth.engine.certify.cohen import lower_confidence_bounds
from diffsmooth.engine.certify.sequential import SequentialRule, radius_from_lower, run_rule
from diffsmooth.engine.runs.results import format_radius


def recover_votes(radius: float, n: int, alpha: float, sigma: float) -> Optional[int]:
    """The nA (out of n) whose fixed-n CERTIFY radius prints as `radius`; None for radius 0."""
    if radius <= 0:
        return None
    n_a = np.arange(n // 2, n + 1)
    radii = sigma * norm.ppf(lower_confidence_bounds(n_a, n, alpha))
    printed = np.array([float(format_radius(r)) if r > 0 else 0.0 for r in radii])
    hits = n_a[printed == float(format_radius(radius))]
    if len(hits):
        return int(hits[len(hits) // 2])
    return int(n_a[np.argmin(np.abs(radii - radius))])


@dataclass(frozen=True)
class Image:
    p: float                 # vote rate of the predicted class
    correct: bool            # the fixed run's prediction was right (accuracy counts only these)
    idx: int = -1            # the row's dataset index
    votes: int = -1          # a sequential row's top_votes (-1: a fixed-n row, p recovered from its radius)
    drawn: int = 0           # a sequential row's estimation samples


def image_from_row(row: dict, n: int, n0: int, alpha: float, sigma: float, abstain_p: float) -> Image:
    """An image's vote rate from its row: Jeffreys' estimate from `top_votes` and `samples` in a sequential row, else
    recovered from a fixed-n row's printed radius at its n; an abstained fixed-n row gets abstain_p."""
    correct = int(row["correct"]) == 1
    if row.get("top_votes") not in (None, ""):
        drawn = int(row["samples"]) - n0
        p = (int(row["top_votes"]) + 0.5) / (drawn + 1) if drawn > 0 else abstain_p
        return Image(p, correct, int(row["idx"]), int(row["top_votes"]), drawn)
    n_a = recover_votes(float(row["radius"]), n, alpha, sigma)
    p = abstain_p if n_a is None or int(row["predict"]) < 0 else n_a / n
    return Image(p, correct and n_a is not None, int(row["idx"]))


def load_images(path, n: int, alpha: float, sigma: float, abstain_p: float, n0: int = 100) -> List[Image]:
    """Images of a result file: fixed-n rows (at n) or sequential rows (with `top_votes`)."""
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t"))
    return [image_from_row(row, n, n0, alpha, sigma, abstain_p) for row in rows]


def shared_paths(p: np.ndarray, rules, n: int, rng) -> Tuple[np.ndarray, np.ndarray]:
    """(cut points, votes per segment): one Binomial vote path per rate p, cut at every look of every
    rule and at n, so each rule's chunk votes and the fixed-n count (their total) share the path."""
    cuts = sorted({n, *(int(t) for rule in rules for t in rule.looks())})
    sizes = np.diff(np.concatenate([[0], cuts]))
    return np.asarray(cuts), rng.binomial(sizes[None, :], np.asarray(p, dtype=np.float64)[:, None])


def chunk_votes(cuts: np.ndarray, segments: np.ndarray, rule: SequentialRule) -> np.ndarray:
    """The votes of each chunk of rule.chunks(), summed from the shared segments."""
    cumulative = np.cumsum(segments, axis=1)
    at_looks = cumulative[:, np.searchsorted(cuts, rule.looks())]
    return np.diff(np.concatenate([np.zeros((len(segments), 1), dtype=at_looks.dtype), at_looks], axis=1), axis=1)


def simulate_sequential(p: np.ndarray, rule: SequentialRule, rng, votes=None):
    """(radii, estimation samples) of `rule` on Binomial vote paths with rates p (1-D); `votes`,
    shape (len(p), len(rule.chunks())), fixes the per-chunk votes instead."""
    if votes is None:
        votes = rng.binomial(np.asarray(rule.chunks())[None, :], np.asarray(p, dtype=np.float64)[:, None])
    lower, used = run_rule(rule, votes)
    return radius_from_lower(lower, rule.sigma), used


def oracle_samples(p: np.ndarray, n_max: int, alpha: float, sigma: float, radii: Sequence[float]) -> np.ndarray:
    """A ceiling, not a rule: knowing p, the fewest estimation samples n at which fixed-n CERTIFY with
    the expected votes p n settles the largest listed radius that it settles at n_max (0 samples
    when it settles none). Its certified accuracy is fixed-n's by construction."""
    thresholds = norm.cdf(np.asarray(sorted(radii)) / sigma)
    p = np.asarray(p, dtype=np.float64)
    at_max = lower_confidence_bounds(np.floor(p * n_max), n_max, alpha)
    reach = (at_max[:, None] > 0.5) & (at_max[:, None] >= thresholds[None, :])
    target = np.where(reach.any(axis=1), thresholds[np.maximum(reach.sum(axis=1) - 1, 0)], np.inf)
    lo, hi = np.zeros(len(p), dtype=np.int64), np.full(len(p), n_max, dtype=np.int64)
    while np.any(hi - lo > 1):                  # smallest n with bound(floor(p n), n) >= target
        mid = (lo + hi) // 2
        ok = lower_confidence_bounds(np.floor(p * mid), np.maximum(mid, 1), alpha) >= target
        lo, hi = np.where(ok, lo, mid), np.where(ok, mid, hi)
    return np.where(np.isfinite(target), hi, 0)


def accuracy(radius: np.ndarray, correct: np.ndarray, r: float) -> float:
    """Certified accuracy at r: right and not abstained (radius 0 is an abstention), radius >= r."""
    return float(np.mean(correct & (radius > 0) & (radius >= r)))


@dataclass(frozen=True)
class SimulationSetup:
    """The certification a simulation replays: n (n-max, the fixed-n baseline's n), n0, alpha, sigma, the radii."""

    n: int
    n0: int
    alpha: float
    sigma: float
    radii: Sequence[float]


def simulate(images: List[Image], setup: SimulationSetup, *, seeds: int, rules: dict, seed: int = 0,
             oracle: bool = True) -> dict:
    """{row name: {'samples': mean total, 'accuracy': {r: mean}, 'at_nmax': mean images at n_max}} over `seeds`
    path sets; rules maps names to SequentialRules (each with n_max = setup.n)."""
    n, n0, alpha, sigma, radii = setup.n, setup.n0, setup.alpha, setup.sigma, setup.radii
    p = np.array([im.p for im in images])
    correct = np.array([im.correct for im in images])
    if any(rule.n_max != n for rule in rules.values()):
        raise ValueError("every rule must have n_max = n (the fixed-n baseline's n)")
    rng = np.random.default_rng(seed)
    names = [f"fixed-n n={n}", *rules]
    acc = {name: {r: [] for r in radii} for name in names}
    samples = {name: [] for name in rules}
    at_max = {name: [] for name in rules}
    for _ in range(seeds):
        cuts, segments = shared_paths(p, rules.values(), n, rng)
        rad = radius_from_lower(lower_confidence_bounds(segments.sum(axis=1), n, alpha), sigma)
        for r in radii:
            acc[names[0]][r].append(accuracy(rad, correct, r))
        for name, rule in rules.items():
            rad, used = simulate_sequential(p, rule, None, votes=chunk_votes(cuts, segments, rule))
            samples[name].append(int(used.sum()) + len(p) * n0)
            at_max[name].append(int((used >= n).sum()))
            for r in radii:
                acc[name][r].append(accuracy(rad, correct, r))
    mean_acc = {name: {r: float(np.mean(v)) for r, v in acc[name].items()} for name in names}
    fixed = {"samples": len(p) * (n0 + n), "accuracy": mean_acc[names[0]], "at_nmax": len(p)}
    out = {names[0]: fixed}
    for name in rules:
        out[name] = {"samples": float(np.mean(samples[name])), "accuracy": mean_acc[name],
                     "at_nmax": float(np.mean(at_max[name]))}
    if oracle:
        used = oracle_samples(p, n, alpha, sigma, radii)
        out["oracle (true pA known; a ceiling, not a rule)"] = {
            "samples": float(used.sum()) + len(p) * n0, "accuracy": dict(fixed["accuracy"]),
            "at_nmax": float((used >= n).sum())}
    return out

"""Result rows replayed as Binomial vote paths (no model): each image's vote rate from its row, and the
simulated table of fixed-n CERTIFY against sequential rules on the same paths. Not a study: the core the
sequential studies share (moved here from the engine, which never used it); and the table's plans
(fixed-n, `all`, the pilot plan, the race) on the same paths (`simulate_plans`).

An image's vote rate p for its selected class comes from its row: a sequential row carries the
selected class's estimation votes (`top_votes`) and the samples drawn, so p is Jeffreys' estimate
(top_votes + 1/2) / (samples - n0 + 1), never exactly 1: an image that stopped early with every vote
for its class would otherwise replay as certain at any n-max. A fixed-n row only prints a radius,
so the nA whose radius prints the same is found (`recover_votes`). Paths of i.i.d. votes with that
p then run through fixed-n CERTIFY and through sequential rules (engine/runs/simulation.py), all on
the SAME paths, so differences are paired. It assumes the selection picks the same class and that
votes are i.i.d. given p.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
from scipy.stats import norm

from diffsmooth.engine.certify.cohen import lower_confidence_bounds
from diffsmooth.engine.certify.sequential import radius_from_lower
from diffsmooth.engine.runs.results import format_radius
from diffsmooth.engine.runs.simulation import chunk_votes, shared_paths, simulate_sequential
from diffsmooth.engine.table.defaults import PILOT_IMAGES, RACE_REACH_SIGMAS
from diffsmooth.engine.table.planning import assign_radii, pilot_indices
from diffsmooth.engine.table.race import initial_radii, prefix, tolerance_images
from diffsmooth.engine.table.race_sim import RaceRule, SimulatedSigma, race_samples


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


@dataclass(frozen=True)
class PlanKnobs:
    """What a study varies in the simulated plans (simulate_plans): the race's first radii, auto's pilot."""

    reach: float = RACE_REACH_SIGMAS    # the first radii reach r <= reach x sigma (race.initial_radii)
    first_smallest: bool = True         # ... and include the table's smallest radius
    pilot: int = PILOT_IMAGES           # auto's pilot images


def simulate_plans(rates: Dict[float, np.ndarray], correct: Dict[float, np.ndarray], rule: RaceRule, n0: int,
                   tolerance_points: float, rng, knobs: PlanKnobs = PlanKnobs()) -> dict:
    """One seed of fixed-n, `all`, the pilot plan (`auto`, the previous default: `knobs.pilot` images settle every
    radius, the rest what engine/table/planning.py assigns) and the race, all on the same paths: {plan: {'samples'
    (n0 included), 'cells' (%), 'by_sigma': {sigma: {why: samples}}}}. `correct`: the selected class is the label;
    `rule`: each SimulatedSigma's (fixed-n never stops)."""
    radii, alpha, n_max = rule.radii, rule.alpha, rule.n_max
    sigmas = sorted(rates)
    images = len(rates[sigmas[0]])
    sims = {s: SimulatedSigma(s, rates[s], correct[s], rule, rng, initial_radii(radii, s, knobs.reach, knobs.first_smallest))
            for s in sigmas}
    in_pilot = np.isin(np.arange(images), pilot_indices(list(range(images)), knobs.pilot))
    out = {plan: {"samples": 0.0, "cells": np.zeros(len(radii)), "by_sigma": {}} for plan in ("fixed", "all", "auto")}

    def add(plan, sigma, radius, by_reason, settles=None):
        """Adds a sigma's samples and lifts the plan's cells where this sigma counts (`settles`: radii)."""
        entry = out[plan]
        entry["samples"] += sum(by_reason.values())
        entry["by_sigma"][sigma] = by_reason
        certified = sims[sigma].correct & (radius > 0)                  # radius 0: an abstention
        counts = [100 * np.mean(certified & (radius >= r)) if settles is None or r in settles else 0.0
                  for r in sims[sigma].radii]
        entry["cells"] = np.maximum(entry["cells"], counts)

    pilot_counts = {}
    for s in sigmas:
        sim = sims[s]
        fixed = radius_from_lower(lower_confidence_bounds(sim.segments.sum(axis=1), n_max, alpha), s)
        add("fixed", s, fixed, {"n-max": float(images * (n0 + n_max))})
        full = sim.run(sim.radii)
        add("all", s, full[0], samples_by_reason(sim.rule, sim.radii, full[0], full[1], n0))
        pilot_counts[s] = {r: int(np.sum(sim.correct[in_pilot] & (full[0][in_pilot] > 0) & (full[0][in_pilot] >= r)))
                           for r in sim.radii}
    assigned = assign_radii(pilot_counts, int(in_pilot.sum()))
    for s in sigmas:
        sim, settled = sims[s], tuple(assigned[s])
        full = sim.run(sim.radii)
        by = samples_by_reason(sim.rule, sim.radii, full[0][in_pilot], full[1][in_pilot], n0)
        radius = full[0]
        if settled:
            main = sim.run(settled)
            radius = np.where(in_pilot, full[0], main[0])
            more = samples_by_reason(sim.rule, settled, main[0][~in_pilot], main[1][~in_pilot], n0)
            by = {k: by[k] + more[k] for k in by}
        add("auto", s, radius, by, settles=settled)
    race = simulate_race(sims, tolerance_images(tolerance_points, images), n0)
    out["race"] = {"samples": sum(race.samples.values()) + len(sigmas) * images * n0,
                   "cells": 100 * race.cells / images, "extensions": race.extensions,
                   "by_extension": race.by_extension,
                   "by_sigma": {s: dict(race.first[s], **{"extended": race.extended[s]}) for s in sigmas}}
    return out


STOP_REASONS = ("certified", "ruled out", "n-max", "wrong class")


def stop_reasons(rule, settled: Sequence[float], radius: np.ndarray, used: np.ndarray) -> np.ndarray:
    """Why each image's run stopped: 'certified' (every radius it settles), 'n-max', 'wrong class' (after
    the selection, no estimation sample: the wrong-class stop), else 'ruled out' (its upper bound or the
    futility stop gave up on a radius)."""
    certified = radius >= max(settled)
    if max(settled) == 0:
        certified = radius > 0
    return np.where(certified, "certified", np.where(used >= rule.n_max, "n-max",
                                                     np.where(used == 0, "wrong class", "ruled out")))


def samples_by_reason(rule, settled: Sequence[float], radius, used, n0: int) -> Dict[str, float]:
    """Samples (n0 included) of a run's images, by why each stopped."""
    reasons = stop_reasons(rule, settled, np.asarray(radius), np.asarray(used))
    return {reason: float(np.sum(np.asarray(used)[reasons == reason] + n0)) for reason in STOP_REASONS}


@dataclass(frozen=True)
class RaceOutcome:
    samples: Dict[float, float]      # per sigma: first runs' estimation samples, extensions' n0 + estimation samples
    cells: np.ndarray                # certified images per radius
    extensions: int                  # extension runs the race asked for
    first: Dict[float, Dict[str, float]]      # per sigma: the first runs' samples (n0 included) by why they stopped
    extended: Dict[float, float]              # per sigma: the extensions' samples (n0 included)
    by_extension: Dict[Tuple[float, float, str], Tuple[int, float]] = None   # (sigma, radius, role): images, samples


def simulate_race(sims: Dict[float, SimulatedSigma], tolerance: int, n0: int, continued: bool = True,
                  decide: bool = True) -> RaceOutcome:
    """The engine's race (race_sim.race_samples) with each extension's bookkeeping: an extension at radius k goes on
    from where each image's row stopped to the look that decides k (`decide`). With `decide` off it settles every
    radius up to max(k, the image's largest), and with `continued` off too it reruns the image from its first
    sample (n0 selection samples included), with the same rows."""
    order = sorted(sims)
    initial = {s: sims[s].samples() for s in order}
    samples = dict(initial)
    first = {}
    for s in order:
        radius, used, *_ = sims[s].run(sims[s].first)
        first[s] = samples_by_reason(sims[s].rule, sims[s].first, radius, used, n0)
    largest = {s: np.full(len(sims[s].correct), sims[s].radii.index(max(sims[s].first))) for s in order}
    by_extension: Dict[Tuple[float, float, str], Tuple[int, float]] = {}
    asked = []

    def extend(ext) -> None:
        sim = sims[ext.contender]
        images = np.asarray(ext.images, dtype=np.int64)
        before = sim.samples()
        if not (continued or decide):   # a rerun from the first sample draws n0 and the earlier samples again
            before -= float(sim.latest["used"][images].sum()) + n0 * len(images)
        if decide:
            sim.decide(images, ext.k)
        else:                           # a rerun never settles less than the row it replaces
            targets = np.maximum(ext.k, largest[ext.contender][images])
            for top in np.unique(targets):
                sim.settle(images[targets == top], prefix(sim.radii, int(top)))
            largest[ext.contender][images] = targets
        spent = sim.samples() - before
        samples[ext.contender] += spent
        key = (ext.contender, sim.radii[ext.k], ext.role)
        count, earlier = by_extension.get(key, (0, 0.0))
        by_extension[key] = (count + len(ext.images), earlier + spent)
        asked.append(ext)

    race_samples(sims, tolerance, extend)
    rows = {s: sims[s].rows() for s in order}
    cells = np.array([max(int((rows[s].correct & (rows[s].radius >= r)).sum()) for s in order)
                      for r in sims[order[0]].radii])
    extended = {s: samples[s] - initial[s] for s in order}
    return RaceOutcome(samples, cells, len(asked), first, extended, by_extension)

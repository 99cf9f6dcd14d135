"""SIMULATED: the race's two kinds of extension on the same paths: settling every radius up to the one
asked (the race's first extensions, and today's for rows without a state) and deciding only the radius
asked (today's, engine/table/race_build.py).

Settling every radius up to r (max(r, the image's largest settled radius)) first certifies each smaller
radius: a contender showing that it loses at r / sigma = 3.5 pays for its images' certificates at 3.
`all`'s fate at radius k is known sooner: at the first look where the running lower bound reaches
Phi(r_k / sigma) (certified, if `all` is still running), the running upper bound falls below it (never
certified: the running lower bound is clamped to the running upper one), or `all` stops. Here each
image's state is its position (a look) on its vote path, read with the running bounds at every look;
both kinds replay engine/table/race.py's `next_extension` on the same paths with the same statuses, and
`all`'s cells are checked against the engine's rule (race_sim mirrors the table itself).

    python -m studies.decide_study --rows DIR --selected FILE [--seeds 20] [--images 500]
        [--rates beta-mixture] [--out FILE.md]
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Optional, Sequence

import click
import numpy as np
from scipy.stats import beta

from diffsmooth.engine.runs.simulation import chunk_votes
from diffsmooth.engine.table.defaults import TOLERANCE_POINTS
from diffsmooth.engine.table.race import CellStatus, initial_radii, next_extension, tolerance_images
from diffsmooth.engine.table.race_sim import RaceRule, SimulatedSigma
from studies.race_study import RATE_MODELS, load_selected, rates_from, seed_rates, tiled

NEVER = np.iinfo(np.int64).max
PLANS = ("settle the radii up to the one asked", "decide the radius asked")


class PathLooks:
    """One sigma's vote paths read at every look of `all`'s rule (look_decision's bounds and stops): when
    `all` stops, and when its fate at each radius is known (`decided`)."""

    def __init__(self, sim: SimulatedSigma):
        rule = self.rule = sim.rule
        self.correct = sim.correct
        self.looks = np.asarray(rule.looks())
        self.votes = np.cumsum(chunk_votes(sim.cuts, sim.segments, rule), axis=1).astype(np.float64)
        images, looks = self.votes.shape
        thresholds = np.asarray(rule.thresholds)
        lower, upper = np.zeros((images, looks)), np.ones((images, looks))
        running_lower, running_upper = np.zeros(images), np.ones(images)
        self.stop = np.full(images, looks - 1)
        stopped = np.zeros(images, bool)
        for j, trials in enumerate(self.looks):
            trials = np.full(images, float(trials))
            lo, hi = rule.bounds(self.votes[:, j], trials, j)
            running_upper = np.minimum(running_upper, hi)
            running_lower = np.minimum(np.maximum(running_lower, lo), running_upper)     # the rule's clamp
            lower[:, j], upper[:, j] = running_lower, running_upper
            certified = (running_lower[:, None] > 0.5) & (running_lower[:, None] >= thresholds)
            done = certified.all(axis=1)
            pending = np.argmin(certified, axis=1)
            stop = done | (running_upper < thresholds[pending]) | (trials >= rule.n_max)
            if rule.futility is not None:
                stop |= ~done & rule.futile(self.votes[:, j], trials, pending)
            self.stop[stop & ~stopped] = j
            stopped |= stop
        certified = (lower[:, :, None] > 0.5) & (lower[:, :, None] >= thresholds)
        below = upper[:, :, None] < thresholds
        self.first_certified = np.where(certified.any(axis=1), certified.argmax(axis=1), NEVER)
        first_below = np.where(below.any(axis=1), below.argmax(axis=1), NEVER)
        self.all_certifies = self.first_certified <= self.stop[:, None]              # images x radii
        self.decided = np.minimum(np.minimum(self.first_certified, first_below), self.stop[:, None])

    def samples(self, position: np.ndarray) -> float:
        """Estimation samples of images at look `position` (-1: not run, the wrong-class stop)."""
        return float(np.where(position >= 0, self.looks[np.maximum(position, 0)], 0).sum())


def position_status(rule, state, k: int) -> CellStatus:
    """What images at their positions know about radius index k (next_extension's `status_of`)."""
    paths, position = state
    ran = position >= 0
    certified = paths.correct & ran & paths.all_certifies[:, k] & (paths.first_certified[:, k] <= position)
    known = ran & (paths.decided[:, k] <= position)
    undecided = paths.correct & ~certified & ~known & (rule.needed[k] <= rule.n_max)
    at = np.maximum(position, 0)
    votes = np.where(ran, paths.votes[np.arange(len(position)), at], 0.0)
    drawn = np.where(ran, paths.looks[at], 0)
    need = min(1.0, rule.needed[k] / rule.n_max)
    chance = beta.sf(need, votes + 0.5, np.maximum(drawn - votes, 0) + 0.5)
    return CellStatus(certified, undecided, chance)


def race(paths: Dict[float, PathLooks], radii: Sequence[float], tolerance: int, decide_asked: bool) -> dict:
    """The race on positions: first runs settle initial_radii; an extension at radius k moves each image
    to where its radii up to max(k, its largest settled) are all decided, or (`decide_asked`) to where
    radius k is."""
    order = sorted(paths)
    rules = {s: paths[s].rule for s in order}
    position, largest = {}, {}
    for s in order:
        first = [list(radii).index(r) for r in initial_radii(radii, s)]
        position[s] = np.where(paths[s].correct, paths[s].decided[:, first].max(axis=1), -1)
        largest[s] = np.full(len(position[s]), max(first))
    history = []
    while True:
        ext = next_extension(rules, {s: (paths[s], position[s]) for s in order}, tolerance, order, history,
                             position_status)
        if ext is None:
            break
        p = paths[ext.contender]
        for i in ext.images:
            if decide_asked:
                target = p.decided[i, ext.k]
            else:
                largest[ext.contender][i] = max(ext.k, largest[ext.contender][i])
                target = p.decided[i, :largest[ext.contender][i] + 1].max()
            position[ext.contender][i] = max(position[ext.contender][i], target)
        history.append((ext.contender, ext.k))
    cells = [max(int(position_status(rules[s], (paths[s], position[s]), k).certified.sum()) for s in order)
             for k in range(len(radii))]
    return {"samples": sum(paths[s].samples(position[s]) for s in order), "cells": cells,
            "extensions": len(history)}


def one_seed(rates, correct, radii, alpha, n_max, n0, tolerance, rng) -> dict:
    order = sorted(rates)
    images = len(rates[order[0]])
    sims = {s: SimulatedSigma(s, rates[s], correct[s], RaceRule(radii, alpha, n_max, True), rng, initial_radii(radii, s))
            for s in order}
    paths = {s: PathLooks(sims[s]) for s in order}
    all_cells = [max(int((paths[s].correct & paths[s].all_certifies[:, k]).sum()) for s in order)
                 for k in range(len(radii))]
    engine_cells = []                    # `all` as race_sim runs it (the engine's rule): the same cells?
    for r in radii:
        engine_cells.append(max(int((sims[s].correct & (sims[s].run(tuple(radii))[0] > 0)
                                     & (sims[s].run(tuple(radii))[0] >= r)).sum()) for s in order))
    out = {"fixed": float(len(order) * images * (n0 + n_max)), "all_cells": all_cells,
           "reading_differs": int(np.abs(np.subtract(all_cells, engine_cells)).max())}
    for plan, decide in zip(PLANS, (False, True)):
        run = race(paths, radii, tolerance, decide)
        run["samples"] += len(order) * images * n0
        run["below_all"] = int(max(a - c for a, c in zip(all_cells, run["cells"])))
        out[plan] = run
    return out


def study(folder: Path, selected: Optional[dict], seeds: int, rates: str, images: Optional[int],
          n_max: int, tolerance_points: float) -> dict:
    data = tiled(rates_from(folder, selected), images)
    spec = data["spec"]
    radii = tuple(sorted(spec["radii"]))
    rng = np.random.default_rng(0)
    count = len(next(iter(data["rates"].values())))
    tolerance = tolerance_images(tolerance_points, count)
    runs = [one_seed(seed_rates(data, rates, rng), data["correct"], radii, spec["alpha"], n_max, spec["n0"],
                     tolerance, rng) for _ in range(seeds)]
    doc = {"line": data["line"], "images": count, "seeds": seeds, "rates": rates, "n_max": n_max,
           "tolerance_images": tolerance, "radii": list(radii),
           "reading_differs_any_cell": any(r["reading_differs"] for r in runs), "plans": {}}
    fixed = runs[0]["fixed"]
    for plan in PLANS:
        samples = np.array([r[plan]["samples"] for r in runs])
        doc["plans"][plan] = {"samples": float(samples.mean()), "fewer": fixed / float(samples.mean()),
                              "worst_seed": float((fixed / samples).min()),
                              "below_all_worst": max(r[plan]["below_all"] for r in runs),
                              "extensions": float(np.mean([r[plan]["extensions"] for r in runs]))}
    paired = np.array([r[PLANS[1]]["samples"] / r[PLANS[0]]["samples"] for r in runs])
    doc["paired_ratio"] = {"mean": float(paired.mean()), "min": float(paired.min()), "max": float(paired.max())}
    return doc


def markdown(doc: dict) -> str:
    lines = [f"## SIMULATED: {doc['line']}, {doc['images']} images, n-max {doc['n_max']:,}, {doc['seeds']} seeds on "
             f"paired paths, rates `{doc['rates']}`, tolerance {doc['tolerance_images']} image(s), the wrong-class stop",
             "", "| extensions settle | samples (mean) | fewer than fixed-n (worst seed) | cells below `all`'s, worst "
             "(images) | extensions |", "|---|---|---|---|---|"]
    for plan in PLANS:
        p = doc["plans"][plan]
        lines.append(f"| {plan} | {p['samples']:,.0f} | {p['fewer']:.1f}x ({p['worst_seed']:.1f}x) | "
                     f"{p['below_all_worst']} | {p['extensions']:.1f} |")
    r = doc["paired_ratio"]
    lines += ["", f"Samples deciding only the radius asked / settling the radii up to it, per seed: mean {r['mean']:.3f} "
              f"(from {r['min']:.3f} to {r['max']:.3f}). `all`'s cells read look by look "
              + ("differ from the engine rule's in some seed." if doc["reading_differs_any_cell"]
                 else "equal the engine rule's in every seed.")]
    return "\n".join(lines) + "\n"


@click.command()
@click.option("--rows", "folder", type=click.Path(exists=True, file_okay=False), required=True,
              help="A table folder: its first line's rows give each image's vote rate per sigma.")
@click.option("--selected", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Each image's selected class (studies/selected_classes.py) for rows that do not record it.")
@click.option("--seeds", type=click.IntRange(1), default=20, show_default=True)
@click.option("--rates", type=click.Choice(RATE_MODELS), default="beta-mixture", show_default=True)
@click.option("--images", type=click.IntRange(1), default=None, help="Repeat the rows' images up to this many.")
@click.option("--n-max", type=click.IntRange(1), default=100_000, show_default=True)
@click.option("--tolerance", type=click.FloatRange(0, 100), default=TOLERANCE_POINTS, show_default=True)
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="Write the markdown (and FILE.json) here.")
def main(folder, selected, seeds, rates, images, n_max, tolerance, out):
    """Prints the study as markdown."""
    doc = study(Path(folder), load_selected(selected), seeds, rates, images, n_max, tolerance)
    text = markdown(doc)
    click.echo(text)
    if out:
        Path(out).write_text(text)
        Path(out).with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()

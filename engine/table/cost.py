"""The cost of a table before it is spent: samples from the pilot's rows (each image's vote rate drawn
from its posterior) through the sequential simulator (engine/runs/simulation.py), seconds at the
rate a timing probe of full batches measured on this machine (engine/table/build.py: probe_rate)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from diffsmooth.engine.certify.sequential import SequentialRule
from diffsmooth.engine.runs.simulation import simulate_sequential
from diffsmooth.engine.table.race import initial_radii, tolerance_images
from diffsmooth.engine.table.race_sim import RaceRule, SimulatedSigma, race_samples

SEEDS = 20
ABSTAIN_RATE = 0.45                 # a row that drew no estimation sample (stopped at n0)


@dataclass(frozen=True)
class Sampling:
    """How each run of a table draws: n0 selection samples, then the sequential rule at alpha up to n-max."""

    n0: int
    alpha: float
    n_max: int


@dataclass(frozen=True)
class RunCost:
    """One sigma run of one line: predicted samples and seconds of its main phase."""

    line: str
    sigma: float
    images: int
    samples: float
    seconds: float


def vote_counts(pilot_files_rows: Sequence[List[dict]], n0: int) -> Tuple[np.ndarray, np.ndarray]:
    """([configurations, images] top-class votes, estimation samples drawn) of the pilot's sequential rows."""
    top = np.array([[int(row["top_votes"]) for row in rows] for rows in pilot_files_rows])
    drawn = np.array([[int(row["samples"]) - n0 for row in rows] for rows in pilot_files_rows])
    return top, drawn


def posterior_rates(top: np.ndarray, drawn: np.ndarray, rng) -> np.ndarray:
    """One draw of each image's vote rate from its Jeffreys posterior Beta(top + 1/2, drawn - top + 1/2)
    (ABSTAIN_RATE where nothing was drawn). A point estimate read at a data-dependent stop makes the
    images look surer than they are, so the rule is predicted to stop too soon: on the RS demo's
    pilot the point estimate predicted the main phase's samples 21% low, these draws 12% low
    (simulated against the measured main phase, bench/results/table_demo_rs_500x10000)."""
    rates = rng.beta(top + 0.5, np.maximum(drawn - top, 0) + 0.5)
    return np.where(drawn > 0, rates, ABSTAIN_RATE)


def expected_samples(rates, rule: SequentialRule, n0: int, seeds: int = SEEDS, seed: int = 0) -> float:
    """Mean samples one image draws under `rule` (n0 included; a sweep draws for its slowest
    configuration), over the pilot's images as a sample of the rest and `seeds` simulated paths each.
    `rates`: [configurations, images] rates, or a function rng -> rates drawn anew for each seed."""
    rng = np.random.default_rng(seed)
    per_seed = []
    for _ in range(seeds):
        drawn = rates(rng) if callable(rates) else rates
        used = np.stack([simulate_sequential(p, rule, rng)[1] for p in np.atleast_2d(drawn)])
        per_seed.append(float(used.max(axis=0).mean()))
    return n0 + float(np.mean(per_seed))


def predict_run(line: str, sigma: float, pilot_rows: Sequence[List[dict]], radii: Sequence[float], main_images: int,
                sampling: Sampling, samples_per_second: float, schedule_radii: Optional[Sequence[float]] = None) -> RunCost:
    """The main phase of one sigma run: `main_images` images settling `radii` with the default rule
    (its looks placed for `schedule_radii`, the table's radii)."""
    n0, alpha, n_max = sampling.n0, sampling.alpha, sampling.n_max
    if not radii or main_images == 0:
        return RunCost(line, sigma, main_images, 0.0, 0.0)
    rule = SequentialRule(tuple(radii), sigma, alpha, n_max,
                          schedule_radii=tuple(schedule_radii) if schedule_radii else None)
    top, drawn = vote_counts(pilot_rows, n0)
    per_image = expected_samples(lambda rng: posterior_rates(top, drawn, rng), rule, n0)
    samples = per_image * main_images
    return RunCost(line, sigma, main_images, samples, samples / max(samples_per_second, 1e-9))


RACE_SEEDS = 3


def right_class(row: dict) -> bool:
    """The row's selected class is its label (the race's wrong-class stop runs only these images): its
    `selected` column, else (rows written before it) its prediction, an abstaining row counted as right."""
    if row.get("selected") not in (None, ""):
        return int(row["selected"]) == int(row["label"])
    return int(row["correct"]) == 1 or int(row["predict"]) < 0


def predict_race(pilot_rows: Dict[float, List[dict]], radii: Sequence[float], images: int, sampling: Sampling,
                 tolerance_points: float, seeds: int = RACE_SEEDS, seed: int = 0) -> Dict[float, float]:
    """Mean samples per sigma of the whole race (first runs and extensions, n0 included) on `images`
    images: the pilot's images tiled to `images`, each copy's vote rate drawn anew from its posterior,
    through the race's own decisions on simulated paths (engine/table/race_sim.py). A sweep is
    predicted from its first configuration's rows."""
    n0, rule = sampling.n0, RaceRule(radii, sampling.alpha, sampling.n_max)
    rng = np.random.default_rng(seed)
    sigmas = sorted(pilot_rows)
    top, drawn, correct = {}, {}, {}
    for sigma in sigmas:
        (top[sigma],), (drawn[sigma],) = vote_counts([pilot_rows[sigma]], n0)
        correct[sigma] = np.array([right_class(r) for r in pilot_rows[sigma]])
    pick = np.arange(images) % len(pilot_rows[sigmas[0]])
    totals: Dict[float, List[float]] = {s: [] for s in sigmas}
    for _ in range(seeds):
        sims = {s: SimulatedSigma(s, posterior_rates(top[s][pick], drawn[s][pick], rng), correct[s][pick], rule, rng,
                                  initial_radii(radii, s)) for s in sigmas}
        samples = race_samples(sims, tolerance_images(tolerance_points, images))
        for s in sigmas:
            totals[s].append(samples[s] + images * n0)
    return {s: float(np.mean(v)) for s, v in totals.items()}


def on_ranks(costs: dict, ranks: int, images: int, batch: int) -> str:
    """What the predicted cost (cost.json) means on `ranks` ranks, in one line (estimated). Every run splits
    each image's samples over the ranks (certify/blocks.py) and a rank computes ahead of its looks, so a run
    takes 1/ranks of its time plus, per rank, about one batch of samples computed past where its images stop:
    a run of k images drawing S samples each scales as (1 / ranks + batch / (k * S)) of one process's time.
    Each rank's warm-up (model builds, compiles) does not divide."""
    seconds = (costs.get("predicted") or {}).get("seconds")
    if seconds is None:
        return f"table: on {ranks} ranks: no estimate without a measured rate (a pilot times it)"
    runs = [r for r in (costs.get("runs") or {}).values() if r.get("seconds") and r.get("samples")]
    shared = sum(r["seconds"] * rank_share(ranks, batch, r["samples"]) for r in runs)
    shared += seconds - sum(r["seconds"] for r in runs)     # anything not in a run's estimate: as if it split evenly
    return (f"table: on {ranks} ranks (estimated): about {shared / 60:.1f} min of compute for what one process does "
            f"in {seconds / 60:.1f} min ({seconds / max(shared, 1e-9):.1f}x; every image's samples split over the "
            f"ranks, plus about one batch of {batch} samples per rank and run computed past where its {images} images "
            f"stop), plus each rank's own warm-up; summary.json's ranks.phases measures each pass's shares")


def rank_share(ranks: int, batch: int, samples: float) -> float:
    """The share of one process's time a run drawing `samples` samples (all its images) takes on `ranks` ranks
    (estimated): its samples split evenly, plus one batch per rank of samples past its images' stops."""
    if ranks <= 1:
        return 1.0
    return min(1.0, 1.0 / ranks + batch / max(samples, 1.0))

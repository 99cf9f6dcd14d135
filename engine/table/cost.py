"""The cost of a table before it is spent: samples from the pilot's rows through the sequential
simulator (engine/runs/simulation.py), seconds at the rate a timing probe of full batches measured on
this machine (engine/table/build.py: probe_rate)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence

import numpy as np

from diffsmooth.engine.certify.sequential import SequentialRule
from diffsmooth.engine.runs.simulation import image_from_row, simulate_sequential

SEEDS = 20


@dataclass(frozen=True)
class RunCost:
    """One sigma run of one line: predicted samples and seconds of its main phase."""

    line: str
    sigma: float
    images: int
    samples: float
    seconds: float


def vote_rates(pilot_files_rows: Sequence[List[dict]], n0: int, alpha: float, sigma: float, n_max: int) -> np.ndarray:
    """[configurations, images] vote rates of the pilot's sequential rows (rows in index order)."""
    return np.array([[image_from_row(row, n_max, n0, alpha, sigma, 0.45).p for row in rows] for rows in pilot_files_rows])


def expected_samples(rates: np.ndarray, rule: SequentialRule, n0: int, seeds: int = SEEDS, seed: int = 0) -> float:
    """Mean samples one image draws under `rule` (n0 included; a sweep draws for its slowest
    configuration), over the pilot's images as a sample of the rest and `seeds` simulated paths each."""
    rng = np.random.default_rng(seed)
    per_seed = []
    for _ in range(seeds):
        used = np.stack([simulate_sequential(p, rule, rng)[1] for p in np.atleast_2d(rates)])
        per_seed.append(float(used.max(axis=0).mean()))
    return n0 + float(np.mean(per_seed))


def predict_run(line: str, sigma: float, pilot_rows: Sequence[List[dict]], radii: Sequence[float], main_images: int,
                n0: int, alpha: float, n_max: int, samples_per_second: float) -> RunCost:
    """The main phase of one sigma run: `main_images` images settling `radii` with the default rule."""
    if not radii or main_images == 0:
        return RunCost(line, sigma, main_images, 0.0, 0.0)
    rule = SequentialRule(tuple(radii), sigma, alpha, n_max)
    per_image = expected_samples(vote_rates(pilot_rows, n0, alpha, sigma, n_max), rule, n0)
    samples = per_image * main_images
    return RunCost(line, sigma, main_images, samples, samples / max(samples_per_second, 1e-9))

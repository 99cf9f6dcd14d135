"""SIMULATED: the reach-cp rule (the default) against the previous default (split CP, plain pace
stop), fixed-n and the oracle, per radius, on the project's row sets; and the fewest samples at
which an image with every vote certifies r / sigma = 2, 2.5, 3, 3.5 under each rule.

    python -m studies.sequential_reach --rows ROWS [--sigma S --radii R] --n-max 10000,100000 [--seeds 20]
    python -m studies.sequential_reach --unanimous

A sequential row set (with `top_votes`) brings its own sigma and radii from its settings file. Every
rule runs on the same vote paths as fixed-n (engine/runs/simulation.py), so the changes are paired.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Sequence

import click
import numpy as np
from scipy.stats import norm

from diffsmooth.engine.certify.sequential import SequentialRule, confidence_bounds, run_rule
from diffsmooth.engine.runs.request import parse_radii
from studies.replay import SimulationSetup, load_images, simulate

PREVIOUS = dict(bound="split-cp", futility_rule="pace")


def rules(radii: Sequence[float], sigma: float, alpha: float, n_max: int) -> dict:
    """The previous default and the default, at n_max."""
    return {"previous default (split-cp, pace)": SequentialRule(tuple(radii), sigma, alpha, n_max, **PREVIOUS),
            "default (reach-cp, pace-floor)": SequentialRule(tuple(radii), sigma, alpha, n_max)}


def per_radius_table(result: dict, radii: Sequence[float], header: str) -> str:
    """Samples against fixed-n and the certified-accuracy change (points) at each radius."""
    base = next(iter(result.values()))
    lines = [header, "", "| rule (SIMULATED) | fewer samples than fixed-n | "
             + " | ".join(f"r={r:g}" for r in radii) + " |", "|" + "---|" * (len(radii) + 2)]
    for name, row in result.items():
        cells = " | ".join(f"{100 * (row['accuracy'][r] - base['accuracy'][r]):+.2f}" if row is not base
                           else f"{row['accuracy'][r]:.3f}" for r in radii)
        lines.append(f"| {name} | {base['samples'] / row['samples']:.2f}x | {cells} |")
    return "\n".join(lines)


def unanimous_samples(z: float, n_max: int, alpha: float, **options) -> int:
    """Estimation samples a rule uses on a path with every vote for cA, radius z sigma (sigma 1)."""
    rule = SequentialRule((z,), 1.0, alpha, n_max, **options)
    lower, used = run_rule(rule, np.array([rule.chunks()]))
    return int(used[0]) if lower[0] >= norm.cdf(z) else -1


def mixture_fewest(z: float, alpha: float, most: int = 200_000) -> int:
    """The fewest samples at which the mixture CS (valid at every count) certifies z with every vote."""
    t = np.arange(1, most + 1, dtype=np.float64)
    reached = np.flatnonzero(confidence_bounds(t, t, alpha)[0] >= norm.cdf(z))
    return int(t[reached[0]]) if len(reached) else -1


def unanimous_table(alpha: float, n_maxes: Sequence[int], zs=(2.0, 2.5, 3.0, 3.5)) -> str:
    """The fewest samples ln alpha / ln Phi(z) and what each rule uses (x the fewest)."""
    lines = [f"Samples an image with every vote needs to certify r / sigma = z (alpha {alpha}; EXACT, no randomness)",
             "", "| n-max | z | fewest (CP at alpha) | previous default | default (reach-cp) | mixture CS at these looks "
             "| mixture CS, any count |", "|---|---|---|---|---|---|---|"]
    for n_max in n_maxes:
        for z in zs:
            fewest = math.ceil(math.log(alpha) / math.log(norm.cdf(z)))
            cells = []
            for options in (PREVIOUS, {}, dict(bound="mixture", futility_rule=None)):
                used = unanimous_samples(z, n_max, alpha, **options)
                cells.append("not within n-max" if used < 0 else f"{used:,} ({used / fewest:.2f}x)")
            anytime = mixture_fewest(z, alpha, n_max)
            cells.append("not within n-max" if anytime < 0 else f"{anytime:,} ({anytime / fewest:.2f}x)")
            lines.append(f"| {n_max:,} | {z:g} | {fewest:,} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def rows_setup(rows: str, sigma, radii):
    """(sigma, radii) of a row set: given, or from a sequential run's settings file."""
    settings = Path(rows + ".settings.json")
    if (sigma is None or radii is None) and settings.exists():
        recorded = json.loads(settings.read_text())
        sigma = recorded["sigma"] if sigma is None else sigma
        radii = [r for r in recorded["radii"] if r > 0] if radii is None else radii
    if sigma is None or radii is None:
        raise click.UsageError("give --sigma and --radii (the rows have no settings file)")
    return float(sigma), sorted(parse_radii(radii) if isinstance(radii, str) else radii)


@click.command()
@click.option("--rows", type=click.Path(exists=True, dir_okay=False), default=None)
@click.option("--sigma", type=float, default=None)
@click.option("--radii", default=None)
@click.option("--n-max", "n_maxes", default="10000,100000", show_default=True)
@click.option("--alpha", type=float, default=0.001, show_default=True)
@click.option("--seeds", type=int, default=20, show_default=True)
@click.option("--unanimous", is_flag=True, help="Print the every-vote table instead.")
def main(rows, sigma, radii, n_maxes, alpha, seeds, unanimous):
    """Prints the SIMULATED per-radius table (markdown), or the every-vote table."""
    n_maxes = [int(n) for n in n_maxes.split(",")]
    if unanimous:
        click.echo(unanimous_table(alpha, n_maxes))
        return
    if rows is None:
        raise click.UsageError("give --rows (or --unanimous)")
    sigma, radii = rows_setup(rows, sigma, radii)
    images = load_images(rows, 10000, alpha, sigma, 0.45)
    for n_max in n_maxes:
        result = simulate(images, SimulationSetup(n=n_max, n0=100, alpha=alpha, sigma=sigma, radii=radii), seeds=seeds,
                          rules=rules(radii, sigma, alpha, n_max))
        header = (f"SIMULATION: {rows} ({len(images)} images), sigma {sigma}, n-max {n_max:,}, alpha {alpha}, "
                  f"{seeds} seeds, paired paths; fixed-n row: certified accuracy, others: change in points")
        click.echo(per_radius_table(result, radii, header) + "\n")


if __name__ == "__main__":
    main()

"""SIMULATED fixed-n vs sequential CERTIFY from measured vote rates (no model, no GPU).

    python -m studies.sequential_sim --rows bench/results/h200-2026-11-26/sequential/fixed.tsv [--n-max 100000]

Each image's vote rate p for its predicted class is recovered from a fixed-n CERTIFY TSV: the
printed radius is sigma * Phi^-1(Clopper-Pearson lower bound of nA out of n) to 3 significant
digits, so the nA whose radius prints the same is found (the middle one when several do);
p = nA / n. Abstained rows (radius 0) get --abstain-p (an assumption: their p is below 1/2).
Then Binomial vote paths with that p (--seeds per image) run through fixed-n CERTIFY at n-max and
through each sequential rule (the engine's own vectorised rule, `run_rule`; no bound is computed
here), next to an oracle that knows p. Every rule and the fixed-n baseline see the SAME paths (a
sequential run's samples are a prefix of a fixed-n run's with the same seed), so the accuracy
differences are paired, not two independent draws. The table shows total samples (incl. n0) and certified
accuracy per radius, means over seeds. It is a model of the measurement, not a measurement: it
assumes the selection step picks the same class as the fixed run and that votes are i.i.d. given p
(at an n-max above the rows' n, p is extrapolated from those rows).
"""

from __future__ import annotations

import csv
from typing import List, Optional, Sequence

import click
import numpy as np

from diffsmooth.engine.certify.sequential import SequentialRule
from diffsmooth.engine.runs.request import parse_radii
from diffsmooth.engine.runs.simulation import chunk_votes, shared_paths, simulate_sequential  # noqa: F401  (re-exported)
from studies.replay import (  # noqa: F401  (the core, re-exported for this CLI's users)
    Image,
    SimulationSetup,
    accuracy,
    load_images,
    oracle_samples,
    recover_votes,
    simulate,
)


def markdown(result: dict, radii: Sequence[float], header: str, label: str = "rule (SIMULATED)") -> str:
    base = next(iter(result.values()))
    lines = [header, "", f"| {label} | samples (total) | fewer | at n-max | "
             + " | ".join(f"r={r:g}" for r in radii) + " | mean diff | worst diff (points) |",
             "|" + "---|" * (len(radii) + 6)]
    for name, row in result.items():
        accs = " | ".join(f"{row['accuracy'][r]:.3f}" for r in radii)
        diffs = [100 * (row["accuracy"][r] - base["accuracy"][r]) for r in radii]
        lines.append(f"| {name} | {row['samples']:,.0f} | {base['samples'] / row['samples']:.2f}x | "
                     f"{row['at_nmax']:.1f} | {accs} | {np.mean(diffs):+.2f} | {min(diffs):+.1f} |")
    return "\n".join(lines)


PACE_MARGINS = (0.1, 0.13, 0.17, 0.21, 0.27)


def standard_rules(n_max: int, radii: Sequence[float], sigma: float, alpha: float,
                   margins: Sequence[float] = PACE_MARGINS) -> dict:
    """The rules compared: the earlier defaults (the mixture with the projection stop at k = 2, split CP
    with it at k = 1.25) and split CP with the pace stop at several margins m and at the default for
    n_max (marked)."""
    default = SequentialRule(tuple(radii), sigma, alpha, n_max)
    rules = {"mixture, projection k=2 (first default)": SequentialRule(
                 tuple(radii), sigma, alpha, n_max, futility=2.0, bound="mixture", futility_rule="projection"),
             "split-cp, projection k=1.25 (previous default)": SequentialRule(
                 tuple(radii), sigma, alpha, n_max, futility=1.25, futility_rule="projection")}
    rules[f"mixture, pace m={default.futility:g}"] = SequentialRule(tuple(radii), sigma, alpha, n_max, bound="mixture")
    for m in sorted({*margins, default.futility}):
        mark = " (default)" if m == default.futility else ""
        rules[f"split-cp, pace m={m:g}{mark}"] = SequentialRule(tuple(radii), sigma, alpha, n_max, futility=m)
    return rules


@click.command()
@click.option("--rows", type=click.Path(exists=True, dir_okay=False), required=True,
              help="A fixed-n CERTIFY TSV (idx label predict radius correct time).")
@click.option("--n", type=int, default=10000, show_default=True, help="The n of that run.")
@click.option("--n-max", type=int, default=None, help="Simulated n-max (fixed-n baseline n) [default: --n].")
@click.option("--n0", type=int, default=100, show_default=True)
@click.option("--alpha", type=float, default=0.001, show_default=True)
@click.option("--sigma", type=float, default=0.5, show_default=True)
@click.option("--radii", default="0.25,0.5,0.75,1.0", show_default=True)
@click.option("--seeds", type=int, default=20, show_default=True, help="Simulated vote paths per image and rule.")
@click.option("--measured", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Optional: a measured sequential TSV (with `samples`) of these images or some of them "
                   "(e.g. an unfinished run): the simulation is restricted to its images and the measured "
                   "rows are printed next to the simulated ones.")
@click.option("--abstain-p", type=float, default=0.45, show_default=True,
              help="Assumed vote rate of rows that abstained (radius 0).")
@click.option("--jitter", type=float, default=0.0, show_default=True,
              help="Robustness check: move each vote rate below 0.9999 by a uniform offset in [-J, J] "
                   "(seeded), a population the defaults were not chosen on.")
def main(rows, n, n_max, n0, alpha, sigma, radii, seeds, abstain_p, measured, jitter):
    """Prints the SIMULATED samples / certified-accuracy table (markdown)."""
    radii = sorted(parse_radii(radii))
    images = jittered(load_images(rows, n, alpha, sigma, abstain_p), jitter)
    n_max = n_max or n
    seq_rows = _read(measured) if measured else None         # read once: the run may still be writing
    if measured:
        done = {int(r["idx"]) for r in seq_rows}
        images = [im for im in images if im.idx in done]
    result = simulate(images, SimulationSetup(n=n_max, n0=n0, alpha=alpha, sigma=sigma, radii=radii), seeds=seeds,
                      rules=standard_rules(n_max, radii, sigma, alpha))
    header = (f"SIMULATION from the vote rates recovered from {rows}{f' +- U({jitter})' if jitter else ''} "
              f"({len(images)} images, rows' n={n}, "
              f"n-max={n_max}, n0={n0}, "
              f"alpha={alpha}, sigma={sigma}, {seeds} seeds, abstained rows p={abstain_p}); means over seeds")
    click.echo(markdown(result, radii, header))
    if measured:
        click.echo("\n" + measured_table(rows, measured, n, n0, radii, n_max, seq_rows))


def jittered(images: List[Image], width: float, seed: int = 1234) -> List[Image]:
    """Each vote rate below 0.9999 moved by U(-width, width), clipped to [0, 1] (unanimous rows stay)."""
    if not width:
        return images
    offsets = np.random.default_rng(seed).uniform(-width, width, len(images))
    return [Image(float(np.clip(im.p + d, 0.0, 1.0)) if im.p < 0.9999 else im.p, im.correct, im.idx)
            for im, d in zip(images, offsets)]


def _read(path) -> List[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle, delimiter="\t"))


def measured_table(fixed_path, seq_path, n: int, n0: int, radii: Sequence[float], n_max: Optional[int] = None,
                   seq_rows: Optional[List[dict]] = None) -> str:
    """The MEASURED rows (fixed-n rows of the sequential file's images, and the sequential rows) in
    the same layout, to check the simulation; n is the fixed rows' n, n_max the sequential run's."""
    seq = seq_rows if seq_rows is not None else _read(seq_path)
    done = {r["idx"] for r in seq}
    fixed = [r for r in _read(fixed_path) if r["idx"] in done]
    n_max = n_max or n
    table = {}
    for name, rows, samples, top in ((f"MEASURED fixed-n n={n}", fixed, len(fixed) * (n0 + n), n),
                                     (f"MEASURED sequential n-max={n_max}", seq, sum(int(r["samples"]) for r in seq),
                                      n_max)):
        radius = np.array([float(r["radius"]) for r in rows])
        correct = np.array([int(r["correct"]) == 1 for r in rows])
        at_max = sum(int(r["samples"]) >= n0 + top for r in rows) if "samples" in rows[0] else len(rows)
        table[name] = {"samples": samples, "at_nmax": at_max,
                       "accuracy": {r: accuracy(radius, correct, r) for r in radii}}
    return markdown(table, radii, f"MEASURED: {fixed_path} and {seq_path}", label="run (MEASURED)")


if __name__ == "__main__":
    main()

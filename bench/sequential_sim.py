"""SIMULATED fixed-n vs sequential CERTIFY from measured vote rates (no model, no GPU).

    python -m diffsmooth.bench.sequential_sim --rows bench/results/h200-2026-11-26/sequential/fixed.tsv

Each image's vote rate p for its predicted class is recovered from a fixed-n CERTIFY TSV: the
printed radius is sigma * Phi^-1(Clopper-Pearson lower bound of nA out of n) to 3 significant
digits, so the nA whose radius prints the same is found (the middle one when several do);
p = nA / n. Abstained rows (radius 0) get --abstain-p (an assumption: their p is below 1/2).
Then Binomial vote paths with that p (--seeds per image) run through fixed-n CERTIFY and through
each sequential stopping rule; the table shows total samples (incl. n0) and certified accuracy
per radius, means over seeds. It is a model of the measurement, not a measurement: it assumes
the selection step picks the same class as the fixed run and that votes are i.i.d. given p.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from typing import List, Optional, Sequence

import click
import numpy as np
from scipy.stats import beta, norm

from diffsmooth.engine.certify.sequential import confidence_bounds, futility_bounds, look_schedule
from diffsmooth.engine.runs.results import format_radius


def recover_votes(radius: float, n: int, alpha: float, sigma: float) -> Optional[int]:
    """The nA (out of n) whose fixed-n CERTIFY radius prints as `radius`; None for radius 0."""
    if radius <= 0:
        return None
    n_a = np.arange(n // 2, n + 1)
    lower = beta.ppf(alpha, n_a, n - n_a + 1)
    radii = sigma * norm.ppf(lower)
    printed = np.array([float(format_radius(r)) if r > 0 else 0.0 for r in radii])
    hits = n_a[printed == float(format_radius(radius))]
    if len(hits):
        return int(hits[len(hits) // 2])
    return int(n_a[np.argmin(np.abs(radii - radius))])


@dataclass(frozen=True)
class Image:
    p: float                 # vote rate of the predicted class
    correct: bool            # the fixed run's prediction was right (accuracy counts only these)


def load_images(path, n: int, alpha: float, sigma: float, abstain_p: float) -> List[Image]:
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t"))
    images = []
    for row in rows:
        n_a = recover_votes(float(row["radius"]), n, alpha, sigma)
        p = abstain_p if n_a is None or int(row["predict"]) < 0 else n_a / n
        images.append(Image(p, int(row["correct"]) == 1 and n_a is not None))
    return images


def simulate_fixed(p: np.ndarray, n: int, alpha: float, sigma: float, rng) -> np.ndarray:
    """Radii of fixed-n CERTIFY (0 = abstain) for vote rates p (any shape)."""
    n_a = rng.binomial(n, p)
    lower = np.where(n_a > 0, beta.ppf(alpha, np.maximum(n_a, 1), n - n_a + 1), 0.0)
    return np.where(lower > 0.5, sigma * norm.ppf(np.clip(lower, 0.5, 1.0)), 0.0)


def simulate_sequential(p: np.ndarray, radii: Sequence[float], sigma: float, alpha: float, n_max: int,
                        chunks: Sequence[int], futility: Optional[float], rng, votes=None):
    """(radii, estimation samples) of the sequential rule, vectorised over vote rates p (1-D).

    The same decisions as SequentialCertificate.add (tests/test_sequential.py compares
    them path by path; `votes`, shape (len(p), len(chunks)), fixes the per-chunk votes): running max / min of the CS, stop when all radii are certified, the next
    threshold is above U_t, the futility projection misses it, or at n_max."""
    thresholds = norm.cdf(np.asarray(sorted(radii)) / sigma)
    m = len(p)
    if votes is None:
        votes = rng.binomial(np.asarray(chunks)[None, :], np.asarray(p, dtype=np.float64)[:, None])
    s = np.zeros(m)
    t = 0
    lower, upper = np.zeros(m), np.ones(m)
    done = np.zeros(m, dtype=bool)
    used = np.zeros(m, dtype=np.int64)
    final_lower = np.zeros(m)
    for j, size in enumerate(chunks):
        live = ~done
        s = s + np.where(live, votes[:, j], 0)
        t += size
        lo, hi = confidence_bounds(s, np.full(m, float(t)), alpha)
        lower, upper = np.where(live, np.maximum(lower, lo), lower), np.where(live, np.minimum(upper, hi), upper)
        certified = (lower[:, None] > 0.5) & (lower[:, None] >= thresholds[None, :])
        all_done = certified.all(axis=1)
        nxt = thresholds[np.argmin(certified, axis=1)]           # smallest uncertified threshold
        stop = all_done | (upper < nxt) | (t >= n_max)
        if futility is not None and t < n_max:
            projected = futility_bounds(s, t, n_max, alpha, futility)
            stop |= ~all_done & (projected < nxt)
        newly = live & stop
        used[newly] = t
        final_lower[newly] = lower[newly]
        done |= stop
        if done.all():
            break
    radius = np.where(final_lower > 0.5, sigma * norm.ppf(np.clip(final_lower, 0.5, 1.0)), 0.0)
    return radius, used


def accuracy(radius: np.ndarray, correct: np.ndarray, r: float) -> float:
    return float(np.mean(correct & (radius >= r)))


def simulate(images: List[Image], *, n: int, n0: int, alpha: float, sigma: float, radii: Sequence[float],
             seeds: int, rules: dict, seed: int = 0) -> dict:
    """{rule name: {'samples': mean total, 'accuracy': {r: mean}, 'at_nmax': mean images at n_max}}."""
    p = np.array([im.p for im in images])
    correct = np.array([im.correct for im in images])
    out = {}
    rng = np.random.default_rng(seed)
    acc = {r: [] for r in radii}
    for _ in range(seeds):
        rad = simulate_fixed(p, n, alpha, sigma, rng)
        for r in radii:
            acc[r].append(accuracy(rad, correct, r))
    out[f"fixed-n n={n}"] = {"samples": len(p) * (n0 + n), "accuracy": {r: float(np.mean(v)) for r, v in acc.items()},
                             "at_nmax": len(p)}
    for name, (chunks, futility) in rules.items():
        rng = np.random.default_rng(seed)
        acc, samples, at_max = {r: [] for r in radii}, [], []
        for _ in range(seeds):
            rad, used = simulate_sequential(p, radii, sigma, alpha, n, chunks, futility, rng)
            samples.append(int(used.sum()) + len(p) * n0)
            at_max.append(int((used >= n).sum()))
            for r in radii:
                acc[r].append(accuracy(rad, correct, r))
        out[name] = {"samples": float(np.mean(samples)), "accuracy": {r: float(np.mean(v)) for r, v in acc.items()},
                     "at_nmax": float(np.mean(at_max))}
    return out


def markdown(result: dict, radii: Sequence[float], header: str, label: str = "rule (SIMULATED)") -> str:
    base = next(iter(result.values()))
    lines = [header, "", f"| {label} | samples (total) | fewer | at n-max | "
             + " | ".join(f"r={r:g}" for r in radii) + " | worst diff (points) |",
             "|" + "---|" * (len(radii) + 5)]
    for name, row in result.items():
        accs = " | ".join(f"{row['accuracy'][r]:.3f}" for r in radii)
        worst = min(100 * (row["accuracy"][r] - base["accuracy"][r]) for r in radii)
        lines.append(f"| {name} | {row['samples']:,.0f} | {base['samples'] / row['samples']:.2f}x | "
                     f"{row['at_nmax']:.1f} | {accs} | {worst:+.1f} |")
    return "\n".join(lines)


def standard_rules(n: int) -> dict:
    """The rules compared: the old default (doubling looks, no futility stop) and the options."""
    from diffsmooth.engine.certify.sequential import FUTILITY_MARGIN, GROWTH_OLD
    old = look_schedule(n, growth=GROWTH_OLD)
    new = look_schedule(n)
    rules = {"old: doubling looks": (old, None)}
    for k in (0.0, 1.0, 2.0):
        rules[f"doubling looks + futility k={k:g}"] = (old, k)
    rules["new looks (x1.5)"] = (new, None)
    for k in (1.0, 2.0, 3.0):
        rules[f"new looks + futility k={k:g}" + (" (default)" if k == FUTILITY_MARGIN else "")] = (new, k)
    return rules


@click.command()
@click.option("--rows", type=click.Path(exists=True, dir_okay=False), required=True,
              help="A fixed-n CERTIFY TSV (idx label predict radius correct time).")
@click.option("--n", type=int, default=10000, show_default=True, help="The n of that run (= simulated n-max).")
@click.option("--n0", type=int, default=100, show_default=True)
@click.option("--alpha", type=float, default=0.001, show_default=True)
@click.option("--sigma", type=float, default=0.5, show_default=True)
@click.option("--radii", default="0.25,0.5,0.75,1.0", show_default=True)
@click.option("--seeds", type=int, default=20, show_default=True, help="Simulated vote paths per image and rule.")
@click.option("--measured", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Optional: the measured sequential TSV (with `samples`) of the same images, to print "
                   "the measured rows next to the simulated ones.")
@click.option("--abstain-p", type=float, default=0.45, show_default=True,
              help="Assumed vote rate of rows that abstained (radius 0).")
def main(rows, n, n0, alpha, sigma, radii, seeds, abstain_p, measured):
    """Prints the SIMULATED samples / certified-accuracy table (markdown)."""
    from diffsmooth.engine.certify.sequential import parse_radii
    radii = sorted(parse_radii(radii))
    images = load_images(rows, n, alpha, sigma, abstain_p)
    result = simulate(images, n=n, n0=n0, alpha=alpha, sigma=sigma, radii=radii, seeds=seeds,
                      rules=standard_rules(n))
    header = (f"SIMULATION from the vote rates recovered from {rows} ({len(images)} images, n={n}, n0={n0}, "
              f"alpha={alpha}, sigma={sigma}, {seeds} seeds, abstained rows p={abstain_p}); means over seeds")
    click.echo(markdown(result, radii, header))
    if measured:
        click.echo("\n" + measured_table(rows, measured, n, n0, radii))


def measured_table(fixed_path, seq_path, n: int, n0: int, radii: Sequence[float]) -> str:
    """The MEASURED rows (fixed-n and sequential TSVs) in the same layout, to check the simulation."""
    def read(path):
        with open(path, newline="") as handle:
            return list(csv.DictReader(handle, delimiter="\t"))
    fixed, seq = read(fixed_path), read(seq_path)
    table = {}
    for name, rows, samples in (("MEASURED fixed-n", fixed, len(fixed) * (n0 + n)),
                                ("MEASURED sequential", seq, sum(int(r["samples"]) for r in seq))):
        radius = np.array([float(r["radius"]) for r in rows])
        correct = np.array([int(r["correct"]) == 1 for r in rows])
        at_max = sum(int(r["samples"]) >= n0 + n for r in rows) if "samples" in rows[0] else len(rows)
        table[name] = {"samples": samples, "at_nmax": at_max,
                       "accuracy": {r: accuracy(radius, correct, r) for r in radii}}
    return markdown(table, radii, f"MEASURED: {fixed_path} and {seq_path}", label="run (MEASURED)")


if __name__ == "__main__":
    main()

"""SIMULATED coverage of the sequential lower bounds at the looks (is P(L ever > pA) <= alpha?).

    python -m diffsmooth.bench.sequential_coverage [--paths 50000] [--out bench/results/sequential_coverage]

For each n_max and each true vote rate p (each radius threshold Phi(r / sigma), and 0.5, 0.9,
0.99, 0.999), Binomial vote paths are drawn chunk by chunk on the rule's look schedule and the
lower bound is computed at EVERY look (no stopping: any stopping rule reports one of these bounds,
so this is the worst case). A path fails if its lower bound exceeds p at some look. Rows: the
engine's split CP bound, and a negative control (Clopper-Pearson at alpha at every look), which
must fail; the estimate comes with a 95% Clopper-Pearson interval over the paths.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable, Sequence

import click
import numpy as np
from scipy.stats import norm

from diffsmooth.engine.certify.cohen import lower_confidence_bounds
from diffsmooth.engine.certify.sequential import SequentialRule
from diffsmooth.engine.runs.analyze import clopper_pearson
from diffsmooth.engine.runs.request import parse_radii

# lower(successes, trials, look index) -> lower bounds (arrays)
LowerBound = Callable[[np.ndarray, float, int], np.ndarray]


def split_cp_lower(rule: SequentialRule) -> LowerBound:
    """The engine's split CP lower bound of `rule` at each look."""
    return lambda s, t, look: rule.bounds(s, t, look)[0]


def naive_cp_lower(alpha: float) -> LowerBound:
    """Negative control: fixed-n Clopper-Pearson at the full alpha at every look (not valid)."""
    return lambda s, t, look: lower_confidence_bounds(s, t, alpha)


def miscoverage(lower: LowerBound, chunks: Sequence[int], p: float, paths: int, rng) -> int:
    """How many of `paths` Binomial(p) vote paths have lower > p at some look of `chunks`.
    Bounds are computed once per distinct success count at each look (paths share them)."""
    failed = np.zeros(paths, dtype=bool)
    s = np.zeros(paths, dtype=np.int64)
    t = 0
    for look, size in enumerate(chunks):
        s += rng.binomial(size, p, size=paths)
        t += size
        values, inverse = np.unique(s, return_inverse=True)
        failed |= (lower(values.astype(np.float64), float(t), look) > p)[inverse]
    return int(failed.sum())


def rates(radii: Sequence[float], sigma: float) -> list:
    """The p checked: each threshold Phi(r / sigma), then 0.5, 0.9, 0.99, 0.999 (sorted, unique)."""
    return sorted({round(float(norm.cdf(r / sigma)), 6) for r in radii} | {0.5, 0.9, 0.99, 0.999})


def run(n_maxes: Sequence[int], paths: int, alpha: float, sigma: float, radii: Sequence[float], seed: int,
        controls: bool = True) -> list:
    """One record per (n_max, p, bound): failures, paths, rate and its 95% interval."""
    records = []
    for n_max in n_maxes:
        rule = SequentialRule(tuple(radii), sigma, alpha, n_max, bound="split-cp")
        bounds = {"split-cp": split_cp_lower(rule)}
        if controls:
            bounds["naive CP at alpha every look (control)"] = naive_cp_lower(alpha)
        for p in rates(radii, sigma):
            for name, lower in bounds.items():
                rng = np.random.default_rng([seed, n_max, int(p * 1e6)])      # same paths for every bound
                start = time.perf_counter()
                k = miscoverage(lower, rule.chunks(), p, paths, rng)
                records.append(dict(n_max=n_max, looks=len(rule.chunks()), p=p, bound=name, failures=k, paths=paths,
                                    rate=k / paths, ci95=clopper_pearson(k, paths),
                                    seconds=round(time.perf_counter() - start, 1)))
    return records


def markdown(records: list, alpha: float) -> str:
    lines = [f"SIMULATED miscoverage P(lower bound > p at some look), alpha = {alpha}; 95% Clopper-Pearson "
             "interval over the paths", "",
             "| n_max (looks) | p | bound | failures / paths | rate [95% CI] | <= alpha |", "|---|---|---|---|---|---|"]
    for r in records:
        lines.append(f"| {r['n_max']:,} ({r['looks']}) | {r['p']:.6g} | {r['bound']} | {r['failures']:,} / "
                     f"{r['paths']:,} | {r['rate']:.5f} [{r['ci95'][0]:.5f}, {r['ci95'][1]:.5f}] | "
                     f"{'yes' if r['rate'] <= alpha else 'NO'} |")
    split = [r for r in records if r["bound"] == "split-cp"]
    worst = max(split, key=lambda r: r["rate"])
    lines += ["", f"worst split CP: {worst['rate']:.5f} (n_max {worst['n_max']:,}, p {worst['p']:.6g})"]
    return "\n".join(lines)


@click.command()
@click.option("--paths", type=int, default=50000, show_default=True, help="Simulated vote paths per p.")
@click.option("--n-max", "n_maxes", default="10000,100000", show_default=True)
@click.option("--alpha", type=float, default=0.001, show_default=True)
@click.option("--sigma", type=float, default=0.5, show_default=True)
@click.option("--radii", default="0.25,0.5,0.75,1.0", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--out", type=click.Path(), default=None, help="Directory for coverage.md and coverage.json.")
def main(paths, n_maxes, alpha, sigma, radii, seed, out):
    """Prints the SIMULATED coverage table (markdown)."""
    start = time.perf_counter()
    records = run([int(n) for n in n_maxes.split(",")], paths, alpha, sigma, parse_radii(radii), seed)
    text = markdown(records, alpha)
    click.echo(text)
    if out:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "coverage.md").write_text(text + "\n")
        (out / "coverage.json").write_text(json.dumps(dict(paths=paths, alpha=alpha, sigma=sigma, radii=radii,
                                                           seed=seed, seconds=round(time.perf_counter() - start),
                                                           records=records), indent=1) + "\n")


if __name__ == "__main__":
    main()

"""EXACT coverage of the sequential lower bounds at the looks (is P(L ever > pA) <= alpha?).

    python -m studies.sequential_coverage [--bound reach-cp] [--scan 200] [--paths 50000] \
        [--out bench/results/sequential_coverage]

For each n_max and each true vote rate p (each radius threshold Phi(r / sigma), and 0.5, 0.9,
0.99, 0.999), the probability that the lower bound exceeds p at SOME look of the rule's schedule,
with no stopping: every path runs all looks to n_max. Any stopping rule on these looks reports the
running max of the bounds up to its stop, which is <= the running max over all looks, so this
number is an upper bound on the miscoverage of EVERY stopping rule built on them (the futility
and upper-bound stops included), and P(running max > p) = P(some look's bound > p) is what is computed.

The calculation is a dynamic program over the vote count, exact up to floating point (~1e-12):
a look's lower bound is nondecreasing in the count, so at look k the paths not yet miscovered are
exactly those with count c < c_k, the smallest count whose bound exceeds p (found by bisection on
the engine's own bound). The sub-probability vector P(count = c, not yet miscovered) is convolved
with the Binomial(chunk, p) pmf for each chunk; at each look its mass at counts >= c_k is added to
the miscoverage and dropped. Rows: the engine's bound (--bound: reach-cp, the default, or split-cp),
and a negative control (Clopper-Pearson at alpha at every look), which must fail.

--scan N adds the bound's worst miscoverage over N evenly spaced p in [0.5, 0.999] per n_max, plus
p near 1 (1 - 10^-k) and, for reach-cp, p just below the unanimity bound of each look (where its
event is most likely).
--paths N also runs the earlier Monte Carlo (N simulated Binomial vote paths per p, the same
no-stopping event) next to each exact figure, with its 95% Clopper-Pearson interval, as a cross-check.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Callable, Optional, Sequence, Tuple

import click
import numpy as np
from scipy.signal import fftconvolve
from scipy.stats import binom, norm

from diffsmooth.engine.certify.cohen import lower_confidence_bounds
from diffsmooth.engine.certify.sequential import DEFAULT_BOUND, SPLIT_BOUNDS, SequentialRule
from diffsmooth.engine.runs.analyze import clopper_pearson
from diffsmooth.engine.runs.request import parse_radii

# lower(successes, trials, look index) -> lower bounds (arrays)
LowerBound = Callable[[np.ndarray, float, int], np.ndarray]


def split_cp_lower(rule: SequentialRule) -> LowerBound:
    """The engine's lower bound of `rule` at each look (split CP, or reach-cp with its unanimity bound)."""
    return lambda s, t, look: rule.bounds(s, t, look)[0]


def naive_cp_lower(alpha: float) -> LowerBound:
    """Negative control: fixed-n Clopper-Pearson at the full alpha at every look (not valid)."""
    return lambda s, t, look: lower_confidence_bounds(s, t, alpha)


EXACT_LABEL = "exact (dynamic program, no stopping: an upper bound for every stopping rule)"
_DIRECT = 64            # below this many terms np.convolve (exact sums), above it FFT


def first_exceeding(lower: LowerBound, trials: int, look: int, p: float) -> int:
    """The smallest count c in 0..trials whose bound at look `look` exceeds p (trials + 1 where none
    does): integer bisection, valid because the bound is nondecreasing in the count."""
    below, above = -1, trials + 1               # bound(below) <= p < bound(above), as sentinels
    while above - below > 1:
        mid = (below + above) // 2
        if float(np.asarray(lower(np.array([float(mid)]), float(trials), look)).reshape(-1)[0]) > p:
            above = mid
        else:
            below = mid
    return above


def exact_miscoverage_by_look(lower: LowerBound, chunks: Sequence[int], p: float) -> Tuple[np.ndarray, float]:
    """(first-miscoverage probability at each look, mass check): P(bound <= p at looks 1..k-1 and > p
    at look k) for Binomial(p) votes on `chunks`, every path running all looks (no stopping). Their
    sum is P(some look's bound > p). The mass check |1 - miscovered - surviving| measures the
    floating-point error (FFT round-off, clipped at 0)."""
    alive = np.ones(1)                 # P(count = c and no look miscovered so far), c = 0, 1, ...
    missed = np.zeros(len(chunks))
    trials = 0
    for look, size in enumerate(chunks):
        step = binom.pmf(np.arange(size + 1), size, p)
        if min(len(alive), len(step)) > _DIRECT:
            alive = np.clip(fftconvolve(alive, step), 0.0, None)      # round-off can give tiny negatives
        else:
            alive = np.convolve(alive, step)
        trials += size
        cut = first_exceeding(lower, trials, look, p)
        missed[look] = math.fsum(alive[cut:])
        alive = alive[:cut]
    return missed, abs(1.0 - math.fsum(missed) - math.fsum(alive))


def exact_miscoverage(lower: LowerBound, chunks: Sequence[int], p: float) -> float:
    """P(lower bound > p at some look of `chunks`) for Binomial(p) votes, exactly (no stopping)."""
    return math.fsum(exact_miscoverage_by_look(lower, chunks, p)[0])


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
    """The p checked: each threshold Phi(r / sigma), then 0.5, 0.9, 0.99, 0.999, 0.9999 (sorted, unique)."""
    return sorted({round(float(norm.cdf(r / sigma)), 6) for r in radii} | {0.5, 0.9, 0.99, 0.999, 0.9999})


def run(n_maxes: Sequence[int], alpha: float, sigma: float, radii: Sequence[float], paths: Optional[int] = None,
        seed: int = 0, controls: bool = True, bound: str = DEFAULT_BOUND) -> list:
    """One record per (n_max, p, bound): the exact miscoverage (and with `paths`, the Monte Carlo's
    failures over that many simulated paths and its 95% interval)."""
    records = []
    for n_max in n_maxes:
        rule = SequentialRule(tuple(radii), sigma, alpha, n_max, bound=bound)
        bounds = {bound: split_cp_lower(rule)}
        if controls:
            bounds["naive CP at alpha every look (control)"] = naive_cp_lower(alpha)
        for p in rates(radii, sigma):
            for name, lower in bounds.items():
                start = time.perf_counter()
                by_look, mass_error = exact_miscoverage_by_look(lower, rule.chunks(), p)
                record = dict(n_max=n_max, looks=len(rule.chunks()), p=p, bound=name, rate=math.fsum(by_look),
                              worst_look=int(np.argmax(by_look)) + 1, mass_error=mass_error,
                              seconds=round(time.perf_counter() - start, 2))
                if paths:
                    rng = np.random.default_rng([seed, n_max, int(p * 1e6)])      # same paths for every bound
                    k = miscoverage(lower, rule.chunks(), p, paths, rng)
                    record.update(failures=k, paths=paths, simulated=k / paths, ci95=clopper_pearson(k, paths))
                records.append(record)
    return records


def scanned_rates(rule: SequentialRule, points: int) -> np.ndarray:
    """The p a scan checks: `points` evenly spaced in [0.5, 0.999] (6 digits), 1 - 10^-k for k = 3.5
    to 6, and for reach-cp just below level^(1/t) at each look t (its unanimity event is largest there)."""
    ps = set(np.round(np.linspace(0.5, 0.999, points), 6).tolist()) | {1 - 10.0 ** -k for k in (3.5, 4, 4.5, 5, 5.5, 6)}
    if rule.bound == "reach-cp":
        level = rule.alpha * rule.unanimity
        ps |= {level ** (1.0 / t) * (1 - 1e-12) for t in rule.looks()}
    return np.array(sorted(p for p in ps if 0.5 <= p < 1))


def scan(n_maxes: Sequence[int], alpha: float, sigma: float, radii: Sequence[float], points: int,
         bound: str = DEFAULT_BOUND) -> list:
    """The bound's exact miscoverage at the p of `scanned_rates`: the largest per n_max (the
    miscoverage jumps with p as the thresholds c_k move)."""
    found = []
    for n_max in n_maxes:
        rule = SequentialRule(tuple(radii), sigma, alpha, n_max, bound=bound)
        ps = scanned_rates(rule, points)
        rates_ = [exact_miscoverage(split_cp_lower(rule), rule.chunks(), float(p)) for p in ps]
        worst = int(np.argmax(rates_))
        found.append(dict(n_max=n_max, points=len(ps), worst=rates_[worst], p=float(ps[worst]), bound=bound))
    return found


def markdown(records: list, alpha: float, scanned: Sequence[dict] = ()) -> str:
    simulated = any("paths" in r for r in records)
    lines = [f"EXACT miscoverage P(lower bound > p at some look), alpha = {alpha}: {EXACT_LABEL}", "",
             "| n_max (looks) | p | bound | miscoverage, exact | / alpha | <= alpha |"
             + (" simulated: failures / paths, rate [95% CI] |" if simulated else ""),
             "|---|---|---|---|---|---|" + ("---|" if simulated else "")]
    for r in records:
        line = (f"| {r['n_max']:,} ({r['looks']}) | {r['p']:.6g} | {r['bound']} | {r['rate']:.7f} | "
                f"{r['rate'] / alpha:.3f} | {'yes' if r['rate'] <= alpha else 'NO'} |")
        if "paths" in r:
            line += (f" {r['failures']:,} / {r['paths']:,}, {r['simulated']:.5f} [{r['ci95'][0]:.5f}, "
                     f"{r['ci95'][1]:.5f}] |")
        lines.append(line)
    split = [r for r in records if "control" not in r["bound"]]
    name = split[0]["bound"]
    lines.append("")
    for n_max in sorted({r["n_max"] for r in split}):
        worst = max((r for r in split if r["n_max"] == n_max), key=lambda r: r["rate"])
        lines.append(f"worst {name} at n_max {n_max:,} ({worst['looks']} looks): {worst['rate']:.7f} at p "
                     f"{worst['p']:.6g}")
    worst = max(split, key=lambda r: r["rate"])
    lines += ["", f"worst {name}: {worst['rate']:.7f} (n_max {worst['n_max']:,}, p {worst['p']:.6g}), exact; "
              f"largest floating-point mass error {max(r['mass_error'] for r in records):.1e}"]
    for found in scanned:
        lines.append(f"worst {name} over {found['points']} p (evenly spaced in [0.5, 0.999], near 1, and at "
                     f"the looks' unanimity bands) at n_max {found['n_max']:,}: {found['worst']:.7f} at p {found['p']:.6g}")
    return "\n".join(lines)


@click.command()
@click.option("--n-max", "n_maxes", default="10000,100000", show_default=True)
@click.option("--alpha", type=float, default=0.001, show_default=True)
@click.option("--sigma", type=float, default=0.5, show_default=True)
@click.option("--radii", default="0.25,0.5,0.75,1.0", show_default=True)
@click.option("--paths", type=int, default=0, show_default=True,
              help="Cross-check: also simulate this many vote paths per p (the earlier Monte Carlo; 0: none).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the --paths simulation.")
@click.option("--scan", "points", type=int, default=0, show_default=True,
              help="Also the bound's worst miscoverage over this many evenly spaced p in [0.5, 0.999], p near 1 "
                   "and (reach-cp) the unanimity bands (0: none).")
@click.option("--bound", type=click.Choice(SPLIT_BOUNDS), default=DEFAULT_BOUND, show_default=True,
              help="The lower bound checked (reach-cp: the default rule; split-cp: the earlier one).")
@click.option("--out", type=click.Path(), default=None, help="Directory for coverage.md and coverage.json.")
def main(n_maxes, alpha, sigma, radii, paths, seed, points, bound, out):
    """Prints the EXACT coverage table (markdown): P(lower bound > p at some look), computed by a dynamic
    program over the vote count with no stopping (an upper bound for every stopping rule on those looks)."""
    start = time.perf_counter()
    n_maxes = [int(n) for n in n_maxes.split(",")]
    records = run(n_maxes, alpha, sigma, parse_radii(radii), paths=paths, seed=seed, bound=bound)
    scanned = scan(n_maxes, alpha, sigma, parse_radii(radii), points, bound) if points else []
    text = markdown(records, alpha, scanned)
    click.echo(text)
    if out:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "coverage.md").write_text(text + "\n")
        settings = dict(method=EXACT_LABEL, alpha=alpha, sigma=sigma, radii=radii, bound=bound)
        if paths:
            settings.update(paths=paths, seed=seed)
        (out / "coverage.json").write_text(json.dumps(dict(settings, seconds=round(time.perf_counter() - start, 1),
                                                           records=records, scan=scanned), indent=1) + "\n")


if __name__ == "__main__":
    main()

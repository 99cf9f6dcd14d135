"""The last look's share of alpha (SequentialRule.last_look): EXACT miscoverage and
SIMULATED samples and cells against fixed-n, for several splits of the default rule (reach-cp with
the pace-floor stop).

    python -m studies.last_look_study coverage [--n-max 10000,100000] [--shares 0.5,0.3,0.2,0.1,0.05] \
        [--scan 60] --out bench/results/last_look/coverage.md
    python -m studies.last_look_study paths --rows bench/results/table_demo_rs_500x10000/all \
        [--n-max 100000] [--seeds 20] [--shares ...] --out bench/results/last_look/rs_all_500_n100000.md

`coverage`: for each share, the exact miscoverage P(lower bound > p at some look) of the rule's looks
and levels with no stopping (studies/sequential_coverage.py's dynamic program: an upper bound for every
stopping rule on those looks), worst over the thresholds Phi(r / sigma) with 0.5 ... 0.9999, and
over a scan of p (`scanned_rates`: evenly spaced p, p near 1, the unanimity bands of every look).
The union bound keeps it <= alpha for every share; the table shows it.

`paths`: every share on the SAME paired vote paths per seed (the looks do not depend on the share,
so the paths are the same draws), each seed's vote rates drawn from the rows' posteriors (the
mixture model, studies/rate_model.py, as studies/race_study.py by default):
  `all` per sigma: studies/replay.py `simulate` (every radius of the table, one sigma at a
      time): samples and certified accuracy per radius against fixed-n on those paths;
  the table's plans: studies/replay.simulate_plans (fixed-n, `all`, the race), whose cells are
      the best over sigma, with the rule of each share (its SimulatedSigma builds its rules with
      `SequentialRule(..., last_look=share)`: simulate_plans passes the share on; nothing else changes).
A model of a measurement, not a measurement (SIMULATED).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import click
import numpy as np

from diffsmooth.engine.certify.sequential import DEFAULT_LAST_LOOK, LAST_LOOK_OLD, SequentialRule
from diffsmooth.engine.runs.request import parse_radii
from diffsmooth.engine.table.defaults import PILOT_IMAGES, TOLERANCE_POINTS
from diffsmooth.engine.table.race_sim import RaceRule
from studies.race_study import rates_from, seed_rates
from studies.replay import Image, PlanKnobs, SimulationSetup, simulate, simulate_plans
from studies.sequential_coverage import exact_miscoverage_by_look, rates, scanned_rates, split_cp_lower

SHARES = "0.5,0.3,0.2,0.1,0.05"
PLANS = ("all", "race")
CRITERION_POINTS = 0.3          # a split may become the default only if no radius loses more on average


def parse_shares(text: str) -> List[float]:
    shares = [float(x) for x in text.split(",") if x.strip()]
    if not shares or any(not 0 < s < 1 for s in shares):
        raise click.BadParameter(f"shares must be in (0, 1), got {text!r}")
    return shares


def label(share: float) -> str:
    marks = [m for m, s in (("today's", LAST_LOOK_OLD), ("default", DEFAULT_LAST_LOOK)) if s == share]
    return f"{share:g}" + (f" ({', '.join(marks)})" if marks else "")


# ---------------------------------------------------------------- coverage (EXACT)

def coverage_record(n_max: int, share: float, alpha: float, sigma: float, radii: Sequence[float], points: int) -> dict:
    """The exact miscoverage of the rule with this share: at the thresholds (with 0.5 ... 0.9999) and
    the worst over the scan, with the last look's part of it at the worst p."""
    rule = SequentialRule(tuple(radii), sigma, alpha, n_max, last_look=share)
    lower = split_cp_lower(rule)
    start = time.perf_counter()
    fixed = [float(p) for p in rates(radii, sigma)]
    scanned = [float(p) for p in scanned_rates(rule, points)] if points else []
    found = {}
    for p in sorted(set(fixed) | set(scanned)):
        by_look, error = exact_miscoverage_by_look(lower, rule.chunks(), p)
        found[p] = (math.fsum(by_look), float(by_look[-1]), error)
    at_thresholds = max(fixed, key=lambda p: found[p][0])
    worst = max(found, key=lambda p: found[p][0])
    return dict(n_max=n_max, share=share, looks=len(rule.looks()), sigma=sigma, radii=list(radii),
                last_level=float(rule.levels()[-1]), union=float(rule.levels().sum() + alpha * rule.unanimity),
                thresholds=dict(worst=found[at_thresholds][0], p=at_thresholds),
                scan=dict(points=len(found), worst=found[worst][0], p=worst, last_look_part=found[worst][1]),
                mass_error=max(v[2] for v in found.values()), seconds=round(time.perf_counter() - start, 1))


def coverage_markdown(records: List[dict], alpha: float, command: str) -> str:
    lines = [f"## EXACT miscoverage P(lower bound > p at some look), reach-cp, alpha = {alpha} (dynamic program, "
             "no stopping: an upper bound for every stopping rule on these looks)", "", f"    {command}", "",
             "| n-max (looks) | sigma, radii | last look's share | its level | levels + unanimity | worst at the "
             "thresholds (p) | worst over the scan (p; points) | / alpha | of it at the last look | <= alpha |",
             "|" + "---|" * 10]
    for r in records:
        t, s = r["thresholds"], r["scan"]
        ok = max(t["worst"], s["worst"]) <= alpha
        lines.append(f"| {r['n_max']:,} ({r['looks']}) | {r['sigma']:g}, {','.join(f'{x:g}' for x in r['radii'])} | "
                     f"{label(r['share'])} | {r['last_level']:.2e} | {r['union']:.6g} | {t['worst']:.7f} ({t['p']:.6g}) | "
                     f"{s['worst']:.7f} ({s['p']:.6g}; {s['points']}) | {s['worst'] / alpha:.3f} | "
                     f"{s['last_look_part']:.7f} | {'yes' if ok else 'NO'} |")
    lines += ["", f"largest floating-point mass error {max(r['mass_error'] for r in records):.1e}"]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- paths (SIMULATED)

def path_study(folder: Path, n_max: int, seeds: int, shares: Sequence[float], tolerance: float,
               pilot: int = PILOT_IMAGES, plans: bool = True) -> dict:
    data = rates_from(folder)
    spec = data["spec"]
    radii, sigmas, alpha, n0 = spec["radii"], spec["sigmas"], spec["alpha"], spec["n0"]
    rng = np.random.default_rng(0)
    per_sigma = {f"{s:g}": {"fixed": [], **{f"{x:g}": [] for x in shares}} for s in sigmas}
    samples_sigma = {f"{s:g}": {f"{x:g}": [] for x in shares} for s in sigmas}
    plan_runs: List[Dict[str, dict]] = []
    start = time.perf_counter()
    for seed in range(seeds):
        drawn = seed_rates(data, "mixture", rng)
        for k, s in enumerate(sigmas):
            images = [Image(float(p), bool(c)) for p, c in zip(drawn[s], data["correct"][s])]
            rules = {f"{x:g}": SequentialRule(tuple(radii), s, alpha, n_max, last_look=x) for x in shares}
            out = simulate(images, SimulationSetup(n=n_max, n0=n0, alpha=alpha, sigma=s, radii=radii), seeds=1,
                           rules=rules, seed=1000 * seed + k, oracle=False)
            fixed = next(iter(out.values()))
            per_sigma[f"{s:g}"]["fixed"].append([fixed["accuracy"][r] for r in radii])
            for x in shares:
                per_sigma[f"{s:g}"][f"{x:g}"].append([out[f"{x:g}"]["accuracy"][r] for r in radii])
                samples_sigma[f"{s:g}"][f"{x:g}"].append(out[f"{x:g}"]["samples"])
        if plans:
            runs = {}
            for x in shares:
                runs[f"{x:g}"] = simulate_plans(drawn, data["correct"], RaceRule(radii, alpha, n_max, last_look=x), n0,
                                                tolerance, np.random.default_rng([seed, 46]), PlanKnobs(pilot=pilot))
            fixed_cells = [r["fixed"]["cells"] for r in runs.values()]
            if any(not np.array_equal(fixed_cells[0], c) for c in fixed_cells):
                raise RuntimeError("the shares' fixed-n cells differ: the paths are not paired")
            plan_runs.append(runs)
        click.echo(f"seed {seed + 1}/{seeds}: {time.perf_counter() - start:.0f} s", err=True)
    images = len(data["correct"][sigmas[0]])
    fixed_samples = images * (n0 + n_max)
    doc = {"line": data["line"], "rows": str(folder), "images": images, "n_max": n_max, "n0": n0, "alpha": alpha,
           "seeds": seeds, "radii": radii, "sigmas": sigmas, "shares": list(shares), "tolerance": tolerance,
           "rates": "mixture", "fixed_samples_per_sigma": fixed_samples, "per_sigma": {}, "plans": {},
           "seconds": round(time.perf_counter() - start, 1)}
    for s, by in per_sigma.items():
        fixed = 100 * np.mean(by["fixed"], axis=0)
        doc["per_sigma"][s] = {"fixed": fixed.tolist()}
        for x in shares:
            acc = 100 * np.array(by[f"{x:g}"])
            doc["per_sigma"][s][f"{x:g}"] = {
                "samples": float(np.mean(samples_sigma[s][f"{x:g}"])),
                "minus_fixed": (acc - 100 * np.array(by["fixed"])).mean(axis=0).tolist()}
    if plans:
        fixed_cells = np.array([r[f"{shares[0]:g}"]["fixed"]["cells"] for r in plan_runs])
        doc["plans"]["fixed"] = {"samples": float(np.mean([r[f"{shares[0]:g}"]["fixed"]["samples"] for r in plan_runs])),
                                 "cells": fixed_cells.mean(axis=0).tolist()}
        for x in shares:
            for plan in PLANS:
                cells = np.array([r[f"{x:g}"][plan]["cells"] for r in plan_runs])
                diff = cells - fixed_cells
                doc["plans"].setdefault(plan, {})[f"{x:g}"] = {
                    "samples": float(np.mean([r[f"{x:g}"][plan]["samples"] for r in plan_runs])),
                    "cells": cells.mean(axis=0).tolist(), "minus_fixed": diff.mean(axis=0).tolist(),
                    "minus_fixed_se": (diff.std(axis=0, ddof=1) / np.sqrt(len(plan_runs))).tolist()
                    if len(plan_runs) > 1 else [0.0] * len(radii)}
    return doc


def passes(doc: dict, share: float, points: float = CRITERION_POINTS) -> bool:
    """Every radius's cell within `points` of fixed-n on average (mean over seeds), under `all` and the race."""
    return all(min(doc["plans"][plan][f"{share:g}"]["minus_fixed"]) >= -points for plan in PLANS)


def paths_markdown(doc: dict, command: str) -> str:
    radii, shares = doc["radii"], doc["shares"]
    head = " | ".join(f"r={r:g}" for r in radii)
    lines = [f"## SIMULATED: {doc['line']}, {doc['images']} images, sigma {doc['sigmas']}, n-max {doc['n_max']:,}, "
             f"{doc['seeds']} seeds on paired paths (every share on the same paths), vote rates drawn from the rows' "
             "posteriors (mixture)", "", f"    {command}", ""]
    if doc["plans"]:
        fixed = doc["plans"]["fixed"]
        lines += ["### The table's cells (best over sigma): change against fixed-n in points, mean over seeds",
                  "", f"fixed-n: {fixed['samples']:,.0f} samples; cells " + ", ".join(f"{c:.2f}" for c in fixed["cells"]),
                  "", f"| plan | last look's share | samples | fewer than fixed-n | {head} | worst radius | "
                  f">= -{CRITERION_POINTS:g} at every radius |", "|" + "---|" * (len(radii) + 6)]
        for plan in PLANS:
            for x in shares:
                p = doc["plans"][plan][f"{x:g}"]
                d = p["minus_fixed"]
                lines.append(f"| {plan} | {label(x)} | {p['samples']:,.0f} | {fixed['samples'] / p['samples']:.2f}x | "
                             + " | ".join(f"{v:+.2f}" for v in d) + f" | {min(d):+.2f} | "
                             f"{'yes' if min(d) >= -CRITERION_POINTS else 'no'} |")
        lines += ["", "Standard error of the mean change (over seeds), worst radius: " + "; ".join(
            f"{plan} {x:g}: {max(doc['plans'][plan][f'{x:g}']['minus_fixed_se']):.2f}" for plan in PLANS for x in shares), ""]
        today = f"{LAST_LOOK_OLD:g}"
        lines += ["Samples against today's split (0.5), paired: " + "; ".join(
            f"{plan} {x:g}: {100 * (doc['plans'][plan][f'{x:g}']['samples'] / doc['plans'][plan][today]['samples'] - 1):+.1f}%"
            for plan in PLANS for x in shares if f"{x:g}" != today and today in doc["plans"][plan]), ""]
        lines += ["Cells against today's split (0.5), paired, the worst radius (points): " + "; ".join(
            f"{plan} {x:g}: {min(np.subtract(doc['plans'][plan][f'{x:g}']['cells'], doc['plans'][plan][today]['cells'])):+.2f}"
            for plan in PLANS for x in shares if f"{x:g}" != today and today in doc["plans"][plan]), ""]
    lines += ["### `all` per sigma (studies/replay.py `simulate`): change in certified accuracy against fixed-n "
              "in points, mean over seeds", "", f"| sigma | last look's share | samples | fewer than fixed-n | {head} |",
              "|" + "---|" * (len(radii) + 4)]
    for s, by in doc["per_sigma"].items():
        lines.append(f"| {s} | fixed-n | {doc['fixed_samples_per_sigma']:,} | 1x | "
                     + " | ".join(f"{v:.2f}" for v in by["fixed"]) + " |")
        for x in shares:
            e = by[f"{x:g}"]
            lines.append(f"| {s} | {label(x)} | {e['samples']:,.0f} | {doc['fixed_samples_per_sigma'] / e['samples']:.2f}x | "
                         + " | ".join(f"{v:+.2f}" for v in e["minus_fixed"]) + " |")
    return "\n".join(lines) + "\n"


def write(doc, text: str, out: Optional[str]) -> None:
    click.echo(text)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text)
        Path(out).with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")


@click.group()
def main():
    """The last look's share of alpha: EXACT coverage and SIMULATED samples / cells against fixed-n."""


@main.command()
@click.option("--n-max", "n_maxes", default="10000,100000", show_default=True)
@click.option("--shares", default=SHARES, show_default=True, help="The last look's shares of alpha compared.")
@click.option("--alpha", type=float, default=0.001, show_default=True)
@click.option("--sigma", type=float, default=0.5, show_default=True)
@click.option("--radii", default="0.25,0.5,0.75,1.0", show_default=True)
@click.option("--scan", "points", type=click.IntRange(0), default=60, show_default=True,
              help="Evenly spaced p in [0.5, 0.999] (with p near 1 and the unanimity bands).")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="Write the markdown (and FILE.json) here.")
def coverage(n_maxes, shares, alpha, sigma, radii, points, out):
    """EXACT miscoverage of each split (dynamic program over the vote count, no stopping)."""
    radii = sorted(parse_radii(radii))
    records = [coverage_record(int(n), x, alpha, sigma, radii, points) for n in n_maxes.split(",")
               for x in parse_shares(shares)]
    command = (f"python -m studies.last_look_study coverage --n-max {n_maxes} --shares {shares} "
               f"--alpha {alpha:g} --sigma {sigma:g} --radii {','.join(f'{r:g}' for r in radii)} --scan {points}")
    write({"alpha": alpha, "method": "exact (dynamic program, no stopping)", "records": records},
          coverage_markdown(records, alpha, command), out)


@main.command()
@click.option("--rows", "folder", type=click.Path(exists=True, file_okay=False), required=True,
              help="A table folder: its first line's rows give each image's vote rate per sigma.")
@click.option("--n-max", type=click.IntRange(1), default=100_000, show_default=True)
@click.option("--seeds", type=click.IntRange(1), default=20, show_default=True)
@click.option("--shares", default=SHARES, show_default=True, help="The last look's shares of alpha compared.")
@click.option("--tolerance", type=click.FloatRange(0, 100), default=TOLERANCE_POINTS, show_default=True)
@click.option("--no-plans", is_flag=True, help="Only `all` per sigma (skip the table's plans, the slow part).")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="Write the markdown (and FILE.json) here.")
def paths(folder, n_max, seeds, shares, tolerance, no_plans, out):
    """SIMULATED samples and cells against fixed-n of each split on paired paths."""
    doc = path_study(Path(folder), n_max, seeds, parse_shares(shares), tolerance, plans=not no_plans)
    command = (f"python -m studies.last_look_study paths --rows {folder} --n-max {n_max} --seeds {seeds} "
               f"--shares {shares}" + (" --no-plans" if no_plans else "") + (f" --out {out}" if out else ""))
    doc["command"] = command
    write(doc, paths_markdown(doc, command), out)


@main.command()
@click.argument("study", type=click.Path(exists=True, dir_okay=False))
def render(study):
    """Rewrites a `paths` study's markdown (FILE.md beside FILE.json) from its JSON."""
    doc = json.loads(Path(study).read_text())
    text = paths_markdown(doc, doc["command"])
    Path(study).with_suffix(".md").write_text(text)
    click.echo(text)


if __name__ == "__main__":
    main()

"""What `diffsmooth table`'s plans cost and change for a table's first line, from measured table folders
(MEASURED) and, on paired simulated vote paths, against fixed-n CERTIFY (SIMULATED).

    python -m diffsmooth.bench.table_study --auto DIR --all DIR [--fixed DIR] [--seeds 20]
        [--n-max-sim 100000] [--out bench/results/table_demo_rs_500x10000]

MEASURED: the auto and all tables' cells, samples and seconds (their summary.json), and a measured
fixed-n table on a subset of the images against the all table's rows on the same images.
SIMULATED: each image's vote rate per sigma is read from the `all` table's rows (top_votes out of
samples - n0; a rate read at an early stop is biased up, as any estimate at a data-dependent stop).
Vote paths with those rates run through fixed-n CERTIFY at n-max, the sequential rule settling every
radius (`all`) and the rule settling the radii the auto plan gave each sigma (pilot images: every
radius), all on the SAME paths (paired). At --n-max-sim the same rates are extrapolated.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import click
import numpy as np

from diffsmooth.engine.certify.cohen import lower_confidence_bounds
from diffsmooth.engine.certify.sequential import SequentialRule, radius_from_lower
from diffsmooth.engine.runs.results import read_rows
from diffsmooth.engine.runs.simulation import chunk_votes, image_from_row, shared_paths, simulate_sequential
from diffsmooth.engine.table.build import phase_path
from diffsmooth.engine.table.spec import LineSpec


def _summary(folder: Path) -> dict:
    return json.loads((folder / "summary.json").read_text())


def _cells(summary: dict) -> Dict[str, List[float]]:
    return {row["name"]: [100 * c["certified_accuracy"] for c in row["cells"]] for row in summary["rows"]}


def _main_rows(folder: Path, line: LineSpec, sigma: float) -> List[dict]:
    """The line's rows at `sigma`, pilot and main phase together (single-configuration lines)."""
    rows = []
    for kind in ("pilot", "main"):
        path = phase_path(folder, line, sigma, kind)
        if path.is_file():
            rows += read_rows(path)
    return sorted(rows, key=lambda r: int(r["idx"]))


def simulate_table(rates: Dict[float, np.ndarray], correct: Dict[float, np.ndarray], radii: Sequence[float],
                   assigned: Dict[float, Sequence[float]], pilot_mask: np.ndarray, n_max: int, n0: int, alpha: float,
                   seeds: int, seed: int = 0) -> dict:
    """{plan: {'cells': [%], 'samples': mean total}} for fixed-n, all and auto on paired paths."""
    rng = np.random.default_rng(seed)
    per_plan = {plan: {"acc": [], "samples": []} for plan in ("fixed", "all", "auto")}
    for _ in range(seeds):
        acc = {plan: {} for plan in per_plan}
        samples = {plan: 0.0 for plan in per_plan}
        for sigma, p in rates.items():
            rule_all = SequentialRule(tuple(radii), sigma, alpha, n_max)
            radii_auto = tuple(assigned.get(sigma, ()))
            rule_auto = SequentialRule(radii_auto, sigma, alpha, n_max) if radii_auto else None
            rules = [rule_all] + ([rule_auto] if rule_auto else [])
            cuts, segments = shared_paths(p, rules, n_max, rng)
            fixed_radius = radius_from_lower(lower_confidence_bounds(segments.sum(axis=1), n_max, alpha), sigma)
            all_radius, all_used = simulate_sequential(p, rule_all, None, votes=chunk_votes(cuts, segments, rule_all))
            if rule_auto:
                auto_radius, auto_used = simulate_sequential(p, rule_auto, None, votes=chunk_votes(cuts, segments, rule_auto))
                auto_radius = np.where(pilot_mask, all_radius, auto_radius)
                auto_used = np.where(pilot_mask, all_used, auto_used)
            else:
                auto_radius, auto_used = np.where(pilot_mask, all_radius, 0.0), np.where(pilot_mask, all_used, 0)
            samples["fixed"] += len(p) * (n0 + n_max)
            samples["all"] += float(all_used.sum()) + len(p) * n0
            samples["auto"] += float(auto_used.sum()) + (len(p) * n0 if rule_auto else int(pilot_mask.sum()) * n0)
            for plan, radius in (("fixed", fixed_radius), ("all", all_radius), ("auto", auto_radius)):
                for r in radii:
                    if plan == "auto" and r not in radii_auto:
                        continue
                    value = 100 * float(np.mean(correct[sigma] & (radius >= r)))
                    acc[plan][r] = max(acc[plan].get(r, 0.0), value)
        for plan in per_plan:
            per_plan[plan]["acc"].append([acc[plan].get(r, 0.0) for r in radii])
            per_plan[plan]["samples"].append(samples[plan])
    return {plan: {"cells": list(np.mean(v["acc"], axis=0)), "samples": float(np.mean(v["samples"]))}
            for plan, v in per_plan.items()}


def differences(a: Sequence[float], b: Sequence[float]) -> dict:
    d = np.asarray(a) - np.asarray(b)
    worst = int(np.argmax(np.abs(d)))
    return {"mean": float(d.mean()), "worst": float(d[worst]), "worst_index": worst, "max_abs": float(np.abs(d).max())}


def study(auto: Path, all_: Path, fixed: Optional[Path], seeds: int, n_max_sim: Optional[int]) -> dict:
    s_auto, s_all = _summary(auto), _summary(all_)
    spec = s_all["spec"]
    radii, sigmas = spec["radii"], spec["sigmas"]
    n0, n_max, alpha = spec["n0"], spec["n_max"], spec["alpha"]
    plan = json.loads((auto / "plan.json").read_text())
    assigned = {float(s): r for s, r in plan["radii"].items()}
    line = s_all["rows"][0]["name"]
    first = spec["lines"][0]
    line_spec = LineSpec(first["name"], first["method"], {}, {}, {})
    out = {"line": line, "radii": radii, "sigmas": sigmas, "n0": n0, "n_max": n_max, "images": s_all["images"]}
    # MEASURED
    out["measured"] = {
        "auto": {"cells": _cells(s_auto)[line], "samples": s_auto["samples"], "seconds": s_auto["seconds"]},
        "all": {"cells": _cells(s_all)[line], "samples": s_all["samples"], "seconds": s_all["seconds"]},
        "auto_minus_all": differences(_cells(s_auto)[line], _cells(s_all)[line])}
    if fixed is not None:
        s_fixed = _summary(fixed)
        subset = set(json.loads((fixed / "plan.json").read_text())["main"])
        all_on_subset = {}
        for sigma in sigmas:
            rows = [r for r in _main_rows(all_, line_spec, sigma) if int(r["idx"]) in subset]
            all_on_subset[sigma] = rows
        cells_all_subset = []
        for r in radii:
            cells_all_subset.append(max(100 * sum(1 for row in rows if int(row["correct"]) and float(row["radius"]) >= r)
                                        / len(rows) for rows in all_on_subset.values()))
        out["measured"]["fixed_subset"] = {
            "images": len(subset), "cells": _cells(s_fixed)[line], "samples": s_fixed["samples"],
            "seconds": s_fixed["seconds"], "all_cells_same_images": cells_all_subset,
            "all_minus_fixed": differences(cells_all_subset, _cells(s_fixed)[line])}
    # SIMULATED
    rates, correct = {}, {}
    pilot = set(plan["pilot"])
    idx = None
    for sigma in sigmas:
        rows = _main_rows(all_, line_spec, sigma)
        images = [image_from_row(r, n_max, n0, alpha, sigma, 0.45) for r in rows]
        rates[sigma] = np.array([im.p for im in images])
        correct[sigma] = np.array([im.correct for im in images])
        idx = [im.idx for im in images]
    pilot_mask = np.array([i in pilot for i in idx])
    for n in [n_max] + ([n_max_sim] if n_max_sim else []):
        sim = simulate_table(rates, correct, radii, assigned, pilot_mask, n, n0, alpha, seeds)
        out[f"simulated_n{n}"] = {
            **sim, "fewer_auto_vs_fixed": sim["fixed"]["samples"] / sim["auto"]["samples"],
            "fewer_all_vs_fixed": sim["fixed"]["samples"] / sim["all"]["samples"],
            "auto_minus_fixed": differences(sim["auto"]["cells"], sim["fixed"]["cells"]),
            "all_minus_fixed": differences(sim["all"]["cells"], sim["fixed"]["cells"]),
            "auto_minus_all": differences(sim["auto"]["cells"], sim["all"]["cells"])}
    return out


def markdown(doc: dict) -> str:
    r = doc["radii"]
    head = "| | samples | " + " | ".join(f"r={x:g}" for x in r) + " |\n|" + "---|" * (len(r) + 2)
    m = doc["measured"]
    lines = [f"## MEASURED: {doc['line']}, {doc['images']} images, sigma {doc['sigmas']}, n0 {doc['n0']}, "
             f"n-max {doc['n_max']:,}", "", head]
    for plan in ("auto", "all"):
        lines.append(f"| {plan} | {m[plan]['samples']['total']:,} | " + " | ".join(f"{v:.1f}" for v in m[plan]["cells"]) + " |")
    d = m["auto_minus_all"]
    lines += ["", f"auto - all (points): mean {d['mean']:+.2f}, largest |difference| {d['max_abs']:.1f} "
              f"(at r={r[d['worst_index']]:g}).",
              f"auto: pilot {m['auto']['samples']['pilot']:,} of {m['auto']['samples']['total']:,} samples "
              f"({100 * m['auto']['samples']['pilot'] / m['auto']['samples']['total']:.1f}%); main phase predicted "
              f"{m['auto']['seconds']['predicted']:.0f} s, measured {m['auto']['seconds']['measured']:.0f} s."]
    if "fixed_subset" in m:
        f = m["fixed_subset"]
        lines += ["", f"Fixed-n (MEASURED) on {f['images']} of the images per sigma, against the all table's rows on the "
                  "same images:", "", head,
                  f"| fixed-n | {f['samples']['total']:,} | " + " | ".join(f"{v:.1f}" for v in f["cells"]) + " |",
                  "| all, same images | - | " + " | ".join(f"{v:.1f}" for v in f["all_cells_same_images"]) + " |",
                  "", f"all - fixed-n (points): mean {f['all_minus_fixed']['mean']:+.2f}, worst "
                  f"{f['all_minus_fixed']['worst']:+.1f}."]
    for key in [k for k in doc if k.startswith("simulated_n")]:
        s = doc[key]
        n = int(key[len("simulated_n"):])
        lines += ["", f"## SIMULATED on paired paths, n-max {n:,} (rates from the all table's rows)", "", head]
        for plan in ("fixed", "all", "auto"):
            lines.append(f"| {plan} | {s[plan]['samples']:,.0f} | " + " | ".join(f"{v:.1f}" for v in s[plan]["cells"]) + " |")
        lines += ["", f"fewer samples than fixed-n: auto {s['fewer_auto_vs_fixed']:.1f}x, all {s['fewer_all_vs_fixed']:.1f}x; "
                  f"auto - fixed (points): mean {s['auto_minus_fixed']['mean']:+.2f}, "
                  f"worst {s['auto_minus_fixed']['worst']:+.1f} "
                  f"(r={r[s['auto_minus_fixed']['worst_index']]:g}); all - fixed: mean {s['all_minus_fixed']['mean']:+.2f}, "
                  f"worst {s['all_minus_fixed']['worst']:+.1f}; auto - all: mean {s['auto_minus_all']['mean']:+.2f}, "
                  f"worst {s['auto_minus_all']['worst']:+.1f}."]
    return "\n".join(lines) + "\n"


@click.command()
@click.option("--auto", "auto", type=click.Path(exists=True, file_okay=False), required=True)
@click.option("--all", "all_", type=click.Path(exists=True, file_okay=False), required=True)
@click.option("--fixed", type=click.Path(exists=True, file_okay=False), default=None)
@click.option("--seeds", type=click.IntRange(1), default=20, show_default=True)
@click.option("--n-max-sim", type=click.IntRange(1), default=None, help="Also simulate at this n-max.")
@click.option("--out", type=click.Path(file_okay=False), default=None, help="Write study.md and study.json here.")
def main(auto, all_, fixed, seeds, n_max_sim, out):
    """Prints the study as markdown."""
    doc = study(Path(auto), Path(all_), Path(fixed) if fixed else None, seeds, n_max_sim)
    text = markdown(doc)
    click.echo(text)
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "study.md").write_text(text)
        (Path(out) / "study.json").write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()

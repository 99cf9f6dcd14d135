"""What `diffsmooth table`'s plans cost and change for a table's first line, from measured table folders
(MEASURED) and, on paired simulated vote paths, against fixed-n CERTIFY (SIMULATED).

    python -m studies.table_study --auto DIR --all DIR [--fixed DIR] [--seeds 20]
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
import math
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import click
import numpy as np

from diffsmooth.engine.certify.cohen import lower_confidence_bounds
from diffsmooth.engine.certify.sequential import SequentialRule, radius_from_lower
from diffsmooth.engine.runs.results import read_rows
from diffsmooth.engine.runs.simulation import chunk_votes, shared_paths, simulate_sequential
from diffsmooth.engine.table.build import phase_path
from diffsmooth.engine.table.cost import Sampling, predict_run
from diffsmooth.engine.table.defaults import MARGIN, RACE_REACH_SIGMAS
from diffsmooth.engine.table.planning import assign_radii
from diffsmooth.engine.table.spec import LineSpec
from studies.replay import image_from_row


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
                   assigned: Optional[Dict[float, Sequence[float]]], pilot_mask: np.ndarray, n_max: int, n0: int,
                   alpha: float, seeds: int, margin: float = MARGIN, reach: float = RACE_REACH_SIGMAS, seed: int = 0) -> dict:
    """{plan: {'cells': [%], 'samples': mean total}} for fixed-n, all and auto on paired paths.
    `assigned` None: each seed plans auto as the table would, from its own simulated pilot rows
    (assign_radii on the pilot images' certified counts); the plans chosen are counted."""
    rng = np.random.default_rng(seed)
    per_plan = {plan: {"acc": [], "samples": []} for plan in ("fixed", "all", "auto")}
    plans_chosen: Dict[str, int] = {}
    sigmas = sorted(rates)
    for _ in range(seeds):
        acc = {plan: {} for plan in per_plan}
        samples = {plan: 0.0 for plan in per_plan}
        paths, all_runs = {}, {}
        for sigma in sigmas:
            p = rates[sigma]
            rule_all = SequentialRule(tuple(radii), sigma, alpha, n_max)
            cuts, segments = shared_paths(p, [rule_all], n_max, rng)     # every rule at n_max looks at the same counts
            paths[sigma] = (cuts, segments)
            fixed_radius = radius_from_lower(lower_confidence_bounds(segments.sum(axis=1), n_max, alpha), sigma)
            all_runs[sigma] = simulate_sequential(p, rule_all, None, votes=chunk_votes(cuts, segments, rule_all))
            samples["fixed"] += len(p) * (n0 + n_max)
            samples["all"] += float(all_runs[sigma][1].sum()) + len(p) * n0
            for plan, radius in (("fixed", fixed_radius), ("all", all_runs[sigma][0])):
                for r in radii:
                    acc[plan][r] = max(acc[plan].get(r, 0.0), 100 * float(np.mean(correct[sigma] & (radius > 0) & (radius >= r))))
        plan_radii = assigned
        if plan_radii is None:
            counts = {sigma: {r: int(np.sum(correct[sigma][pilot_mask] & (all_runs[sigma][0][pilot_mask] >= r)))
                              for r in radii} for sigma in sigmas}
            plan_radii = assign_radii(counts, int(pilot_mask.sum()), margin, reach)
            label = "; ".join(f"{s:g}: {','.join(f'{r:g}' for r in plan_radii[s]) or '-'}" for s in sigmas)
            plans_chosen[label] = plans_chosen.get(label, 0) + 1
        for sigma in sigmas:
            p = rates[sigma]
            all_radius, all_used = all_runs[sigma]
            radii_auto = tuple(plan_radii.get(sigma, ()))
            if radii_auto:
                rule_auto = SequentialRule(radii_auto, sigma, alpha, n_max)
                auto_radius, auto_used = simulate_sequential(p, rule_auto, None, votes=chunk_votes(*paths[sigma], rule_auto))
                auto_radius = np.where(pilot_mask, all_radius, auto_radius)      # the pilot settled every radius
                auto_used = np.where(pilot_mask, all_used, auto_used)
                samples["auto"] += float(auto_used.sum()) + len(p) * n0
            else:
                auto_radius = np.where(pilot_mask, all_radius, 0.0)
                samples["auto"] += float(all_used[pilot_mask].sum()) + int(pilot_mask.sum()) * n0
            for r in radii_auto:
                certified = correct[sigma] & (auto_radius > 0) & (auto_radius >= r)
                acc["auto"][r] = max(acc["auto"].get(r, 0.0), 100 * float(np.mean(certified)))
        for plan in per_plan:
            per_plan[plan]["acc"].append([acc[plan].get(r, 0.0) for r in radii])
            per_plan[plan]["samples"].append(samples[plan])
    out = {plan: {"cells": list(np.mean(v["acc"], axis=0)), "samples": float(np.mean(v["samples"]))}
           for plan, v in per_plan.items()}
    if plans_chosen:
        out["auto"]["plans_chosen"] = dict(sorted(plans_chosen.items(), key=lambda kv: -kv[1]))
    return out


def differences(a: Sequence[float], b: Sequence[float]) -> dict:
    d = np.asarray(a) - np.asarray(b)
    worst = int(np.argmax(np.abs(d)))
    return {"mean": float(d.mean()), "worst": float(d[worst]), "worst_index": worst, "max_abs": float(np.abs(d).max())}


def study(auto: Path, all_: Optional[Path], fixed: Optional[Path], seeds: int, n_max_sim: Optional[int],
          reach: Optional[float] = None) -> dict:
    """`reach`: the cap the simulated plans at --n-max-sim use (None: the measured plan's; uncapped
    for a plan written before the cap existed)."""
    s_auto = _summary(auto)
    s_all = _summary(all_) if all_ else None
    spec = s_auto["spec"]
    radii, sigmas = spec["radii"], spec["sigmas"]
    n0, n_max, alpha = spec["n0"], spec["n_max"], spec["alpha"]
    plan = json.loads((auto / "plan.json").read_text())
    assigned = {float(s): r for s, r in plan["radii"].items()}
    line = s_auto["rows"][0]["name"]
    first = spec["lines"][0]
    line_spec = LineSpec(first["name"], first["method"], {}, {}, {})
    out = {"line": line, "radii": radii, "sigmas": sigmas, "n0": n0, "n_max": n_max, "images": s_auto["images"],
           "margin": plan["margin"], "rates_from": "all" if s_all else "auto",
           "reach": reach if reach is not None else plan.get("reach", math.inf)}
    # MEASURED
    out["measured"] = {"auto": {"cells": _cells(s_auto)[line], "samples": s_auto["samples"],
                                "seconds": s_auto["seconds"], "runs": _run_seconds(auto, line_spec)}}
    if s_all:
        out["measured"]["all"] = {"cells": _cells(s_all)[line], "samples": s_all["samples"], "seconds": s_all["seconds"]}
        out["measured"]["auto_minus_all"] = differences(_cells(s_auto)[line], _cells(s_all)[line])
    if fixed is not None and all_:
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
        rows = _main_rows(all_ or auto, line_spec, sigma)
        images = [image_from_row(r, n_max, n0, alpha, sigma, 0.45) for r in rows]
        if idx is not None and [im.idx for im in images] != idx:
            raise click.ClickException(f"sigma {sigma:g} has rows for other images than the first sigma (a sigma "
                                       "without a main run has no rates for the main images): pass --all")
        rates[sigma] = np.array([im.p for im in images])
        correct[sigma] = np.array([im.correct for im in images])
        idx = [im.idx for im in images]
    pilot_mask = np.array([i in pilot for i in idx])
    for n in [n_max] + ([n_max_sim] if n_max_sim else []):
        # at the measured n-max the plan the table fixed; at another n-max, planned per seed as the table would
        sim = simulate_table(rates, correct, radii, assigned if n == n_max else None, pilot_mask, n, n0, alpha,
                             seeds, margin=plan["margin"], reach=out["reach"])
        out[f"simulated_n{n}"] = {
            **sim, "fewer_auto_vs_fixed": sim["fixed"]["samples"] / sim["auto"]["samples"],
            "fewer_all_vs_fixed": sim["fixed"]["samples"] / sim["all"]["samples"],
            "auto_minus_fixed": differences(sim["auto"]["cells"], sim["fixed"]["cells"]),
            "all_minus_fixed": differences(sim["all"]["cells"], sim["fixed"]["cells"]),
            "auto_minus_all": differences(sim["auto"]["cells"], sim["all"]["cells"])}
    return out


def _run_seconds(folder: Path, line: LineSpec) -> dict:
    """Per main run: predicted and measured seconds and samples (cost.json), and the prediction this
    version makes from the same pilot rows and timing-probe rate (it is deterministic), to compare
    after a change of the predictor."""
    costs = json.loads((folder / "cost.json").read_text())
    plan = json.loads((folder / "plan.json").read_text())
    spec = _summary(folder)["spec"]
    measured = costs.get("measured", {})
    out = {}
    for key, c in costs["runs"].items():
        out[key] = {"predicted_seconds": c["seconds"], "predicted_samples": c["samples"],
                    "measured_seconds": measured.get(key, {}).get("seconds"),
                    "measured_samples": measured.get(key, {}).get("samples")}
        if c.get("samples_per_second"):
            rows = sorted(read_rows(phase_path(folder, line, c["sigma"], "pilot")), key=lambda r: int(r["idx"]))
            again = predict_run(c["line"], c["sigma"], [rows], plan["radii"][f"{c['sigma']:g}"], c["images"],
                                Sampling(spec["n0"], spec["alpha"], spec["n_max"]), c["samples_per_second"])
            out[key].update(repredicted_samples=again.samples, repredicted_seconds=again.seconds)
    return out


def estimate_line(doc: dict, seconds_per_image: float, at_n: int, images: int, warmup_s: float, builds: int,
                  overhead: float) -> dict:
    """ESTIMATED: a full line of `images` images at n-max `at_n` on a GPU from the simulated samples
    per image (auto and fixed-n at `at_n`), a measured fixed-n rate (seconds per image at n = at_n),
    the measured sequential packing overhead per sample, and one compile warm-up per model build."""
    sim = doc[f"simulated_n{at_n}"]
    per_sample = seconds_per_image / (doc["n0"] + at_n)
    simulated_images = doc["images"] * 1.0
    out = {"images": images, "at_n": at_n, "seconds_per_image_fixed": seconds_per_image, "warmup_s": warmup_s,
           "builds": builds, "sequential_overhead": overhead}
    for plan in ("fixed", "all", "auto"):
        samples = sim[plan]["samples"] / simulated_images * images
        rate = per_sample * (1.0 if plan == "fixed" else overhead)
        warmups = builds if plan == "auto" else len(doc["sigmas"])
        out[plan] = {"samples": samples, "seconds": samples * rate + warmups * warmup_s}
    return out


def _row(label: str, samples, cells) -> str:
    samples = f"{samples:,.0f}" if isinstance(samples, (int, float)) else samples
    return f"| {label} | {samples} | " + " | ".join(f"{v:.1f}" for v in cells) + " |"


def markdown(doc: dict) -> str:
    r = doc["radii"]
    head = "| | samples | " + " | ".join(f"r={x:g}" for x in r) + " |\n|" + "---|" * (len(r) + 2)
    m = doc["measured"]
    lines = [f"## MEASURED: {doc['line']}, {doc['images']} images, sigma {doc['sigmas']}, n0 {doc['n0']}, "
             f"n-max {doc['n_max']:,}", "", head]
    for plan in ("auto", "all"):
        if plan in m:
            lines.append(_row(plan, m[plan]["samples"]["total"], m[plan]["cells"]))
    a = m["auto"]
    if "auto_minus_all" in m:
        d = m["auto_minus_all"]
        lines += ["", f"auto - all (points): mean {d['mean']:+.2f}, largest |difference| {d['max_abs']:.1f} "
                  f"(at r={r[d['worst_index']]:g})."]
    lines += ["", f"auto: pilot {a['samples']['pilot']:,} of {a['samples']['total']:,} samples "
              f"({100 * a['samples']['pilot'] / a['samples']['total']:.1f}%)."]
    predicted, measured = a["seconds"]["predicted"], a["seconds"]["measured"]
    if predicted and measured:
        lines += [f"Main phase: predicted {predicted:,.0f} s, measured {measured:,.0f} s of compute "
                  f"(measured / predicted {measured / predicted:.2f}). Per run:", "",
                  "| run | predicted samples | measured samples | predicted s | measured s | measured / predicted s |",
                  "|---|---|---|---|---|---|"]
        for key, run in a["runs"].items():
            ms = run["measured_seconds"]
            lines.append(f"| {key.replace(' | ', ', ')} | {run['predicted_samples']:,.0f} | {run['measured_samples'] or 0:,} | "
                         f"{run['predicted_seconds']:,.0f} | {ms or 0:,.0f} | "
                         f"{ms / run['predicted_seconds'] if ms and run['predicted_seconds'] else float('nan'):.2f} |")
        again = [run for run in a["runs"].values() if "repredicted_seconds" in run]
        if again and len(again) == len(a["runs"]):
            samples, seconds = (sum(run[k] for run in again) for k in ("repredicted_samples", "repredicted_seconds"))
            lines += ["", f"This version's predictor on the same pilot rows and probe rates (deterministic): "
                      f"{samples:,.0f} samples, {seconds:,.0f} s (measured / predicted {measured / seconds:.2f})."]
    if "fixed_subset" in m:
        f = m["fixed_subset"]
        lines += ["", f"Fixed-n (MEASURED) on {f['images']} of the images per sigma, against the all table's rows on the "
                  "same images:", "", head, _row("fixed-n", f["samples"]["total"], f["cells"]),
                  _row("all, same images", "-", f["all_cells_same_images"]),
                  "", f"all - fixed-n (points): mean {f['all_minus_fixed']['mean']:+.2f}, worst "
                  f"{f['all_minus_fixed']['worst']:+.1f}."]
    for key in [k for k in doc if k.startswith("simulated_n")]:
        s = doc[key]
        n = int(key[len("simulated_n"):])
        how = ("the plan the table fixed" if n == doc["n_max"] else
               f"planned per seed from its simulated pilot, reach {doc['reach']:g}")
        lines += ["", f"## SIMULATED on paired paths, n-max {n:,} (rates from the {doc['rates_from']} table's rows; "
                  f"auto: {how})", "", head]
        for plan in ("fixed", "all", "auto"):
            lines.append(_row(plan, s[plan]["samples"], s[plan]["cells"]))
        lines += ["", f"fewer samples than fixed-n: auto {s['fewer_auto_vs_fixed']:.1f}x, all {s['fewer_all_vs_fixed']:.1f}x; "
                  f"auto - fixed (points): mean {s['auto_minus_fixed']['mean']:+.2f}, "
                  f"worst {s['auto_minus_fixed']['worst']:+.1f} "
                  f"(r={r[s['auto_minus_fixed']['worst_index']]:g}); all - fixed: mean {s['all_minus_fixed']['mean']:+.2f}, "
                  f"worst {s['all_minus_fixed']['worst']:+.1f}; auto - all: mean {s['auto_minus_all']['mean']:+.2f}, "
                  f"worst {s['auto_minus_all']['worst']:+.1f}."]
        if "plans_chosen" in s["auto"]:
            lines += ["", "Plans the simulated pilots chose (sigma: radii; seeds): " +
                      "; ".join(f"[{k}] x{v}" for k, v in s["auto"]["plans_chosen"].items())]
    if "estimate" in doc:
        e = doc["estimate"]
        lines += ["", f"## ESTIMATED: one line of {e['images']} images, 3 sigmas, n-max {e['at_n']:,}, on a GPU", "",
                  f"From the simulated samples per image above, {e['seconds_per_image_fixed']} s per image fixed-n at "
                  f"n = {e['at_n']:,} (measured), the sequential path's {e['sequential_overhead']:.2f}x time per sample "
                  f"(measured, packed replay) and {e['warmup_s']:.0f} s of compile warm-up per model build (measured; "
                  f"auto builds {e['builds']}, fixed-n and all {len(doc['sigmas'])}):", "",
                  "| plan | samples | seconds | minutes |", "|---|---|---|---|"]
        for plan in ("fixed", "all", "auto"):
            lines.append(f"| {plan} | {e[plan]['samples']:,.0f} | {e[plan]['seconds']:,.0f} | {e[plan]['seconds'] / 60:.1f} |")
    return "\n".join(lines) + "\n"


@click.command()
@click.option("--auto", "auto", type=click.Path(exists=True, file_okay=False), required=True)
@click.option("--all", "all_", type=click.Path(exists=True, file_okay=False), default=None,
              help="The same table with --plan all (rates for the simulation come from it when given).")
@click.option("--fixed", type=click.Path(exists=True, file_okay=False), default=None)
@click.option("--seeds", type=click.IntRange(1), default=20, show_default=True)
@click.option("--n-max-sim", type=click.IntRange(1), default=None, help="Also simulate at this n-max.")
@click.option("--estimate", nargs=2, type=(float, click.IntRange(1)), default=None,
              help="SECONDS IMAGES: estimate a line of IMAGES images at --n-max-sim from a measured fixed-n rate "
                   "(seconds per image at n = --n-max-sim).")
@click.option("--warmup-s", type=click.FloatRange(0), default=60.0, show_default=True,
              help="--estimate: compile warm-up per model build (H100, CIFAR-10, measured).")
@click.option("--overhead", type=click.FloatRange(0), default=1.12, show_default=True,
              help="--estimate: the sequential path's time per sample over fixed-n's (H100 packed replay, measured).")
@click.option("--reach", type=click.FloatRange(0, min_open=True), default=None,
              help="The reach cap of the plans simulated at --n-max-sim [default: the measured plan's].")
@click.option("--out", type=click.Path(file_okay=False), default=None, help="Write study.md and study.json here.")
def main(auto, all_, fixed, seeds, n_max_sim, estimate, warmup_s, overhead, reach, out):
    """Prints the study as markdown."""
    doc = study(Path(auto), Path(all_) if all_ else None, Path(fixed) if fixed else None, seeds, n_max_sim, reach)
    if estimate:
        if not n_max_sim:
            raise click.UsageError("--estimate needs --n-max-sim (the n-max of the estimated line)")
        builds = 2 * len(doc["sigmas"]) - 1     # pilot and main per sigma; the main phase keeps the last pilot's models
        doc["estimate"] = estimate_line(doc, estimate[0], n_max_sim, estimate[1], warmup_s, builds, overhead)
    text = markdown(doc)
    click.echo(text)
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "study.md").write_text(text)
        (Path(out) / "study.json").write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()

"""The comparison with the paper's cells (engine/table/published.py, engine/table/rerun_cells.py) calibrated on the
embedded demo table: the demo's RS line certified at several seeds (the same 500 images, other Monte Carlo noise),
each seed's cells taken in turn as "the paper" ([[published]] rows built from them, printed to 0.1 point) beside every
other seed's table; and planted set-up mistakes (the same table, another seed) beside every seed. It reports the
fraction of reachable cells inside their interval (goal: >= 95%), how often a row's shift test fires between seeds
(goal: about its 1% level), and whether a planted shortfall is marked, with its size. The "paper" here ran the same
plan, so the comparison models it as another run of our plan (`reference="same"`; a table's own outputs model the
paper as fixed-n CERTIFY at the spec's N).

    python -m studies.published_calibration --out DIR [--seeds 0,1,2,3,4] [--images 500] [--n-max 200]
        [--plan fixed] [--plant one-up,alpha4,alpha10,scale] [--budget-minutes 240] [--json FILE]

Every table is an ordinary `diffsmooth table` folder under DIR (resumable: a rerun skips finished rows and only
rewrites the outputs; no new table starts once the time budget is spent). Only the RS line runs: its classifier is
cheap on 2 CPU cores, where the demo's UNet lines draw about 20 samples a second.
"""

from __future__ import annotations

import dataclasses
import json
import time
from itertools import permutations
from pathlib import Path
from typing import Dict, List

import click

from diffsmooth.engine.base_classifier.methods import MethodConfig, method_named
from diffsmooth.engine.table.build import TableBuilder, TablePlanning
from diffsmooth.engine.table.outputs import table_runs
from diffsmooth.engine.table.published import against_noise
from diffsmooth.engine.table.report import Cell, line_cells
from diffsmooth.engine.table.rerun_cells import TableRuns
from diffsmooth.engine.table.spec import PublishedRow, TableSpec, demo_spec

SCALE = 0.9                     # the `scale` plant: every sigma 10% smaller, the same classifiers


def _classifier(sigma: float) -> str:
    return str(method_named("rs").demo_classifier(MethodConfig("rs", sigma)))


def planted(spec: TableSpec, plant: str) -> TableSpec:
    """The demo spec with a set-up mistake: `scale` (the noise 10% smaller than the classifiers were trained for:
    sigma 0.225, 0.45, 0.9 with the 0.25, 0.5, 1.0 classifiers), `one-up` (at sigma 0.25 and 0.5 the classifier
    trained at the next sigma up, 0.5 and 1.0), `alphaK` (alpha K times smaller than the paper's)."""
    line = spec.lines[0]
    sigmas = spec.sigmas
    if plant == "scale":
        scaled = tuple(round(SCALE * s, 6) for s in sigmas)
        classifier = {new: (_classifier(old),) for new, old in zip(scaled, sigmas)}
        return dataclasses.replace(spec, sigmas=scaled, lines=(dataclasses.replace(line, classifier=classifier),))
    if plant == "one-up":
        up = {s: (_classifier(sigmas[min(k + 1, len(sigmas) - 1)]),) for k, s in enumerate(sigmas)}
        return dataclasses.replace(spec, lines=(dataclasses.replace(line, classifier=up),))
    if plant.startswith("alpha") and plant[5:].isdigit():
        return dataclasses.replace(spec, alpha=spec.alpha / int(plant[5:]))
    raise click.BadParameter(f"unknown plant {plant!r} (scale, one-up, alphaK)")


@dataclasses.dataclass(frozen=True)
class Finished:
    """A finished table: its runs as the comparison reads them, its cells and its images."""

    name: str
    runs: TableRuns
    cells: Dict[str, List[Cell]]
    images: int


def finished(name: str, spec: TableSpec, out: Path, plan: str, log) -> Finished:
    """Run (or resume) one table and read its rows and cells from the plan's outcome."""
    builder = TableBuilder(spec, out, planning=TablePlanning(plan=plan, pilot=4), log=log, progress=False)
    builder.build()
    outcome = builder.outcome
    images = len({row["idx"] for per in outcome.rows_by_line.values() for c in per.values() for rows in c.values()
                  for row in rows})
    cells = {line: line_cells(per, spec.radii, images, outcome.settles) for line, per in outcome.rows_by_line.items()}
    return Finished(name, table_runs(spec, outcome), cells, images)


def as_paper(table: Finished) -> List[PublishedRow]:
    """A table's cells as the paper prints them: one [[published]] row per line, in percent to 0.1 point."""
    return [PublishedRow(name, (name,), tuple((c.radius, round(100.0 * c.certified / c.images, 1)) for c in cells))
            for name, cells in table.cells.items()]


def compare_pair(paper: Finished, ours: Finished, seed: int) -> dict:
    """`ours` against `paper`'s cells: every cell (inside, outside, beyond reach) and each row's shift."""
    compared, shifts = against_noise(as_paper(paper), ours.cells, ours.runs, ours.images, "same", seed=seed)
    cells = [c for row in compared.values() for c in row]
    return {"paper": paper.name, "ours": ours.name, "reachable": sum(c.reach for c in cells),
            "outside": sum(c.outside for c in cells), "beyond_reach": sum(not c.reach for c in cells),
            "cells": [dict(c.as_dict(), row=c.row) for c in cells],
            "rows": {name: s.as_dict() for name, s in shifts.rows.items()}, "findings": shifts.findings}


def calibrate(tables: Dict[str, Finished], plants: Dict[str, Finished]) -> dict:
    """Every ordered pair of seeds, and every plant against every seed."""
    pairs = [compare_pair(tables[a], tables[b], k) for k, (a, b) in enumerate(permutations(sorted(tables), 2))]
    reachable = sum(p["reachable"] for p in pairs)
    inside = reachable - sum(p["outside"] for p in pairs)
    rows = [row for p in pairs for row in p["rows"].values()]
    planted_pairs = {name: [compare_pair(tables[a], plant, 1000 + k) for k, a in enumerate(sorted(tables))]
                     for name, plant in plants.items()}
    return {"seed_pairs": {"pairs": len(pairs), "reachable_cells": reachable, "inside": inside,
                           "coverage": inside / reachable if reachable else None,
                           "beyond_reach": sum(p["beyond_reach"] for p in pairs),
                           "row_shift_marked": sum(r["marked"] for r in rows), "row_tests": len(rows),
                           "row_p_values": [r["p_value"] for r in rows]},
            "plants": {name: _plant_summary(found) for name, found in planted_pairs.items()},
            "pairs": pairs, "planted_pairs": planted_pairs}


def _plant_summary(found: List[dict]) -> dict:
    shifts = [row for p in found for row in p["rows"].values()]
    return {"against_seeds": len(found), "shift_points": [s["points"] for s in shifts],
            "p_values": [s["p_value"] for s in shifts], "marked": sum(s["marked"] for s in shifts),
            "cells_outside": [p["outside"] for p in found], "reachable": [p["reachable"] for p in found]}


def report(result: dict) -> List[str]:
    """The printed lines."""
    seeds = result["seed_pairs"]
    lines = [f"seed pairs: {seeds['pairs']} ordered pairs, {seeds['inside']} of {seeds['reachable_cells']} reachable "
             f"cells inside their 95% interval ({100 * (seeds['coverage'] or 0):.1f}%, measured); "
             f"{seeds['beyond_reach']} cells beyond reach; row shift marked in {seeds['row_shift_marked']} of "
             f"{seeds['row_tests']} tests (1% level)"]
    for name, plant in result["plants"].items():
        points = plant["shift_points"]
        if not points:
            continue
        lines.append(f"plant {name}: paper - measured {sum(points) / len(points):+.2f} points on average "
                     f"(per seed: {', '.join(f'{p:+.2f}' for p in points)}); shift marked against "
                     f"{plant['marked']} of {len(points)} seeds (p: {', '.join(f'{p:.2g}' for p in plant['p_values'])}); "
                     f"cells outside: {plant['cells_outside']} of {plant['reachable']}")
    return lines


@click.command()
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True, help="The tables' folder.")
@click.option("--seeds", default="0,1,2,3,4", show_default=True, help="The demo table's seeds.")
@click.option("--images", type=int, default=500, show_default=True)
@click.option("--n-max", "n_max", type=int, default=200, show_default=True)
@click.option("--plant", "plants", default="one-up,alpha4,alpha10,scale", show_default=True, help="Planted mistakes (or '').")
@click.option("--plant-seed", type=int, default=100, show_default=True)
@click.option("--plan", type=click.Choice(["fixed", "race", "all"]), default="fixed", show_default=True)
@click.option("--threads", type=int, default=1, show_default=True)
@click.option("--budget-minutes", type=float, default=240.0, show_default=True,
              help="No new table starts after this; the report reads the finished ones.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path), default=None)
def main(out, seeds, images, n_max, plants, plant_seed, plan, threads, budget_minutes, json_out):
    """Run the demo tables (resumable) and report the calibration."""
    start = time.monotonic()
    base = demo_spec(("rs",), images, n_max, threads=threads)
    jobs = [(f"seed-{s}", dataclasses.replace(base, seed=int(s))) for s in seeds.split(",") if s.strip()]
    jobs += [(f"plant-{p}", planted(dataclasses.replace(base, seed=plant_seed), p)) for p in plants.split(",") if p]
    done: Dict[str, Finished] = {}
    for name, spec in jobs:
        folder = out / name
        if time.monotonic() - start > 60 * budget_minutes and not (folder / "summary.json").exists():
            click.echo(f"{name}: not run (the time budget is spent)", err=True)
            continue
        done[name] = finished(name, spec, folder, plan, lambda line, name=name: click.echo(f"[{name}] {line}", err=True))
    tables = {k: v for k, v in done.items() if k.startswith("seed-")}
    result = calibrate(tables, {k: v for k, v in done.items() if k.startswith("plant-")})
    result.update(images=images, n_max=n_max, plan=plan, seeds=sorted(tables), seconds=time.monotonic() - start)
    for line in report(result):
        click.echo(line)
    if json_out is not None:
        json_out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()

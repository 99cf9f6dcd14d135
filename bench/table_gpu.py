"""The demo table on several devices and precisions, its rows compared with the first variant's
(the same noise: equal rows where the arithmetic agrees), with wall time and model builds per variant.
`bench/gpu_check.sh OUT table` runs it on CUDA (fp32 eager and fp16 compiled against the CPU).

    python -m diffsmooth.bench.table_gpu --out DIR [--variant cpu:fp32 --variant cuda:fp32 --variant cuda:fp16+compile]
        [--images 8] [--n-max 500] [--rows rs,dds,diffsmooth]
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from pathlib import Path
from typing import Dict, List, Tuple

import click

from diffsmooth.engine.runs.fast_path import tf32_off
from diffsmooth.engine.runs.results import read_rows
from diffsmooth.engine.table.build import TableBuilder, TablePlanning
from diffsmooth.engine.table.spec import demo_spec

Key = Tuple[str, int]                   # (run file relative to runs/, image index)


def parse_variant(text: str) -> Tuple[str, str, bool]:
    """'cuda:fp16+compile' -> ('cuda', 'fp16', True)."""
    device, _, rest = text.partition(":")
    precision, _, extra = (rest or "fp32").partition("+")
    if device not in ("cpu", "cuda") or precision not in ("fp32", "fp16", "bf16") or extra not in ("", "compile"):
        raise click.BadParameter(f"{text!r}: DEVICE:PRECISION[+compile], e.g. cuda:fp16+compile")
    return device, precision, extra == "compile"


def table_rows(folder: Path) -> Dict[Key, Tuple[str, str, str]]:
    """(predict, radius, samples) of every row of a table folder's runs, by file and image."""
    out = {}
    for path in sorted((folder / "runs").rglob("*.tsv")):
        for row in read_rows(path):
            out[(str(path.relative_to(folder / "runs")), int(row["idx"]))] = (row["predict"], row["radius"],
                                                                               row.get("samples", ""))
    return out


def compare(reference: Dict[Key, tuple], other: Dict[Key, tuple]) -> dict:
    """Rows equal, rows that differ (first few named) and rows only one side has."""
    shared = sorted(set(reference) & set(other))
    differ = [k for k in shared if reference[k] != other[k]]
    return {"rows": len(shared), "equal": len(shared) - len(differ), "differ": len(differ),
            "first_differences": [{"run": k[0], "idx": k[1], "reference": reference[k], "this": other[k]}
                                  for k in differ[:5]],
            "only_reference": len(set(reference) - set(other)), "only_this": len(set(other) - set(reference))}


def run_variant(out: Path, number: int, rows: Tuple[str, ...], images: int, n_max: int, device: str, precision: str,
                compiled: bool, plan: str) -> dict:
    """One variant's table into OUT/K-DEVICE-PRECISION[-compile] (a folder of its own, never a resumed
    one); its wall time and summary figures."""
    name = f"{number}-{device}-{precision}" + ("-compile" if compiled else "")
    spec = demo_spec(rows, images, n_max, device, batch=500, compile=compiled)
    spec = dataclasses.replace(spec, run={**spec.run, "precision": precision})
    start = time.perf_counter()
    # TF32 off for CUDA's fp32 variant (torch lets cuDNN use TF32 by default), so its rows differ from the
    # CPU's only where fp32 reductions in another order flip a vote (with TF32 on: 2 of 100 rows on an H200)
    with tf32_off() if device == "cuda" and precision == "fp32" else contextlib.nullcontext():
        TableBuilder(spec, out / name, TablePlanning(plan, pilot=2), log=lambda line: None, progress=False).build()
    wall = time.perf_counter() - start
    summary = json.loads((out / name / "summary.json").read_text())
    return {"name": name, "wall_s": wall, "samples": summary["samples"]["total"],
            "builds": summary.get("builds"), "compiles": summary.get("compiles"),
            "cells": {row["name"]: [c["certified_accuracy"] for c in row["cells"]] for row in summary["rows"]}}


@click.command()
@click.option("--out", required=True, type=click.Path(file_okay=False))
@click.option("--variant", "variants", multiple=True, default=("cpu:fp32", "cuda:fp32", "cuda:fp16+compile"),
              show_default=True, help="DEVICE:PRECISION[+compile]; the first is the reference.")
@click.option("--images", type=click.IntRange(1, 500), default=8, show_default=True)
@click.option("--n-max", type=click.IntRange(1), default=500, show_default=True)
@click.option("--rows", default="rs,dds,diffsmooth", show_default=True)
@click.option("--plan", default="race", show_default=True)
def main(out, variants, images, n_max, rows, plan):
    """Prints one JSON object: each variant's wall time, builds and cells, and its rows against the first's."""
    out = Path(out)
    names = tuple(r.strip() for r in rows.split(",") if r.strip())
    results: List[dict] = []
    reference = None
    for number, text in enumerate(variants):
        device, precision, compiled = parse_variant(text)
        result = run_variant(out, number, names, images, n_max, device, precision, compiled, plan)
        got = table_rows(out / result["name"])
        if reference is None:
            reference = got
        else:
            result["against_first"] = compare(reference, got)
        results.append(result)
        (out / "table_gpu.json").write_text(json.dumps(results, indent=1) + "\n")
    click.echo(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

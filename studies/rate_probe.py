"""MEASURED: the votes a demo table line's images give beyond their rows, to check vote-rate models.

    python -m studies.rate_probe --rows rs --folder DIR --sigma S --unanimous U --near N \
        --more M [--compile] [--threads 1] --out FILE.json [--time]

The run is built as a table builds it (demo_spec, spec.request_options, resolve_run, build_voter; as
studies/selected_classes.py does). The noise is counter-based: sample j of image i under the table's seed
is the same in every run, so counting samples [row end, row end + M) continues each image's row exactly
where it stopped. For the sigma, each image's longest row in the folder's runs (every file of that
sigma, as studies/race_study.py reads them) is its row; rows whose class is known (predict >= 0 or a
`selected` column) are candidates:

- `--unanimous U`: U rows with every vote (top_votes == samples - n0), evenly spaced in image order;
- `--near N`: N rows that missed a vote and whose rate (Jeffreys' estimate) lies nearest, on the scale of
  log(1 - p), to Phi(t) for a threshold t = r / sigma in 2 to 3.5 (the thresholds a race at n-max 100,000
  decides with few misses).

The selected class's votes are counted in chunks of `--chunk` samples; the JSON is rewritten after
every chunk (a killed probe keeps what it counted). `--time` counts a small batch and prints samples per
second instead. `--verify K` first recounts the estimation samples of K probed rows and refuses a
difference (a check that this build reproduces the stored rows; the K shortest probed rows).
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

import click
import numpy as np
from scipy.stats import norm

from diffsmooth.engine.runs.execute import build_voter
from diffsmooth.engine.runs.request import RunRequest
from diffsmooth.engine.runs.resolve import resolve_run
from diffsmooth.engine.runs.results import read_rows
from diffsmooth.engine.table.spec import DEMO_ROWS, demo_spec

THRESHOLDS = (2.0, 2.5, 3.0, 3.5)


def longest_rows(folder: Path, sigma: float) -> Dict[int, dict]:
    """{image: its row with the most samples} over every result file of the sigma in folder/runs."""
    runs = folder / "runs"
    best: Dict[int, dict] = {}
    for path in sorted(runs.glob(f"*_s{sigma:g}.tsv")) + sorted(runs.glob(f"*_s{sigma:g}_*.tsv")):
        for row in read_rows(path):
            i = int(row["idx"])
            if i not in best or int(row["samples"]) > int(best[i]["samples"]):
                best[i] = row
    return best


def row_class(row: dict) -> Optional[int]:
    """The class whose votes the row's top_votes counts, where the row says it."""
    if int(row["predict"]) >= 0:
        return int(row["predict"])
    if row.get("selected") not in (None, ""):
        return int(row["selected"])
    return None


def pick_images(rows: Dict[int, dict], n0: int, sigma: float, radii, unanimous: int, near: int) -> List[dict]:
    """The probed images: `unanimous` rows with every vote evenly spaced in image order, and `near` rows that
    missed a vote with rates nearest the thresholds (module docstring)."""
    known = [(i, r) for i, r in sorted(rows.items()) if row_class(r) is not None and int(r["samples"]) > n0]
    every = [(i, r) for i, r in known if int(r["top_votes"]) == int(r["samples"]) - n0]
    missed = [(i, r) for i, r in known if int(r["top_votes"]) < int(r["samples"]) - n0]
    picked = [every[int(j)] for j in np.linspace(0, len(every) - 1, min(unanimous, len(every))).round()] if every else []
    ts = [r / sigma for r in radii if THRESHOLDS[0] - 1e-9 <= r / sigma <= THRESHOLDS[-1] + 1e-9] or list(THRESHOLDS)
    targets = np.log1p(-norm.cdf(ts))

    def distance(item):
        r = item[1]
        k, n = int(r["top_votes"]), int(r["samples"]) - n0
        return float(np.min(np.abs(math.log(1 - (k + 0.5) / (n + 1)) - targets)))

    picked += sorted(missed, key=distance)[:near]
    out, seen = [], set()
    for i, r in picked:
        if i not in seen:
            seen.add(i)
            out.append({"idx": i, "label": int(r["label"]), "class": row_class(r), "samples": int(r["samples"]),
                        "drawn": int(r["samples"]) - n0, "top_votes": int(r["top_votes"]),
                        "unanimous": int(r["top_votes"]) == int(r["samples"]) - n0, "probe_votes": 0, "probe_drawn": 0,
                        "chunks": []})
    return out


def build(row: str, images: int, sigma: float, compile: bool, threads: Optional[int], scratch: str):
    spec = demo_spec(rows=(row,), images=images, threads=threads, compile=compile)
    line = spec.lines[0]
    request = RunRequest.parse("certify", out=str(Path(scratch) / f"s{sigma:g}.tsv"), **spec.request_options(line, sigma))
    run = resolve_run(request)
    return spec, run, build_voter(run, lambda message: None)


def count(voter, run, probes: List[dict], first_of, num: int, batch: int) -> List[int]:
    """The selected class's votes on samples [first_of(p), first_of(p) + num) of each probe, one count_many per
    first sample."""
    out = [0] * len(probes)
    groups: Dict[int, List[int]] = {}
    for j, p in enumerate(probes):
        groups.setdefault(first_of(p), []).append(j)
    for first, members in sorted(groups.items()):
        counts = voter.count_many([(probes[j]["idx"], run.dataset[probes[j]["idx"]][0]) for j in members], first, num,
                                  batch)
        for j, c in zip(members, counts):
            out[j] = int(np.asarray(c)[0][probes[j]["class"]])
    return out


@click.command()
@click.option("--rows", "row", type=click.Choice(DEMO_ROWS), required=True, help="The demo line.")
@click.option("--folder", type=click.Path(exists=True, file_okay=False, path_type=Path), required=True,
              help="The table folder whose rows are probed (its runs/).")
@click.option("--images", type=int, default=None, help="The table's --images (default: the folder's summary.json).")
@click.option("--sigma", type=float, required=True)
@click.option("--unanimous", type=int, default=40, show_default=True)
@click.option("--near", type=int, default=20, show_default=True)
@click.option("--more", type=int, default=5000, show_default=True, help="Samples counted beyond each row's end.")
@click.option("--chunk", type=int, default=1000, show_default=True)
@click.option("--batch", type=int, default=1000, show_default=True)
@click.option("--compile", is_flag=True, help="Compiled stages (as the stored runs were made).")
@click.option("--threads", type=int, default=1, show_default=True)
@click.option("--verify", type=int, default=0, show_default=True, help="Recount the rows of this many probed images.")
@click.option("--time", "timing", is_flag=True, help="Count 2 images x 500 samples and print samples per second.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None)
def main(row, folder, images, sigma, unanimous, near, more, chunk, batch, compile, threads, verify, timing, out):
    summary = json.loads((folder / "summary.json").read_text())
    data = summary["spec"]["data"]
    images = images or int(data["max"]) // int(data.get("skip", 1))
    with tempfile.TemporaryDirectory() as scratch:
        started = time.perf_counter()
        spec, run, voter = build(row, images, sigma, compile, threads, scratch)
        n0 = spec.n0
        rows = longest_rows(folder, sigma)
        missing = sorted(set(rows) - set(run.indices))
        if missing:
            raise click.ClickException(f"rows of images {missing[:5]} are not in the demo selection of {images} images")
        probes = pick_images(rows, n0, sigma, spec.radii, unanimous, near)
        click.echo(f"built in {time.perf_counter() - started:.1f} s; {len(probes)} images "
                   f"({sum(p['unanimous'] for p in probes)} with every vote)")
        if timing:
            started = time.perf_counter()
            count(voter, run, probes[:2], lambda p: p["samples"], 500, batch)
            click.echo(f"{1000 / (time.perf_counter() - started):.0f} samples/s")
            return
        checked = sorted(probes, key=lambda q: q["drawn"])[:verify]
        for p in checked:
            votes = count(voter, run, [p], lambda q: n0, p["drawn"], batch)[0]
            if votes != p["top_votes"]:
                raise click.ClickException(f"image {p['idx']}: recounted {votes} votes of {p['drawn']}, the row has "
                                           f"{p['top_votes']}: another build than the stored rows'")
            click.echo(f"verified image {p['idx']}: {votes} of {p['drawn']}")
        doc = {"line": spec.lines[0].name, "row": row, "folder": str(folder), "sigma": sigma, "n0": n0,
               "seed": spec.seed, "compile": compile, "more": more, "chunk": chunk,
               "verified": [p["idx"] for p in checked], "label": "MEASURED", "images": probes, "seconds": 0.0}
        out.parent.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        for done in range(0, more, chunk):
            num = min(chunk, more - done)
            votes = count(voter, run, probes, lambda p: p["samples"] + done, num, batch)
            for p, v in zip(probes, votes):
                p["probe_votes"] += v
                p["probe_drawn"] += num
                p["chunks"].append(v)
            doc["seconds"] = round(time.perf_counter() - started, 1)
            out.write_text(json.dumps(doc, indent=1) + "\n")
            kept = sum(p["unanimous"] and p["probe_votes"] == p["probe_drawn"] for p in probes)
            click.echo(f"{done + num} of {more} more samples, {doc['seconds']:.0f} s; every vote kept by {kept} of "
                       f"{sum(p['unanimous'] for p in probes)}", err=True)


if __name__ == "__main__":
    main()

"""One image's samples over ranks, side by side in one run (gloo on the CPU, one thread per process):
one image's certification latency in one process and on N ranks (fixed n and sequential), the demo table
(race) in one process and on N ranks, each pass's shares of samples per rank on more ranks, and the cost
of a batch's meeting (with and without the ranks' identity check) and of a merge on 2, 4 and 8 ranks.

    python -m diffsmooth.bench.ranks [--parts image,table,shares,merge] [--ranks 2] [--share-ranks 4]
        [--n 4000] [--images 16] [--n-max 2000] [--out DIR]

`image`: the Python API (DiffSmooth on the demo models, sigma 0.5, sigma' 0.25, m 5) certifies one image
after a warm-up; the seconds are the call's own (models built, process group joined). `table`: the
command line (`diffsmooth table --demo`), whole processes timed. `shares`: summary.json's ranks.phases.
`merge`: 2, 4 and 8 gloo processes meet as after a batch (which of 64 images every rank completed): the old
meeting (a SUM of the flags alone), the meeting with the identity check and no image joined, and with 4 images
joined (their digests computed); then they sum 64 images' counts (10 classes), 200 times each."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Optional

import click
import torch
import torch.multiprocessing as mp

IMAGE_INDEX = 7
RADII = "0.25,0.5,0.75,1.0"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- one image ------------------------------------------------------------------------------------

def _image_worker(rank: int, world: int, port: int, n: int, out: str) -> None:
    """A torchrun-like rank (or one process): certify one demo image at fixed n and sequentially, timed."""
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world), RANK=str(rank),
                          LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    from diffsmooth import DiffSmooth, load_dataset, load_demo_classifier, load_demo_denoiser
    from diffsmooth.engine.runs.request import sequential_rule
    from diffsmooth.engine.runs.sharding import wait_for_all
    model = DiffSmooth(denoiser=load_demo_denoiser(), classifier=load_demo_classifier(0.25), sigma=0.5,
                       local_sigma=0.25, m=5)
    x, label = load_dataset("embedded")[IMAGE_INDEX]
    model.certify(x, n0=100, n=200, image_index=IMAGE_INDEX + 1)          # warm-up: another image's noise
    smooth = model.smooth_for(tuple(x.shape))
    batch = model.batch_for(tuple(x.shape))
    result = {}
    for kind in ("fixed", "sequential"):
        wait_for_all(model.shards)
        start = time.perf_counter()
        if kind == "fixed":
            cert = model.certify(x, n0=100, n=n, alpha=0.001, image_index=IMAGE_INDEX)
        else:
            rule = sequential_rule(RADII, 0.5, 0.001, n)
            cert = smooth.certify_sequential(x, 100, rule, batch, image_index=IMAGE_INDEX)
        seconds = time.perf_counter() - start
        result[kind] = {"seconds": seconds, "prediction": cert.prediction, "radius": cert.radius,
                        "samples": cert.samples, "label": int(label)}
    Path(out, f"image-{world}-{rank}.json").write_text(json.dumps(result))
    wait_for_all(model.shards)


def image_latency(world: int, n: int) -> dict:
    """Rank 0's seconds and certificate for each kind; every rank's certificate must be the same."""
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_image_worker, args=(world, free_port(), n, tmp), nprocs=world, join=True)
        per_rank = [json.loads(Path(tmp, f"image-{world}-{r}.json").read_text()) for r in range(world)]
    for kind in per_rank[0]:
        certificates = {(r[kind]["prediction"], r[kind]["radius"], r[kind]["samples"]) for r in per_rank}
        assert len(certificates) == 1, f"the ranks' certificates differ: {certificates}"
    return per_rank[0]


# -- the demo table --------------------------------------------------------------------------------

def table_command(images: int, n_max: int) -> List[str]:
    return ["table", "--demo", "--images", str(images), "--n-max", str(n_max), "--threads", "1", "--quiet"]


def run_table(ranks: int, out: Path, images: int, n_max: int) -> float:
    """Wall seconds of the demo table in one process (ranks 1) or under torchrun."""
    launch = [sys.executable, "-m", "diffsmooth.cli"] if ranks == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks), "--master_port", str(free_port()),
        "-m", "diffsmooth.cli"]
    start = time.perf_counter()
    proc = subprocess.run([*launch, *table_command(images, n_max), "--out", str(out)], capture_output=True, text=True,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    if proc.returncode != 0:
        raise SystemExit(f"the table on {ranks} rank(s) failed:\n{proc.stderr[-3000:]}")
    return time.perf_counter() - start


def table_rows(folder: Path) -> dict:
    """Every result file's rows, time aside, sorted."""
    out = {}
    for path in sorted((folder / "runs").rglob("*.tsv")):
        lines = path.read_text().splitlines()
        keep = [k for k, c in enumerate(lines[0].split("\t")) if c != "time"]
        out[str(path.relative_to(folder))] = sorted("\t".join(line.split("\t")[k] for k in keep) for line in lines[1:])
    return out


def phase_shares(folder: Path) -> dict:
    ranks = json.loads((folder / "summary.json").read_text())["ranks"]
    return {"count": ranks["count"], "busiest_phase_over_mean": ranks["busiest_phase_over_mean"],
            "phases": ranks["phases"]}


# -- the meeting's cost, with and without the identity check ---------------------------------------

MEETING_KINDS = ("flags only (before issue 65)", "flags + digests, no image joined", "flags + digests, 4 images joined")


def _meeting_worker(rank: int, world: int, port: int, repeats: int, out: str) -> None:
    """A batch's meeting three ways (the old SUM of flags alone; the MAX meeting with no image joined; with 4
    CIFAR-10-sized images joined, their digests computed here), then the merge of 64 images' counts."""
    import numpy as np
    import torch.distributed as dist

    from diffsmooth.engine.certify.agreement import Identity
    from diffsmooth.engine.certify.blocks import SampleBlocks
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    blocks = SampleBlocks(rank, world)
    counts, bad = torch.ones((1, 64, 10), dtype=torch.int64), torch.zeros((1, 64), dtype=torch.int64)
    waiting = np.zeros(64, dtype=np.int64)
    images = [torch.rand((3, 32, 32), generator=torch.Generator().manual_seed(k)) for k in range(4)]

    def old():                              # what the meeting was: one SUM all-reduce of the flags
        dist.all_reduce(torch.from_numpy(np.zeros(66, dtype=np.int64)), op=dist.ReduceOp.SUM)

    def bare():
        blocks.step(waiting, False, 0, False, [], "cpu")

    def joined():
        blocks.step(waiting, False, 0, False, [Identity.of(k, x, "certify n0=100 n=100000")
                                               for k, x in enumerate(images)], "cpu")

    def merge():
        blocks.merge(counts, bad)
    seconds = {}
    for name, act in zip(MEETING_KINDS + ("merge of 64 images' counts",), (old, bare, joined, merge)):
        for _ in range(10):
            act()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(repeats):
            act()
        seconds[name] = (time.perf_counter() - start) / repeats
    Path(out, f"meeting-{rank}.json").write_text(json.dumps(seconds))
    dist.destroy_process_group()


def meeting_cost(worlds=(2, 4, 8), repeats: int = 200) -> dict:
    """Each kind's mean seconds per meeting on each number of gloo ranks (the slowest rank's), side by side."""
    out = {}
    for world in worlds:
        with tempfile.TemporaryDirectory() as tmp:
            mp.spawn(_meeting_worker, args=(world, free_port(), repeats, tmp), nprocs=world, join=True)
            per_rank = [json.loads(Path(tmp, f"meeting-{r}.json").read_text()) for r in range(world)]
        out[str(world)] = {kind: max(r[kind] for r in per_rank) for kind in per_rank[0]}
    return {"repeats": repeats, "ranks": out}


# -- the report -------------------------------------------------------------------------------------

def markdown(report: dict) -> str:
    lines = [f"# One image's samples over ranks (MEASURED on {report['cpu_count']} CPU cores, gloo, one thread per "
             f"process)", ""]
    if "image" in report:
        r = report["image"]
        lines += ["| one demo image (diffsmooth, m 5) | 1 process | " + f"{r['ranks']} ranks | speed-up | certificate |",
                  "|---|---|---|---|---|"]
        for kind in ("fixed", "sequential"):
            one, many = r["one"][kind], r["many"][kind]
            same = (one["prediction"], one["radius"]) == (many["prediction"], many["radius"])
            lines.append(f"| {kind}, n {r['n']:,} ({one['samples']:,} samples) | {one['seconds']:.2f} s | "
                         f"{many['seconds']:.2f} s | **{one['seconds'] / many['seconds']:.2f}x** | "
                         f"{'same' if same else 'DIFFERENT'} (class {one['prediction']}, radius {one['radius']:.3f}) |")
        lines.append("")
    if "table" in report:
        t = report["table"]
        lines += [f"| the demo table ({t['images']} images, n-max {t['n_max']:,}, race) | 1 process | {t['ranks']} ranks "
                  f"| speed-up | rows |", "|---|---|---|---|---|",
                  f"| wall time (whole commands) | {t['seconds']['one']:.0f} s | {t['seconds']['many']:.0f} s | "
                  f"**{t['seconds']['one'] / t['seconds']['many']:.2f}x** | {'equal' if t['same_rows'] else 'DIFFERENT'} |",
                  ""]
    for key in ("table", "shares"):
        if key in report:
            s = report[key]["shares"]
            lines += [f"Each pass's samples per rank on {s['count']} ranks (counted by its requests; computed, look-ahead "
                      f"and padding included): the busiest pass's busiest rank / mean "
                      f"**{s['busiest_phase_over_mean']:.3f}**", "",
                      "| pass | counted per rank | computed per rank | busiest / mean |", "|---|---|---|---|"]
            lines += [f"| {p['pass']} | {', '.join(f'{c:,}' for c in p['counted'])} | "
                      f"{', '.join(f'{c:,}' for c in p['computed'])} | {p['busiest_over_mean']:.3f} |"
                      for p in s["phases"]]
            lines.append("")
    if "merge" in report:
        m = report["merge"]["ranks"]
        kinds = list(next(iter(m.values())))
        lines += [f"A batch's meeting (64 images in flight) and a merge, ms per call (the slowest rank's mean over "
                  f"{report['merge']['repeats']}; gloo on this host's cores):", "",
                  "| ranks | " + " | ".join(kinds) + " |", "|---" * (len(kinds) + 1) + "|"]
        lines += [f"| {world} | " + " | ".join(f"{row[k] * 1e3:.3f}" for k in kinds) + " |" for world, row in m.items()]
    return "\n".join(lines)


@click.command()
@click.option("--parts", default="image,table,shares,merge", show_default=True)
@click.option("--ranks", default=2, show_default=True, help="Ranks against one process (image, table).")
@click.option("--share-ranks", default=4, show_default=True, help="Ranks for the per-pass shares.")
@click.option("--n", default=4000, show_default=True, help="The image's samples (fixed n; n-max sequentially).")
@click.option("--images", default=16, show_default=True, help="The demo table's images.")
@click.option("--n-max", default=2000, show_default=True, help="The demo table's n-max.")
@click.option("--merge-ranks", default=8, show_default=True)
@click.option("--out", type=click.Path(), default=None, help="Folder for ranks.json and ranks.md (and the tables).")
def main(parts, ranks, share_ranks, n, images, n_max, merge_ranks, out: Optional[str]):
    report: dict = {"cpu_count": os.cpu_count(), "parts": parts}
    work = Path(out) if out else Path(tempfile.mkdtemp())
    work.mkdir(parents=True, exist_ok=True)
    if "image" in parts:
        report["image"] = {"n": n, "ranks": ranks, "one": image_latency(1, n), "many": image_latency(ranks, n)}
        print(markdown(report), file=sys.stderr)
    if "table" in parts:
        one, many = work / "table-1", work / f"table-{ranks}"
        seconds = {"one": run_table(1, one, images, n_max), "many": run_table(ranks, many, images, n_max)}
        report["table"] = {"images": images, "n_max": n_max, "ranks": ranks, "seconds": seconds,
                           "same_rows": table_rows(one) == table_rows(many), "shares": phase_shares(many)}
        print(markdown(report), file=sys.stderr)
    if "shares" in parts:
        folder = work / f"table-{share_ranks}"
        seconds = run_table(share_ranks, folder, images, n_max)
        report["shares"] = {"ranks": share_ranks, "seconds": seconds, "shares": phase_shares(folder)}
    if "merge" in parts:
        report["merge"] = meeting_cost(tuple(w for w in (2, 4, 8) if w <= merge_ranks))
    text = markdown(report)
    print(text)
    if out:
        Path(out, "ranks.json").write_text(json.dumps(report, indent=1) + "\n")
        Path(out, "ranks.md").write_text(text + "\n")


if __name__ == "__main__":
    main()

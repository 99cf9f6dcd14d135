"""Continuous batching vs one image at a time, side by side in one run: samples computed per sample
counted, identical rows, wall time; and the balance of torchrun-style ranks that share work.

    python -m diffsmooth.bench.packing [--images 100] [--batches 2000,1000] [--n-max 10000]
        [--predict-n 1000] [--ranks 2,4] [--compile/--no-compile] [--threads 2] [--out DIR]

Sequential and PREDICT runs use the embedded demo models and images (RS base classifier, sigma
0.5). The packed run is the scheduler with its default window; "one at a time" is the same
scheduler with a window of one image (what every run did before packing). Ranks: gloo processes on
this machine with a stand-in classifier whose images need very different sample counts; each rank
either computes its share of every image's samples (what torchrun's ranks do: certify/blocks.py) or takes
a static round-robin shard of the images.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

import click
import torch
import torch.multiprocessing as mp

from diffsmooth.bench.models import build_model_set
from diffsmooth.engine.backends.torch.runner import TorchRunner
from diffsmooth.engine.base_classifier.local_smoothing import LogitsModule
from diffsmooth.engine.base_classifier.methods import MethodConfig
from diffsmooth.engine.certify.blocks import SampleBlocks
from diffsmooth.engine.certify.cohen import predict_job
from diffsmooth.engine.certify.jobs import Request
from diffsmooth.engine.certify.monte_carlo import MonteCarloPipeline
from diffsmooth.engine.certify.scheduler import Scheduler, Work
from diffsmooth.engine.certify.sequential import sequential_job
from diffsmooth.engine.data import load_dataset
from diffsmooth.engine.demo.run import spread_indices
from diffsmooth.engine.runs.assemble import ModelSources
from diffsmooth.engine.runs.fast_path import FastPath
from diffsmooth.engine.runs.request import sequential_rule
from diffsmooth.engine.runs.results import read_rows
from diffsmooth.engine.runs.stage_build import build_smooth
from diffsmooth.engine.stages.base import BaseClassifierStages

RADII = "0.25,0.5,0.75,1.0"


def demo_pipeline(compile: bool, device: str = "cpu"):
    """The embedded RS pipeline at sigma 0.5, static batches when compiled."""
    dataset = load_dataset("embedded")
    smooth = build_smooth(MethodConfig("rs", 0.5), ModelSources.demo(), tuple(dataset.image_shape),
                          dataset.num_classes, device=device, fast=FastPath.resolve(device, compile))
    return dataset, smooth.pipeline


def timed_run(pipeline, dataset, indices, make_job, batch: int, window) -> dict:
    """One scheduler run: results by index, samples computed / counted, wall seconds."""
    results = {}
    works = [Work(i, dataset[i][0], make_job()) for i in indices]
    start = time.perf_counter()
    stats = Scheduler(pipeline, batch, window).run(works, lambda d: results.__setitem__(d.work.index, d.result))
    return {"results": results, "seconds": time.perf_counter() - start, "computed": stats.samples_computed,
            "counted": stats.samples_counted, "overhead": stats.overhead, "max_window": stats.max_window,
            "batches": stats.batches}


def compare(pipeline, dataset, indices, make_job, batch: int, alone: int, samples_of) -> dict:
    """Packed (all images) vs one image at a time (the first `alone` images: a window of one, each
    request padded to whole batches) at one static batch size, after a warm-up batch. Also what the
    previous per-image engine computed, from the rows: it kept a padded tail's votes for the image's
    next request, so an image of s samples cost ceil(s / batch) whole batches."""
    timed_run(pipeline, dataset, indices[:1], make_job, batch, 1)
    packed = timed_run(pipeline, dataset, indices, make_job, batch, None)
    packed_results = packed.pop("results")
    samples = [samples_of(packed_results[i]) for i in indices]
    previous = sum(-(-s // batch) * batch for s in samples)
    report = {"batch": batch, "alone_images": alone, "packed": packed, "previous_engine_overhead": previous / sum(samples)}
    if alone:
        one = timed_run(pipeline, dataset, indices[:alone], make_job, batch, 1)
        one_results = one.pop("results")
        report.update(one_at_a_time=one, rows_identical=all(one_results[i] == packed_results[i] for i in indices[:alone]),
                      seconds_per_image_ratio=(one["seconds"] / alone) / (packed["seconds"] / len(indices)))
    return report


# -- ranks ---------------------------------------------------------------------------------------

def rank_fixture(count: int):
    """(pipeline on CPU, images) whose sequential runs need from ~200 samples to n-max: blends of two
    template images, from near the midpoint (split votes) to near one template (votes agree)."""
    templates = torch.rand((4, 3, 8, 8), generator=torch.Generator().manual_seed(11))

    class Templates(torch.nn.Module):
        def forward(self, x):
            return -((x.flatten(1)[:, None, :] - templates.flatten(1)[None]) ** 2).sum(-1)

    stage = TorchRunner().stage(LogitsModule(Templates().eval()), "templates")
    pipe = MonteCarloPipeline(BaseClassifierStages("rs", None, stage, 4), 0.5, seed=0)
    weights = torch.rand(count, generator=torch.Generator().manual_seed(5)) * 0.45 + 0.55
    images = [(w * templates[k % 4] + (1 - w) * templates[(k + 1) % 4], k % 4) for k, w in enumerate(weights)]
    return pipe, images


def _rank_main(rank: int, world: int, mode: str, store_path: str, images: int, n_max: int, batch: int, out: str):
    import torch.distributed as dist
    torch.set_num_threads(1)
    store = dist.FileStore(store_path, world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    pipe, data = rank_fixture(images)
    rule = sequential_rule(RADII, 0.5, 0.001, n_max)
    todo = list(range(images))
    mine = todo if mode == "blocks" else todo[rank::world]
    works = (Work(i, data[i][0], sequential_job(100, rule)) for i in mine)
    dist.barrier()
    stats = Scheduler(pipe, batch, blocks=SampleBlocks(rank, world) if mode == "blocks" else None).run(
        works, lambda d: None)
    Path(out, f"{mode}-{world}-{rank}.json").write_text(json.dumps({"computed": stats.samples_computed,
                                                                    "counted": stats.samples_counted}))
    dist.barrier()
    dist.destroy_process_group()


def rank_balance(world: int, mode: str, images: int, n_max: int, batch: int) -> dict:
    """The busiest rank's counted samples over the mean, for `world` gloo processes (computed: padding included)."""
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_rank_main, args=(world, mode, os.path.join(tmp, "store"), images, n_max, batch, tmp),
                 nprocs=world, join=True)
        done = [json.loads(Path(tmp, f"{mode}-{world}-{r}.json").read_text()) for r in range(world)]
    counted = [d["counted"] for d in done]
    return {"ranks": world, "mode": mode, "computed": [d["computed"] for d in done], "counted": counted,
            "busiest_over_mean": max(counted) / (sum(counted) / world)}


# -- replay: recorded sequential demands on full-size models -----------------------------------------

def replay_job(n0: int, chunks, samples: int):
    """Ask for exactly the requests a sequential run that used `samples` (n0 included) asked for:
    the selection with the first look, then one look at a time. Decides nothing; returns `samples`."""
    yield Request(0, n0), Request(n0, chunks[0])
    done = n0 + chunks[0]
    for size in chunks[1:]:
        if done >= samples:
            break
        yield Request(done, size)
        done += size
    return done


def replay(rows_path: str, models: str, device: str, precision: str, images: int, batch: int, n_max: int) -> dict:
    """A packed sequential run on full-size models (random weights) whose images ask for what the
    recorded rows' images needed (`samples` column), against fixed-n at the same measured rate."""
    demands = [int(r["samples"]) for r in read_rows(rows_path)][:images]
    model_set = build_model_set(models, method="diffsmooth")
    config = MethodConfig("diffsmooth", 0.5, m=5, local_sigma=0.25)
    smooth = build_smooth(config, ModelSources(), model_set.image_shape, model_set.num_classes, device=device,
                          precision=precision, fast=FastPath.resolve(device),
                          models=(model_set.denoiser, model_set.classifier))
    chunks = sequential_rule(RADII, 0.5, 0.001, n_max).chunks()
    x = torch.rand((len(demands), *model_set.image_shape), generator=torch.Generator().manual_seed(0))
    pipe = smooth.pipeline
    Scheduler(pipe, batch, 1).run([Work(0, x[0], replay_job(100, chunks, 100 + batch))], lambda d: None)   # warm-up
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    works = [Work(i, x[i], replay_job(100, chunks, s)) for i, s in enumerate(demands)]
    start = time.perf_counter()
    stats = Scheduler(pipe, batch).run(works, lambda d: None)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    per_sample = seconds / stats.samples_computed
    return {"rows": rows_path, "models": models, "images": len(demands), "batch": batch, "precision": precision,
            "samples_counted": stats.samples_counted, "samples_computed": stats.samples_computed,
            "seconds": seconds, "seconds_per_image": seconds / len(demands),
            "fixed_n_seconds_per_image_extrapolated": per_sample * (100 + n_max),
            "fewer_samples": (100 + n_max) * len(demands) / stats.samples_counted}


# -- report ----------------------------------------------------------------------------------------

def markdown(report: dict) -> str:
    lines = ["| run | batch | computed / counted: packed | window of one | previous engine (from the rows) | "
             "rows identical | seconds per image: window of one / packed |", "|---|---|---|---|---|---|---|"]
    for name, rows in (("sequential", report["sequential"]), ("predict", report["predict"])):
        for r in rows:
            alone = r.get("one_at_a_time")
            lines.append(f"| {name} | {r['batch']} | {r['packed']['overhead']:.3f} | "
                         f"{alone['overhead'] if alone else float('nan'):.3f} | {r['previous_engine_overhead']:.3f} | "
                         f"{('yes' if r['rows_identical'] else 'NO') if alone else 'n/a'} ({r['alone_images']} images) | "
                         f"{r.get('seconds_per_image_ratio', float('nan')):.2f}x |")
    if report.get("ranks"):
        lines += ["", "| ranks | work | counted samples per rank | computed (padding included) | busiest / mean |",
                  "|---|---|---|---|---|"]
        for r in report["ranks"]:
            lines.append(f"| {r['ranks']} | {r['mode']} | {', '.join(f'{c:,}' for c in r['counted'])} | "
                         f"{', '.join(f'{c:,}' for c in r['computed'])} | {r['busiest_over_mean']:.3f} |")
    return "\n".join(lines)


@click.command()
@click.option("--images", default=100, show_default=True, help="Embedded demo images (spread over the set).")
@click.option("--batches", default="2000,1000", show_default=True, help="Static batch sizes to compare.")
@click.option("--n-max", default=10000, show_default=True)
@click.option("--predict-n", default=1000, show_default=True)
@click.option("--ranks", default="2,4", show_default=True, help="Rank counts for the balance part ('' to skip).")
@click.option("--rank-images", default=64, show_default=True)
@click.option("--alone", default=20, show_default=True, help="Images run one at a time for the comparison.")
@click.option("--parts", default="sequential,predict,ranks", show_default=True)
@click.option("--compile/--no-compile", default=True, show_default=True)
@click.option("--threads", default=2, show_default=True)
@click.option("--device", default="cpu", show_default=True)
@click.option("--out", type=click.Path(), default=None, help="Folder for packing.json and packing.md.")
@click.option("--replay-rows", type=click.Path(exists=True), default=None,
              help="Instead: a packed sequential run on full-size models whose images ask for what these rows' "
                   "images needed (their `samples` column), timed against fixed-n.")
@click.option("--models", default="cifar10", show_default=True, help="With --replay-rows: the model set.")
@click.option("--precision", default="fp16", show_default=True, help="With --replay-rows.")
def main(images, batches, n_max, predict_n, ranks, rank_images, alone, parts, compile, threads, device, out, replay_rows,
         models, precision):
    torch.set_num_threads(threads)
    if replay_rows:
        result = replay(replay_rows, models, device, precision, images, int(batches.split(",")[0]), n_max)
        print(json.dumps(result, indent=1))
        if out:
            Path(out).mkdir(parents=True, exist_ok=True)
            Path(out, "replay.json").write_text(json.dumps(result, indent=1) + "\n")
        return
    dataset, pipe = demo_pipeline(compile, device)
    indices = spread_indices(len(dataset), images)
    rule = sequential_rule(RADII, 0.5, 0.001, n_max)
    report: Dict[str, List[dict]] = {"settings": dict(images=images, alone=alone, n_max=n_max, predict_n=predict_n,
                                                      compile=compile, threads=threads, device=device,
                                                      radii=RADII, method="rs", sigma=0.5)}
    sizes = [int(b) for b in batches.split(",")] if parts != "ranks" else []
    report["sequential"] = [compare(pipe, dataset, indices, lambda: sequential_job(100, rule), b, alone,
                                    lambda result: result[2]) for b in sizes if "sequential" in parts]
    print(markdown(dict(report, predict=[])), file=sys.stderr)
    report["predict"] = [compare(pipe, dataset, indices, lambda: predict_job(predict_n, 0.001), b, alone,
                                 lambda result: predict_n) for b in sizes if "predict" in parts]
    report["ranks"] = [rank_balance(int(w), mode, rank_images, n_max, 1000)
                       for w in ranks.split(",") if w and "ranks" in parts for mode in ("blocks", "static")]
    text = markdown(report)
    print(text)
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        Path(out, "packing.json").write_text(json.dumps(report, indent=1) + "\n")
        Path(out, "packing.md").write_text(text + "\n")


if __name__ == "__main__":
    main()

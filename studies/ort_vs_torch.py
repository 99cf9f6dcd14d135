"""Samples/s of the denoiser, the classifier head and the full Monte Carlo batch (noise + denoise +
local-smoothing classify + bincount), torch eager vs ONNX Runtime CPU, side by side in one run and
with the same thread count for both.

    python -m studies.ort_vs_torch [--sets demo,cifar10] [--json]
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Callable, Dict, List, Optional

import click
import torch

from diffsmooth.bench.models import build_model_set
from diffsmooth.engine.backends.onnxruntime.runner import OrtSession, physical_cores
from diffsmooth.engine.backends.onnxruntime.stages import build_onnx_stages
from diffsmooth.engine.backends.torch.runner import TorchRunner
from diffsmooth.engine.backends.torch.stages import build_torch_stages
from diffsmooth.engine.base_classifier.methods import MethodConfig
from diffsmooth.engine.certify.monte_carlo import MonteCarloPipeline
from diffsmooth.engine.stages.base import BaseClassifierStages
from diffsmooth.export.manifest import package_versions
from diffsmooth.export.onnx_export import export_models

DEFAULT_BATCH = {"demo": 64, "cifar10": 16, "imagenet": 2}
DEFAULT_ITERS = {"demo": 5, "cifar10": 3, "imagenet": 2}


def _time_per_call(fn: Callable[[], object], iters: int) -> float:
    """Median wall time of one call over `iters` calls (the machine may be shared: the median
    resists the odd descheduled call)."""
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _pair(torch_fn, ort_fn, iters: int, rounds: int = 2):
    """Best-of-rounds median time for each, the two interleaved round by round."""
    torch_fn(), ort_fn()                       # warm-up (allocations, ORT arena, oneDNN primitives)
    t_torch, t_ort = [], []
    for _ in range(rounds):
        t_torch.append(_time_per_call(torch_fn, iters))
        t_ort.append(_time_per_call(ort_fn, iters))
    return min(t_torch), min(t_ort)


def bench_set(name: str, *, batch: int, iters: int, threads: int, method: str, sigma: float, m: int,
              local_sigma: float, local_noise: str, seed: int = 0, echo=print,
              cache: Optional[dict] = None) -> List[Dict]:
    """Rows for one model set: denoiser, classifier and pipeline samples/s for both backends
    (models and graphs are kept in `cache` between thread counts)."""
    config = MethodConfig(method, sigma, m, local_sigma, local_noise)
    cache = {} if cache is None else cache
    if name not in cache:
        models = build_model_set(name, method, sigma, local_sigma, seed)
        echo(f"# {name}: {models.description} (built in {models.build_s:.1f} s); exporting ...")
        out = tempfile.mkdtemp(prefix=f"ort-bench-{name}-")
        t0 = time.perf_counter()
        export_models(config, tuple(models.image_shape), out, denoiser=models.denoiser, classifier=models.classifier)
        cache[name] = (models, out, time.perf_counter() - t0)
    models, out, export_s = cache[name]
    shape = tuple(models.image_shape)
    echo(f"# {name}, {threads} thread(s)")
    t_stages = build_torch_stages(config, models.classifier, models.denoiser, TorchRunner(), shape,
                                  models.num_classes)
    o_stages = build_onnx_stages(out, config, shape, models.num_classes, session=OrtSession(threads=threads))

    gen = torch.Generator().manual_seed(seed)
    x = torch.rand((batch, *shape), generator=gen)
    noise = torch.randn((batch, *t_stages.local_noise_shape), generator=gen) if t_stages.local_noise_shape else None
    extra = [noise] if noise is not None else []
    rows = []

    def row(stage, tt, to, note=""):
        r = {"set": name, "weights": models.weights, "stage": stage, "batch": batch, "threads": threads,
             "torch_samples_s": batch / tt, "ort_samples_s": batch / to, "ratio": tt / to, "note": note}
        rows.append(r)
        echo(f"  {stage:<11} torch {r['torch_samples_s']:9.1f}/s   ort {r['ort_samples_s']:9.1f}/s   x{r['ratio']:.2f}")
        return r

    if t_stages.purify is not None:
        diff = (t_stages.purify(x) - o_stages.purify(x)).abs().max().item()
        row("denoiser", *_pair(lambda: t_stages.purify(x), lambda: o_stages.purify(x), iters),
            f"max |torch-ort| {diff:.1e}")
    h = t_stages.purify(x) if t_stages.purify is not None else x
    diff = (t_stages.score(h, *extra) - o_stages.score(h, *extra)).abs().max().item()
    label = f"m={m}" if method == "diffsmooth" else "logits"
    row("classifier", *_pair(lambda: t_stages.score(h, *extra), lambda: o_stages.score(h, *extra), iters),
        f"{label}; max |torch-ort| {diff:.1e}")
    pipes = [MonteCarloPipeline(s, sigma, seed) for s in (t_stages, o_stages)]
    image = x[0]
    counts = [p.count(image, 0, 0, batch, batch) for p in pipes]
    same = bool((counts[0] == counts[1]).all())
    row("pipeline", *_pair(lambda: pipes[0].count(image, 0, 0, batch, batch),
                           lambda: pipes[1].count(image, 0, 0, batch, batch), iters),
        f"one MC batch; votes identical: {same}")
    for r in rows:
        r["export_s"] = export_s
    assert isinstance(o_stages, BaseClassifierStages)
    return rows


def markdown(rows: List[Dict]) -> str:
    lines = ["| set | weights | stage | batch | threads | torch eager samples/s | ORT CPU samples/s | ORT / torch | note |",
             "|---|---|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['set']} | {r['weights']} | {r['stage']} | {r['batch']} | {r['threads']} | "
                     f"{r['torch_samples_s']:.1f} | {r['ort_samples_s']:.1f} | {r['ratio']:.2f}x | {r['note']} |")
    return "\n".join(lines)


@click.command()
@click.option("--sets", default="demo,cifar10", show_default=True, help="Model sets: demo, cifar10, imagenet.")
@click.option("--batch", type=int, help="Samples per call [default: demo 64, cifar10 16, imagenet 2].")
@click.option("--iters", type=int, help="Timed calls per round [default: demo 5, cifar10 3].")
@click.option("--threads", help="Thread counts for both torch and ORT, comma-separated, e.g. 1,2 "
              "[default: physical cores].")
@click.option("--method", type=click.Choice(["rs", "dds", "diffsmooth"]), default="diffsmooth", show_default=True)
@click.option("--sigma", type=float, default=0.5, show_default=True)
@click.option("--m", "m", type=int, default=5, show_default=True)
@click.option("--local-sigma", type=float, default=0.25, show_default=True)
@click.option("--local-noise", type=click.Choice(["fixed", "fresh"]), default="fixed", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of the table.")
def main(sets, batch, iters, threads, method, sigma, m, local_sigma, local_noise, as_json):
    """torch eager vs ONNX Runtime (CPU) throughput, side by side."""
    try:
        counts = [int(t) for t in threads.split(",")] if threads else [physical_cores()]
    except ValueError:
        raise click.BadParameter(f"--threads must be comma-separated integers, got {threads!r}") from None
    echo = (lambda *a: print(*a, file=sys.stderr)) if as_json else print
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    echo(f"# threads={counts} (the same for torch and ORT); load average {load}")
    rows: List[Dict] = []
    cache: dict = {}
    try:
        for n_threads in counts:
            torch.set_num_threads(n_threads)
            for name in [s.strip() for s in sets.split(",") if s.strip()]:
                rows += bench_set(name, batch=batch or DEFAULT_BATCH.get(name, 8),
                                  iters=iters or DEFAULT_ITERS.get(name, 3), threads=n_threads, method=method,
                                  sigma=sigma, m=m, local_sigma=local_sigma, local_noise=local_noise, echo=echo,
                                  cache=cache)
    finally:
        for _, out, _ in cache.values():
            shutil.rmtree(out, ignore_errors=True)
    meta = {"threads": counts, "load_average_before": load,
            "load_average_after": os.getloadavg() if hasattr(os, "getloadavg") else None,
            "versions": package_versions(), "method": method, "sigma": sigma, "m": m}
    if as_json:
        print(json.dumps({"meta": meta, "rows": rows}, indent=2))
    else:
        print(markdown(rows))
        print(f"\nload average before/after: {meta['load_average_before']} / {meta['load_average_after']}")


if __name__ == "__main__":
    main()

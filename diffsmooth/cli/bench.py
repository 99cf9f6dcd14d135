"""`diffsmooth bench`: time certification stage by stage against the reference-equivalent baseline."""

from __future__ import annotations

import contextlib
import json
import sys
from dataclasses import fields
from pathlib import Path

import click

from diffsmooth.bench.harness import BenchSettings, run_bench, to_jsonable
from diffsmooth.bench.models import MODEL_SETS
from diffsmooth.bench.report import render
from diffsmooth.bench.variants import TOKENS, parse_variants
from diffsmooth.cli.fast_path_options import fast_path_flags
from diffsmooth.cli.options import group, name_values
from diffsmooth.cli.param_types import BATCH, LOCAL_NOISES, LOCAL_SIGMA, METHOD, SAMPLES, SEED, SIGMA, THREADS, Count, Number
from diffsmooth.engine.choices import (
    BACKENDS,
    DEFAULT_LOCAL_NOISE,
    DEFAULT_LOCAL_SIGMA,
    DEFAULT_M,
    DEFAULT_METHOD,
    DEFAULT_N0,
    DEFAULT_SIGMA,
    LOCAL_NOISE_MODES,
    RUN_PRECISIONS,
)
from diffsmooth.engine.runs.fast_path_options import ASKED, AskedFastPath


def _csv(kind=str):
    """A comma-separated list; `kind` a converter or a click type (each item checked as that option's value);
    every item once."""
    def parse(ctx, param, value):
        if value is None:
            return ()
        texts = [v.strip() for v in str(value).split(",") if v.strip()]
        try:
            if isinstance(kind, click.ParamType):
                items = tuple(kind.convert(v, param, ctx) for v in texts)
            else:
                items = tuple(kind(v) for v in texts)
        except ValueError:
            raise click.BadParameter(f"expected a comma-separated list, got {value!r}") from None
        if len(set(items)) != len(items):
            raise click.BadParameter(f"names a value twice: {value!r}")
        return items
    return parse


@click.command("bench")
@click.option("--models", type=click.Choice(MODEL_SETS), default="demo", show_default=True,
              help="demo: embedded demo models (random same-architecture weights until trained); cifar10 / "
                   "imagenet: full-size UNet + cifar_resnet110 / resnet50 with random weights (imagenet is "
                   "very slow on CPU).")
@click.option("--denoiser", type=click.Path(exists=True, file_okay=False), default=None,
              help="A diffusers denoiser folder to time instead of the set's UNet (its own weights; the classifier "
                   "stays the set's, random, at the folder's image shape).")
@click.option("--scheduler", type=click.Path(exists=True, file_okay=False), default=None,
              help="Scheduler folder of a diffusers UNet folder given as --denoiser.")
@click.option("--arch", default=None,
              help="Classifier architecture instead of the set's (e.g. beit_large_patch16_224, timm:<name>; random weights).")
@click.option("--method", type=METHOD, default=DEFAULT_METHOD, show_default=True)
@click.option("--sigma", type=SIGMA, default=DEFAULT_SIGMA, show_default=True, help="Smoothing noise std.")
@click.option("--n0", type=SAMPLES, default=DEFAULT_N0, show_default=True, help="Selection samples per image.")
@click.option("--n", type=SAMPLES, default=None, help="Estimation samples to extrapolate to [default: 100000; "
                                                       "imagenet 10000].")
@click.option("--m", "m", type=LOCAL_NOISES, default=DEFAULT_M, show_default=True, help="Local noises (diffsmooth).")
@click.option("--local-sigma", type=LOCAL_SIGMA, default=DEFAULT_LOCAL_SIGMA, show_default=True)
@click.option("--local-noise", type=click.Choice(LOCAL_NOISE_MODES), default=DEFAULT_LOCAL_NOISE, show_default=True)
@click.option("--option", "method_options", multiple=True, metavar="NAME=VALUE", callback=name_values,
              help="A setting of the method's own (docs/methods.md), e.g. reverse_runs=5 for densepure; repeatable.")
@click.option("--batch", type=BATCH, default=None,
              help="Engine batch [default: CPU demo/cifar10 50, imagenet 4; CUDA 2000/2000/32].")
@click.option("--measure-n", type=SAMPLES, default=None,
              help="Samples actually run per image (n0 uses min(n0, this)) [default: demo 1000, cifar10 100, imagenet 4; "
                   "CUDA 20000/20000/640].")
@click.option("--backend", "backends", default="torch", show_default=True, callback=_csv(click.Choice(BACKENDS)),
              help="Comma list of torch, onnxruntime, tensorrt (onnxruntime/tensorrt export the models to a "
                   "temp dir, tensorrt also builds engine files there; skipped with a message when unavailable).")
@click.option("--precision", "precisions", default="fp32", show_default=True, callback=_csv(click.Choice(RUN_PRECISIONS)),
              help="Comma list of fp32, fp16, bf16 (non-fp32 only on CUDA).")
@click.option("--device", default="cpu", show_default=True)
@group(*fast_path_flags())
@click.option("--variants", default=None, metavar="SPEC[,SPEC]",
              help="Measure these fast-path variants in turn on the same models, e.g. default,lean-unet,"
                   "freezing+classifier-batch=500 (tokens: " + ", ".join(TOKENS) + "; bench/variants.py).")
@click.option("--deadline-s", type=Number(0, 1e6, low_open=True, label="the deadline"), default=None,
              help="With --variants: start no variant that would end past this many seconds from the start.")
@click.option("--images", type=Count(1, 4096), default=1, show_default=True, help="Images certified per measurement.")
@click.option("--no-reference", is_flag=True, help="Skip the reference-equivalent baseline.")
@click.option("--reference-batch", type=BATCH, default=50, show_default=True, help="Batch of the baseline (official: 50).")
@click.option("--compare", is_flag=True, help="Show the published per-image times (other hardware) next to ours.")
@click.option("--peak-tflops", type=Number(0, 1e9, low_open=True, label="the peak"), default=None,
              help="Peak TFLOP/s for the fraction-of-peak column [default: built-in GPU table; measured sgemm on CPU].")
@click.option("--sweep", is_flag=True, help="Also time a batch x m grid (table, and PNG with --plot).")
@click.option("--sweep-batches", default=None, callback=_csv(BATCH), help="Comma list of batch sizes.")
@click.option("--sweep-m", "sweep_ms", default=None, callback=_csv(LOCAL_NOISES), help="Comma list of m values.")
@click.option("--sweep-n", type=SAMPLES, default=None, help="Samples per sweep point, at least one batch [default: --measure-n].")
@click.option("--plot", type=click.Path(dir_okay=False), default=None, help="PNG for the sweep.")
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option("--threads", type=THREADS, default=None, help="torch intra-op threads [default: torch's choice].")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout instead of the tables.")
@click.option("--results", type=click.Path(dir_okay=False), default=None,
              help="Append one JSON line per run (machine, versions, settings, timings) to this file.")
@click.option("--profile", type=click.Path(file_okay=False), default=None,
              help="Also profile a few batches kernel by kernel (torch backend) and write the tables to this folder.")
@click.option("--quiet", is_flag=True, help="No progress bars.")
def bench(**kw):
    """Time certification per image, stage by stage; FLOP/s vs peak; engine vs reference-equivalent."""
    if kw["plot"] and not kw["sweep"]:
        raise click.BadParameter("--plot draws the sweep: add --sweep", param_hint="--plot")
    given = {f.name: kw[f.name] for f in fields(BenchSettings) if f.name in kw}     # the options named as the fields
    settings = BenchSettings(**{
        **given, "backends": kw["backends"] or ("torch",), "precisions": kw["precisions"] or ("fp32",),
        "reference": not kw["no_reference"], "progress": not kw["quiet"],
        "asked_fast_path": AskedFastPath(**{name: kw[name] for name in ASKED}),
        "variants": parse_variants(kw["variants"] or "")})
    appended = []

    def append(line):                                 # each run's line as it finishes: a step cut off keeps them
        if kw["results"]:
            path = Path(kw["results"])
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a") as f:
                f.write(json.dumps(line, sort_keys=True) + "\n")
            appended.append(line)

    with contextlib.redirect_stdout(sys.stderr):      # stray prints (exporters) must not mix into --json
        doc = to_jsonable(run_bench(settings, on_run=append))
    if kw["as_json"]:
        click.echo(json.dumps(doc, indent=1, sort_keys=True))
    else:
        click.echo(render(doc))
        if kw["results"]:
            click.echo(f"\nappended {len(appended)} JSON line(s) to {kw['results']}")

"""`diffsmooth demo`: the three methods side by side on the shipped models and images."""

from __future__ import annotations

import click

from diffsmooth.cli.fast_path_options import compile_flag
from diffsmooth.cli.options import precision_option
from diffsmooth.cli.param_types import ALPHA, BATCH, LOCAL_NOISES, LOCAL_SIGMA, SAMPLES, SEED, SIGMA, THREADS, Count
from diffsmooth.engine.choices import (
    DEFAULT_ALPHA,
    DEFAULT_LOCAL_SIGMA,
    DEFAULT_M,
    DEFAULT_N0,
    DEFAULT_SEED,
    DEFAULT_SIGMA,
    MAX_SAMPLES,
)
from diffsmooth.engine.demo.run import DemoRun, run_demo
from diffsmooth.engine.errors import UserError, check_alpha
from diffsmooth.engine.runs.fast_path import FastPath
from diffsmooth.engine.runs.resolve import set_threads


@click.command()
@click.option("--out", type=click.Path(), default="demo-out", show_default=True, help="Output directory.")
@click.option("--images", type=Count(1), default=30, show_default=True,
              help="K test images (spread over the 500 shipped ones).")
@click.option("--n", "n", type=SAMPLES, default=500, show_default=True,
              help="Monte Carlo samples per image (the largest certifiable radius grows with n).")
@click.option("--n0", type=SAMPLES, default=DEFAULT_N0, show_default=True)
@click.option("--alpha", type=ALPHA, default=DEFAULT_ALPHA, show_default=True)
@click.option("--sigma", type=SIGMA, default=DEFAULT_SIGMA, show_default=True)
@click.option("--local-sigma", type=LOCAL_SIGMA, default=DEFAULT_LOCAL_SIGMA, show_default=True)
@click.option("--m", "m", type=LOCAL_NOISES, default=DEFAULT_M, show_default=True)
@click.option("--batch", type=BATCH, default=200, show_default=True)
@click.option("--seed", type=SEED, default=DEFAULT_SEED, show_default=True)
@click.option("--device", default="cpu", show_default=True, help="cpu, cuda or cuda:N.")
@precision_option()
@compile_flag()
@click.option("--threads", type=THREADS, default=None, help="CPU threads for torch.")
@click.option("--quiet", is_flag=True)
def demo(out, images, n, n0, alpha, sigma, local_sigma, m, batch, seed, device, precision, compile, threads, quiet):
    """Certify K shipped Fashion-MNIST images with rs, dds and diffsmooth on the embedded models."""
    check_alpha(alpha)
    if n0 + n > MAX_SAMPLES:
        raise UserError(f"--n0 + --n must be <= {MAX_SAMPLES:,} samples per image (Monte Carlo sample indices are "
                        f"32-bit), got {n0 + n:,}")
    set_threads(threads)
    run = DemoRun(images=images, n0=n0, n=n, alpha=alpha, sigma=sigma, m=m, local_sigma=local_sigma, batch=batch,
                  seed=seed, device=device, precision=precision, fast=FastPath.resolve(device, compile))
    result = run_demo(out, run, progress=not quiet)
    click.echo(f"\n{result['header']}\n\n{result['table']}\n")
    timing = ", ".join(f"{k} {v:.1f} s" for k, v in result["seconds"].items())
    click.echo(f"time: {timing}; wrote {', '.join(result['files'])}, {out}/certified_accuracy.png, {out}/summary.md")

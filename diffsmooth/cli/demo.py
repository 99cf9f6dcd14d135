"""`diffsmooth demo`: the three methods side by side on the shipped models and images."""

from __future__ import annotations

import click

from diffsmooth.cli.options import positive, precision_option
from diffsmooth.engine.demo.run import run_demo
from diffsmooth.engine.errors import check_alpha
from diffsmooth.engine.runs.fast_path import FastPath
from diffsmooth.engine.runs.plan import set_threads


@click.command()
@click.option("--out", type=click.Path(), default="demo-out", show_default=True, help="Output directory.")
@click.option("--images", type=int, default=30, show_default=True, callback=positive("images"),
              help="K test images (spread over the 500 shipped ones).")
@click.option("--n", "n", type=int, default=500, show_default=True, callback=positive("n"),
              help="Monte Carlo samples per image (the largest certifiable radius grows with n).")
@click.option("--n0", type=int, default=100, show_default=True, callback=positive("n0"))
@click.option("--alpha", type=float, default=0.001, show_default=True)
@click.option("--sigma", type=float, default=0.5, show_default=True)
@click.option("--local-sigma", type=float, default=0.25, show_default=True)
@click.option("--m", "m", type=int, default=5, show_default=True)
@click.option("--batch", type=int, default=200, show_default=True, callback=positive("batch"))
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--device", default="cpu", show_default=True, help="cpu, cuda or cuda:N.")
@precision_option()
@click.option("--compile/--no-compile", "compile", default=None,
              help="Compiled static-shape stages (+ CUDA graphs, 2 streams on CUDA) [default: on for CUDA].")
@click.option("--threads", type=int, default=None, callback=positive("threads"), help="CPU threads for torch.")
@click.option("--quiet", is_flag=True)
def demo(out, images, n, n0, alpha, sigma, local_sigma, m, batch, seed, device, precision, compile, threads, quiet):
    """Certify K shipped Fashion-MNIST images with rs, dds and diffsmooth on the embedded models."""
    set_threads(threads)
    check_alpha(alpha)
    result = run_demo(out, images=images, n0=n0, n=n, alpha=alpha, sigma=sigma, m=m,
                      local_sigma=local_sigma, batch=batch, seed=seed, device=device, precision=precision,
                      fast=FastPath.resolve(device, compile), progress=not quiet)
    click.echo(f"\n{result['header']}\n\n{result['table']}\n")
    timing = ", ".join(f"{k} {v:.1f} s" for k, v in result["seconds"].items())
    click.echo(f"time: {timing}; wrote {', '.join(result['files'])}, {out}/certified_accuracy.png, {out}/summary.md")

"""`diffsmooth certify` and `diffsmooth predict`: options -> RunRequest -> resolved run -> voter -> rows."""

from __future__ import annotations

import click

from diffsmooth.cli.options import (
    echo_err,
    method_options,
    model_options,
    run_options,
    sequential_options,
)
from diffsmooth.engine.runs.execute import build_voter, execute
from diffsmooth.engine.runs.request import RunRequest
from diffsmooth.engine.runs.resolve import resolve_run


def _run(request: RunRequest) -> None:
    run = resolve_run(request)                 # option, lock and resume errors before any model is loaded
    with run.hold_locks():                  # held from planning on: a second run on `out` stops at once
        _certify(run)


def _certify(run) -> None:
    voter = build_voter(run, echo_err)
    r = run.request
    if run.is_sweep:
        echo_err(f"# sweep: {len(run.configurations)} configurations at sigma={r.sigma}, images={len(run.indices)} "
             f"-> {r.out}/")
    samples = f"n={r.n}" if r.sequential is None else \
        f"sequential n-max={r.sequential.n_max} radii={list(r.sequential.radii)}"
    echo_err(f"# {voter.describe()}; batch={run.batch} sigma={r.sigma} n0={r.n0} {samples} alpha={r.alpha} "
         f"images={len(run.indices)} -> {run.out}")
    execute(run, voter, echo_err)


@click.command()
@model_options()
@method_options()
@run_options
@sequential_options
def certify(**options):
    """CERTIFY each selected image; one TSV row per image (idx label predict radius correct time).

    Several --method / --classifier / --local-sigma / --m values make a sweep: --out is then a
    directory with one TSV per configuration and index.json; the denoiser runs once per batch and
    every configuration votes on the same samples, on any backend.
    """
    _run(RunRequest.parse("certify", **options))


@click.command()
@model_options()
@method_options()
@run_options
def predict(**options):
    """PREDICT each selected image (abstain = -1); TSV rows idx label predict correct time."""
    _run(RunRequest.parse("predict", **options))

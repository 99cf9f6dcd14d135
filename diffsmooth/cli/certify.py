"""`diffsmooth certify` and `diffsmooth predict`: options -> RunSettings -> engine/runs."""

from __future__ import annotations

import click

from diffsmooth.cli.options import (
    method_options,
    model_options,
    run_options,
    sequential_options,
)
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.runs.prepare import prepare_single
from diffsmooth.engine.runs.settings import RunSettings
from diffsmooth.engine.runs.sharded_run import run_sharded
from diffsmooth.engine.runs.sweep_setup import certify_sweep


def _log(line: str) -> None:
    click.echo(line, err=True)


@click.command()
@model_options()
@method_options()
@run_options
@sequential_options
def certify(**options):
    """CERTIFY each selected image; one TSV row per image (idx label predict radius correct time).

    Several --method / --classifier / --local-sigma / --m values make a sweep: --out is then a
    directory with one TSV per configuration and index.json; the denoiser runs once per batch.
    """
    settings = RunSettings.from_options(**options)
    rule = settings.sequential_rule()                  # option errors before any model is loaded
    if settings.is_sweep:
        certify_sweep(settings, _log)
        return
    run = prepare_single(settings, "certify")
    s = run.settings
    samples = f"n={s.n}" if rule is None else f"sequential n-max={rule.n_max} radii={list(rule.radii)}"
    _log(f"# {run.smooth.pipeline.describe()}; batch={s.batch} sigma={run.config.sigma} n0={s.n0} {samples} "
         f"alpha={s.alpha} images={len(run.indices)} -> {s.out}")
    run_sharded("certify", run, _log)


@click.command()
@model_options()
@method_options()
@run_options
def predict(**options):
    """PREDICT each selected image (abstain = -1); TSV rows idx label predict correct time."""
    settings = RunSettings.from_options(**options)
    if settings.is_sweep:
        raise UserError("predict takes one configuration: give each of --method/--classifier/--local-sigma/--m once")
    run_sharded("predict", prepare_single(settings, "predict"), _log)

"""`diffsmooth preflight`: certify's model, data and method options -> a report on a small sample, in seconds,
of whether the set-up behaves as the table needs (engine/preflight/); nothing is written."""

from __future__ import annotations

import json

import click

from diffsmooth.cli.group import SETUP_EXIT
from diffsmooth.cli.options import dataset_option, method_options, model_options
from diffsmooth.cli.param_types import BATCH, SEED, THREADS, Count, Number
from diffsmooth.engine.choices import DEFAULT_SKIP, DEFAULT_SPLIT
from diffsmooth.engine.preflight.run import IMAGES, SAMPLES, preflight_request
from diffsmooth.engine.runs.request import RunRequest


@click.command()
@model_options(sweep=False)
@method_options(sweep=False)
@dataset_option()
@click.option("--data", type=click.Path(), help="Dataset directory or file.")
@click.option("--split", default=DEFAULT_SPLIT, show_default=True)
@click.option("--skip", type=Count(1), default=DEFAULT_SKIP, show_default=True, help="Select every skip-th image.")
@click.option("--max", "--max-index", "max_index", type=Count(1), default=None, help="Select indices below this.")
@click.option("--images", type=Count(1), default=IMAGES, show_default=True,
              help="Images in the sample, drawn from the selection with --seed.")
@click.option("--samples", type=Count(1, 10_000), default=SAMPLES, show_default=True,
              help="Noise samples per image (the first ones `certify` draws).")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Noise seed, and the sample's draw.")
@click.option("--device", default="cpu", show_default=True, help="cpu, cuda or cuda:N.")
@click.option("--batch", type=BATCH, default=None, help="Noisy samples per batch [default: as certify's].")
@click.option("--threads", type=THREADS, default=None, help="CPU threads for torch.")
@click.option("--published", type=Number(0, 100, label="the published cell"), default=None,
              help="The paper's certified accuracy at r = 0 (percent), beside the measured upper bound (a warning above it).")
@click.option("--strict", is_flag=True, help=f"Exit with code {SETUP_EXIT} (the set-up is wrong) when there is a warning.")
@click.option("--json", "as_json", is_flag=True, help="One JSON document (findings and measurements) instead of lines.")
def preflight(images, samples, published, strict, as_json, classifier, method, local_sigma, m, **options):
    """Check the set-up on a small sample before any certificate: data, accuracies, normalisation, labels, denoiser.

    On --images images of the selection (seeded, stratified by label), --samples noise samples each: the data's
    shape and pixel range, the classifier's clean accuracy (on images stratified over the whole data), an upper
    confidence bound of certified accuracy at r = 0, and paired tests on the same images of the other
    normalisations, the channels reversed, the best label permutation, the classifier at half and twice its noise
    and the other schedules. A finding that predicts a wrong table is a warning naming the option that fixes it; a
    test too weak for the sample is inconclusive and says how many more images it needs. Writes nothing."""
    request = RunRequest.parse("certify", out="(preflight: nothing is written)", classifier=classifier,
                               method=method, local_sigma=local_sigma, m=m, quiet=True, **options)
    report = preflight_request(request, images=images, samples=samples, published=published)
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=1, allow_nan=False))
    else:
        for line in report.lines():
            click.echo(line)
    if strict and report.warnings:
        raise SystemExit(SETUP_EXIT)

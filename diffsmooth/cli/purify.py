"""`diffsmooth purify`: the paper's figure of clean, noisy, denoised and locally noised images."""

from __future__ import annotations

import click

from diffsmooth.cli.options import dataset_option, model_options
from diffsmooth.cli.param_types import LOCAL_SIGMA, SEED, SIGMA, Count
from diffsmooth.engine.data import load_dataset
from diffsmooth.engine.demo.run import PurifyFigure, purify_grid
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.runs.sources import ModelOptions, resolve_sources


@click.command()
@model_options()
@dataset_option()
@click.option("--data", type=click.Path())
@click.option("--sigma", type=SIGMA, default=0.5, show_default=True)
@click.option("--local-sigma", type=LOCAL_SIGMA, default=0.25, show_default=True)
@click.option("--m", "m", type=Count(0, 64, "one row of the grid each"), default=2, show_default=True,
              help="Locally-noised rows to show.")
@click.option("--images", type=Count(1, 4096, "one column of the grid each"), default=8, show_default=True)
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option("--out", type=click.Path(), default="purified.png", show_default=True)
def purify(dataset, data, sigma, local_sigma, m, images, seed, out, classifier, **model):
    """PNG grid: clean / noisy / one-shot denoised / locally smoothed images (the paper's figure)."""
    kind = dataset or ("embedded" if not data else None)
    if kind is None:
        raise UserError("--data given without --dataset: say which layout it is")
    ds = load_dataset(kind, data)
    if not model["denoiser"] and classifier:
        raise UserError("purify needs --denoiser (or no model options for the embedded demo)")
    sources = resolve_sources(ModelOptions(classifier=classifier[0] if classifier else None, **model), kind)
    figure = PurifyFigure(images=images, sigma=sigma, local_sigma=local_sigma, m=m, seed=seed)
    path = purify_grid(out, figure, sources=sources, dataset=ds)
    click.echo(f"wrote {path} (rows, labelled in the picture: clean, noisy, denoised, {m} locally-noised)")

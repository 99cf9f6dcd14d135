"""`diffsmooth analyze`: certified accuracy and ACR of result files, as a table, JSON or a plot."""

from __future__ import annotations

from pathlib import Path

import click

from diffsmooth.engine.runs.analyze import (
    best_per_radius,
    markdown_table,
    plot_curves,
    summarize,
    to_json,
)
from diffsmooth.engine.runs.request import parse_radii


def expand_result_files(files):
    """Files as given; a directory stands for the .tsv files inside it."""
    paths = []
    for f in files:
        p = Path(f)
        paths.extend(sorted(p.glob("*.tsv")) if p.is_dir() else [p])
    return paths


@click.command()
@click.argument("files", nargs=-1, required=True, type=click.Path())
@click.option("--radii", default="0,0.25,0.5,0.75,1.0,1.25,1.5", show_default=True,
              help="Comma-separated radii for the table.")
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of the table.")
@click.option("--plot", type=click.Path(), help="Write a certified-accuracy curve PNG here.")
def analyze(files, radii, as_json, plot):
    """Certified accuracy at radii and ACR for result TSVs (either time format)."""
    radii = list(parse_radii(radii))         # finite, >= 0, each once
    paths = expand_result_files(files)
    summaries = [summarize(p, radii) for p in paths]
    if as_json:
        click.echo(to_json(summaries))
    else:
        click.echo(markdown_table(summaries, radii))
        if len(summaries) > 1:
            click.echo("\n" + best_per_radius(summaries, radii))
    if plot:
        plot_curves(paths, plot)
        click.echo(f"wrote {plot}", err=True)

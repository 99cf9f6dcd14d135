"""`diffsmooth validate`: torch vs ONNX Runtime again on an export folder."""

from __future__ import annotations

import click

from diffsmooth.cli.options import validation_options
from diffsmooth.export.engine_file_check import result_lines
from diffsmooth.export.validate import validate_dir


@click.command("validate")
@click.option("--onnx-dir", required=True, type=click.Path(), help="Folder written by `diffsmooth export`.")
@validation_options
def validate(onnx_dir, samples, dataset, data, seed):
    """Re-run torch vs ONNX Runtime on every graph in --onnx-dir; results go into the manifests."""
    for line in result_lines(validate_dir(onnx_dir, samples=samples, seed=seed, dataset=dataset, data=data)):
        click.echo(line)

"""`diffsmooth build-engine`: TensorRT engine files of an export folder, inspected and validated."""

from __future__ import annotations

import click

from diffsmooth.cli.options import echo_err, validation_options
from diffsmooth.cli.param_types import BATCH, Number
from diffsmooth.engine.choices import GRAPH_PRECISIONS
from diffsmooth.export import engine_file_check, trt_build


@click.command("build-engine")
@click.option("--onnx-dir", required=True, type=click.Path(), help="Folder written by `diffsmooth export`.")
@click.option("--batch", type=BATCH, default=1000, show_default=True,
              help="The run's batch: the profile's opt (and max) batch; min is 1.")
@click.option("--max-batch", type=BATCH, default=None, help="Largest batch the engine files take [default: --batch].")
@click.option("--precision", "precisions", type=click.Choice(GRAPH_PRECISIONS), multiple=True,
              help="Build only the graphs of this precision (repeatable) [default: all in --onnx-dir].")
@click.option("--device", default="cuda", show_default=True, help="The GPU to build for (engine files are GPU-specific).")
@click.option("--workspace-gb", type=Number(0, 1 << 20, low_open=True, label="the workspace"), default=4.0,
              show_default=True, help="Builder workspace limit.")
@click.option("--timing-cache", type=click.Path(dir_okay=False), default=None,
              help="Timing cache file [default: one per GPU model in ~/.cache/diffsmooth/tensorrt].")
@click.option("--rebuild", is_flag=True, help="Rebuild even when a cached engine file matches.")
@click.option("--no-validate", is_flag=True, help="Skip the engine-file-vs-ONNX Runtime vote validation.")
@validation_options
def build_engine(onnx_dir, batch, max_batch, precisions, device, workspace_gb, timing_cache, rebuild, no_validate,
                 samples, dataset, data, seed):
    """Build (or reuse cached) TensorRT engine files of the graphs in --onnx-dir, inspect and validate them."""
    if max_batch is not None and max_batch < batch:
        raise click.BadParameter(f"must be >= --batch ({batch}), got {max_batch}", param_hint="--max-batch")
    target = trt_build.current_target(device)
    engine_file_check.build_and_validate(onnx_dir, target, echo=click.echo, err=echo_err,
                                  batch=batch, max_batch=max_batch, precisions=precisions or None,
                                  workspace_bytes=int(workspace_gb * (1 << 30)), timing_cache=timing_cache,
                                  rebuild=rebuild, validate=not no_validate, samples=samples, seed=seed,
                                  dataset=dataset, data=data, device=device)

"""`diffsmooth export`: the denoiser and classifier head as validated ONNX graphs (and TensorRT engine files)."""

from __future__ import annotations

import click

from diffsmooth.cli.options import echo_err, method_options, model_options, validation_options
from diffsmooth.cli.param_types import BATCH
from diffsmooth.engine.base_classifier.methods import MethodConfig
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.models.diffusers_folder import is_diffusers_folder, read_diffusers_folder
from diffsmooth.engine.runs.assemble import (
    classifier_path_for,
    load_classifier_from,
    load_denoiser_from,
)
from diffsmooth.engine.runs.sources import ModelOptions, default_image_shape, resolve_sources
from diffsmooth.export import engine_file_check, trt_build
from diffsmooth.export.onnx_export import checkpoint_source, export_models
from diffsmooth.export.validate import validate_graphs


def parse_image_shape(value, preset, stats):
    """--image-shape C,H,W (or CxHxW); without it, the preset's or the statistics' image shape."""
    if not value:
        return default_image_shape(preset, stats)
    try:
        shape = tuple(int(v) for v in value.replace("x", ",").split(","))
    except ValueError:
        raise UserError(f"--image-shape must be C,H,W (e.g. 3,32,32), got {value!r}") from None
    if len(shape) != 3 or min(shape) < 1:
        raise UserError(f"--image-shape must be three positive integers C,H,W, got {value!r}")
    return shape


@click.command("export")
@model_options(sweep=False)
@method_options(sweep=False)
@click.option("--image-shape", help="C,H,W [default: from the preset: cifar10 3,32,32; imagenet 3,224,224; demo 1,32,32; "
                                   "a diffusers folder: in_channels and sample_size of its UNet config].")
@click.option("--out", required=True, type=click.Path(), help="Folder for the .onnx graphs and their manifests.")
@click.option("--fp16", is_flag=True, help="Also write mixed-fp16 graphs (half, except fp32 norms/softmax/reductions/IO).")
@click.option("--also-unet", is_flag=True, help="Also write the plain UNet graph (x_t, t) -> out.")
@click.option("--no-validate", is_flag=True, help="Skip the torch-vs-ONNX Runtime validation.")
@validation_options
@click.option("--trt", is_flag=True, help="Also build TensorRT engine files of the written graphs (needs TensorRT + GPU).")
@click.option("--trt-batch", type=BATCH, default=1000, show_default=True,
              help="Batch the engine files are optimised for (profile: 1..--trt-max-batch).")
@click.option("--trt-max-batch", type=BATCH, default=None, help="Largest batch the engine files take [default: --trt-batch].")
@click.option("--device", default="cuda", show_default=True, help="GPU for --trt.")
def export(denoiser, scheduler, preset, unet_config, schedule, diffusion_steps, classifier, arch, normalization, stats,
           method, sigma, m, local_sigma, local_noise, method_options, image_shape, out, fp16, also_unet, no_validate,
           samples, dataset, data, seed, trt, trt_batch, trt_max_batch, device):
    """Export the denoiser (at --sigma) and the classifier head to ONNX, validated against torch."""
    if trt_max_batch is not None and trt_max_batch < trt_batch:
        raise click.BadParameter(f"must be >= --trt-batch ({trt_batch}), got {trt_max_batch}", param_hint="--trt-max-batch")
    config = MethodConfig(method, sigma, m, local_sigma, local_noise, options=method_options)
    sources = resolve_sources(ModelOptions(denoiser=denoiser, scheduler=scheduler, classifier=classifier, preset=preset,
                                           unet_config=unet_config, schedule=schedule, diffusion_steps=diffusion_steps,
                                           arch=arch, normalization=normalization, stats=stats), dataset)
    demo = not denoiser and not classifier
    shape = parse_image_shape(image_shape, sources.preset, sources.stats) if image_shape or not \
        is_diffusers_folder(denoiser) else read_diffusers_folder(denoiser, scheduler).image_shape
    den_model = cls_model = den_src = cls_src = None
    if sources.denoiser and (config.purifier.denoises or also_unet):
        den_model = load_denoiser_from(sources)
        den_src = checkpoint_source(sources.denoiser, preset=sources.preset, unet_overrides=sources.unet_config,
                                    **({"scheduler": sources.scheduler} if sources.scheduler else {}))
    if sources.classifier or demo:
        cls_model = load_classifier_from(config, sources)
        cls_src = checkpoint_source(classifier_path_for(config, sources), arch=sources.arch,
                                    normalization=sources.normalization, stats=sources.stats)
    if den_model is None and cls_model is None:
        raise UserError(f"nothing to export: method {config.name} uses no denoiser; give --classifier "
                        "(or --also-unet to export the UNet alone)")
    target = trt_build.current_target(device) if trt else None      # fail before exporting, not after
    graphs = export_models(config, shape, out, denoiser=den_model, classifier=cls_model, fp16=fp16,
                           also_unet=also_unet, denoiser_source=den_src, classifier_source=cls_src,
                           preset=sources.preset)
    for g in graphs:
        echo_err(f"wrote {g.path}")
    if no_validate:
        echo_err("validation skipped (--no-validate): manifests record validation: null")
    else:
        results = validate_graphs(graphs, config, shape, denoiser=den_model, classifier=cls_model,
                                  samples=samples, seed=seed, dataset=dataset, data=data, raise_on_failure=False)
        for line in engine_file_check.result_lines(results):
            click.echo(line)
        engine_file_check.raise_if_failed(results)
    if target is not None:
        engine_file_check.build_and_validate(out, target, echo=click.echo, err=echo_err, batch=trt_batch,
                                      max_batch=trt_max_batch, only=[g.path for g in graphs],
                                      validate=not no_validate, samples=samples, seed=seed, dataset=dataset,
                                      data=data, device=device)

"""The `diffsmooth export` and `diffsmooth validate` commands (registered on the main group).

Only click is imported here; torch, onnx and onnxruntime load when a command runs.
"""

from __future__ import annotations


import click

PRESET_IMAGE_SHAPES = {"cifar10": (3, 32, 32), "imagenet": (3, 224, 224), "demo": (1, 32, 32)}
STATS_IMAGE_SHAPES = {"cifar10": (3, 32, 32), "imagenet": (3, 224, 224), "fashion-mnist": (1, 32, 32)}
PRESET_STATS = {"cifar10": "cifar10", "imagenet": "imagenet", "demo": "fashion-mnist"}
DATASETS = ["cifar10", "imagenet", "npz", "idx", "embedded"]


def _image_shape(value, preset, stats):
    from diffsmooth.engine.errors import UserError
    if value:
        try:
            shape = tuple(int(v) for v in value.replace("x", ",").split(","))
        except ValueError:
            raise UserError(f"--image-shape must be C,H,W (e.g. 3,32,32), got {value!r}") from None
        if len(shape) != 3 or min(shape) < 1:
            raise UserError(f"--image-shape must be three positive integers C,H,W, got {value!r}")
        return shape
    if preset in PRESET_IMAGE_SHAPES:
        return PRESET_IMAGE_SHAPES[preset]
    return STATS_IMAGE_SHAPES.get(stats, (3, 32, 32))


def _sources(kw):
    """ModelSources from the options; neither model given means the embedded demo models."""
    from diffsmooth.engine.runs.assemble import ModelSources, parse_unet_config
    unet_config = parse_unet_config(kw["unet_config"])
    demo = not kw["denoiser"] and not kw["classifier"]
    preset = kw["preset"] or ("demo" if demo else ("cifar10" if kw["denoiser"] and not unet_config else None))
    stats = kw["stats"] or PRESET_STATS.get(preset, "cifar10")
    given = dict(preset=preset, unet_config=unet_config, schedule=kw["schedule"],
                 diffusion_steps=kw["diffusion_steps"], arch=kw["arch"], normalization=kw["normalization"],
                 stats=stats)
    if demo:
        return ModelSources.demo(**{k: v for k, v in given.items() if v not in (None, {})}), True
    return ModelSources(denoiser=kw["denoiser"], classifier=kw["classifier"], **given), False


def validation_options(f):
    """--samples/--dataset/--data/--seed: the noisy real samples whose votes a validation compares."""
    for option in reversed([
        click.option("--samples", type=int, default=1000, show_default=True,
                     help="Noisy samples for vote agreement (>= 1000 for TensorRT plans)."),
        click.option("--dataset", type=click.Choice(DATASETS), help="Validation images [default: embedded subset]."),
        click.option("--data", type=click.Path(), help="Dataset directory or file for --dataset."),
        click.option("--seed", type=int, default=0, show_default=True, help="Noise seed for validation."),
    ]):
        f = option(f)
    return f


@click.command("export")
@click.option("--denoiser", type=click.Path(), help="UNet checkpoint (improved-/guided-diffusion state dict).")
@click.option("--preset", type=click.Choice(["cifar10", "imagenet", "demo"]),
              help="UNet architecture + schedule [default: cifar10, or demo for the embedded models].")
@click.option("--unet-config", default=None, help="JSON of UNet config fields overriding the preset.")
@click.option("--schedule", type=click.Choice(["linear", "cosine"]), help="Override the preset's schedule.")
@click.option("--diffusion-steps", type=int, help="Override the preset's number of diffusion steps.")
@click.option("--classifier", type=click.Path(), help="Classifier checkpoint (Cohen/SmoothAdv dict or state dict).")
@click.option("--arch", help="Classifier architecture when the checkpoint does not say.")
@click.option("--normalization", type=click.Choice(["normalize", "center", "none"]),
              help="Input layer in front of the classifier [default: per --stats].")
@click.option("--stats", type=click.Choice(["cifar10", "imagenet", "fashion-mnist"]),
              help="Mean/std for normalisation [default: from the preset].")
@click.option("--method", type=click.Choice(["rs", "dds", "diffsmooth"]), default="diffsmooth", show_default=True)
@click.option("--sigma", type=float, default=0.5, show_default=True, help="Smoothing noise std (input in [0,1]).")
@click.option("--m", "m", type=int, default=5, show_default=True, help="Number of local noises.")
@click.option("--local-sigma", type=float, default=0.25, show_default=True, help="sigma' of the local noises.")
@click.option("--local-noise", type=click.Choice(["fixed", "fresh"]), default="fixed", show_default=True,
              help="fixed: m noises baked into the graph (seed 42); fresh: the graph takes them as input.")
@click.option("--image-shape", help="C,H,W [default: from the preset: cifar10 3,32,32; imagenet 3,224,224; demo 1,32,32].")
@click.option("--out", required=True, type=click.Path(), help="Folder for the .onnx graphs and their manifests.")
@click.option("--fp16", is_flag=True, help="Also write mixed-fp16 graphs (half, except fp32 norms/softmax/reductions/IO).")
@click.option("--also-unet", is_flag=True, help="Also write the plain UNet graph (x_t, t) -> out.")
@click.option("--no-validate", is_flag=True, help="Skip the torch-vs-ONNX Runtime validation.")
@validation_options
@click.option("--trt", is_flag=True, help="Also build TensorRT plans of the written graphs (needs TensorRT + GPU).")
@click.option("--trt-batch", type=int, default=1000, show_default=True,
              help="Batch the plans are optimised for (profile: 1..--trt-max-batch).")
@click.option("--trt-max-batch", type=int, default=None, help="Largest batch the plans take [default: --trt-batch].")
@click.option("--device", default="cuda", show_default=True, help="GPU for --trt.")
def export(**kw):
    """Export the denoiser (at --sigma) and the classifier head to ONNX, validated against torch."""
    from diffsmooth.engine.runs.assemble import load_classifier_from, load_denoiser_from
    from diffsmooth.engine.errors import UserError
    from diffsmooth.engine.base_classifier.methods import MethodConfig

    from .onnx_export import checkpoint_source, export_models
    from .validate import validate_graphs

    config = MethodConfig(kw["method"], kw["sigma"], kw["m"], kw["local_sigma"], kw["local_noise"])
    sources, demo = _sources(kw)
    shape = _image_shape(kw["image_shape"], sources.preset, sources.stats)
    denoiser = classifier = None
    den_src = cls_src = None
    if sources.denoiser and (config.uses_denoiser or kw["also_unet"]):
        denoiser = load_denoiser_from(sources)
        den_src = checkpoint_source(sources.denoiser, preset=sources.preset, unet_overrides=sources.unet_config)
    if sources.classifier or demo:
        classifier = load_classifier_from(config, sources)
        path = sources.classifier
        if not path:
            from diffsmooth.engine.demo import shipped as demo_assets
            path = str(demo_assets.demo_classifier_for(config.method, config.sigma, config.local_sigma))
        cls_src = checkpoint_source(path, arch=sources.arch, normalization=sources.normalization, stats=sources.stats)
    if denoiser is None and classifier is None:
        raise UserError(f"nothing to export: method {config.method} uses no denoiser; give --classifier "
                        "(or --also-unet to export the UNet alone)")
    target = _trt_target(kw["device"]) if kw["trt"] else None   # fail before exporting, not after
    graphs = export_models(config, shape, kw["out"], denoiser=denoiser, classifier=classifier, fp16=kw["fp16"],
                           also_unet=kw["also_unet"], denoiser_source=den_src, classifier_source=cls_src,
                           preset=sources.preset)
    for g in graphs:
        click.echo(f"wrote {g.path}", err=True)
    if kw["no_validate"]:
        click.echo("validation skipped (--no-validate): manifests record validation: null", err=True)
    else:
        results = validate_graphs(graphs, config, shape, denoiser=denoiser, classifier=classifier,
                                  samples=kw["samples"], seed=kw["seed"], dataset=kw["dataset"], data=kw["data"],
                                  raise_on_failure=False)
        _echo_results(results)
        _raise_if_failed(results)
    if target is not None:
        _build_and_validate(kw["out"], target, batch=kw["trt_batch"], max_batch=kw["trt_max_batch"],
                            only=[g.path for g in graphs], validate=not kw["no_validate"], samples=kw["samples"],
                            seed=kw["seed"], dataset=kw["dataset"], data=kw["data"], device=kw["device"])


@click.command("validate")
@click.option("--onnx-dir", required=True, type=click.Path(), help="Folder written by `diffsmooth export`.")
@validation_options
def validate(onnx_dir, samples, dataset, data, seed):
    """Re-run torch vs ONNX Runtime on every graph in --onnx-dir; results go into the manifests."""
    from .validate import validate_dir
    results = validate_dir(onnx_dir, samples=samples, seed=seed, dataset=dataset, data=data)
    _echo_results(results)


def _echo_results(results):
    from pathlib import Path
    for path, r in results.items():
        state = "ok  " if r["passed"] else "FAIL"
        click.echo(f"{state} {Path(path).name}: {r['summary']}")


def _raise_if_failed(results):
    from pathlib import Path

    from .validate import ValidationFailed
    failed = [f"{Path(p).name}: {r['summary']}" for p, r in results.items() if not r["passed"]]
    if failed:
        raise ValidationFailed("ONNX validation failed (" + "; ".join(failed) + "); results are in the manifests")


@click.command("build-engine")
@click.option("--onnx-dir", required=True, type=click.Path(), help="Folder written by `diffsmooth export`.")
@click.option("--batch", type=int, default=1000, show_default=True,
              help="The run's batch: the profile's opt (and max) batch; min is 1.")
@click.option("--max-batch", type=int, default=None, help="Largest batch the plans take [default: --batch].")
@click.option("--precision", "precisions", type=click.Choice(["fp32", "fp16"]), multiple=True,
              help="Build only the graphs of this precision (repeatable) [default: all in --onnx-dir].")
@click.option("--device", default="cuda", show_default=True, help="The GPU to build for (plans are GPU-specific).")
@click.option("--workspace-gb", type=float, default=4.0, show_default=True, help="Builder workspace limit.")
@click.option("--timing-cache", type=click.Path(dir_okay=False), default=None,
              help="Timing cache file [default: one per GPU model in ~/.cache/diffsmooth/tensorrt].")
@click.option("--rebuild", is_flag=True, help="Rebuild even when a cached plan matches.")
@click.option("--no-validate", is_flag=True, help="Skip the plan-vs-ONNX Runtime vote validation.")
@validation_options
def build_engine(onnx_dir, batch, max_batch, precisions, device, workspace_gb, timing_cache, rebuild, no_validate,
                 samples, dataset, data, seed):
    """Build (or reuse cached) TensorRT plans of the graphs in --onnx-dir, inspect and validate them."""
    target = _trt_target(device)
    _build_and_validate(onnx_dir, target, batch=batch, max_batch=max_batch, precisions=precisions or None,
                        workspace_bytes=int(workspace_gb * (1 << 30)), timing_cache=timing_cache, rebuild=rebuild,
                        validate=not no_validate, samples=samples, seed=seed, dataset=dataset, data=data,
                        device=device)


def _trt_target(device):
    from .trt_build import current_target
    return current_target(device)


def _build_and_validate(onnx_dir, target, *, batch, max_batch=None, precisions=None, only=None,
                        workspace_bytes=None, timing_cache=None, rebuild=False, validate=True, samples=1000,
                        seed=0, dataset=None, data=None, device="cuda"):
    """Build/reuse the plans, print their inspection, validate them; non-zero exit on any failure."""
    from diffsmooth.engine.backends.trt_plans import DEFAULT_WORKSPACE_BYTES
    from diffsmooth.engine.errors import UserError

    from .trt_build import build_plans
    from .trt_validate import MIN_SAMPLES, validate_plans
    from .validate import ValidationFailed
    if batch < 1 or (max_batch is not None and max_batch < batch):
        raise UserError(f"need 1 <= batch <= max batch, got batch {batch}, max batch {max_batch}")
    if workspace_bytes is not None and workspace_bytes < (1 << 20):
        raise UserError(f"--workspace-gb must allow at least 1 MiB, got {workspace_bytes} bytes")
    if validate and samples < MIN_SAMPLES:
        raise UserError(f"plan validation needs --samples >= {MIN_SAMPLES} (got {samples}), or --no-validate")
    echo = lambda line: click.echo(line, err=True)   # noqa: E731
    results = build_plans(onnx_dir, target, batch=batch, max_batch=max_batch, precisions=precisions, only=only,
                          workspace_bytes=workspace_bytes or DEFAULT_WORKSPACE_BYTES,
                          timing_cache=timing_cache, rebuild=rebuild, echo=echo)
    for r in results:
        click.echo(f"plan {r.plan_path}")
    bad = [f"{r.plan_path.name}: {'; '.join(r.inspection.get('failures', []))}" for r in results
           if r.inspection and not r.inspection.get("passed", True)]
    if validate:
        validate_plans(results, onnx_dir, device=device, samples=samples, seed=seed, dataset=dataset, data=data,
                       echo=echo)
    else:
        click.echo("plan validation skipped (--no-validate): plan manifests record validation: null", err=True)
    if bad:
        raise ValidationFailed("TensorRT plan precision is not as intended (" + " | ".join(bad) + ")")

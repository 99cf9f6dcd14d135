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
@click.option("--fp16", is_flag=True, help="Also write mixed-fp16 graphs (half Conv/MatMul/Gemm, fp32 norms/softmax/IO).")
@click.option("--also-unet", is_flag=True, help="Also write the plain UNet graph (x_t, t) -> out.")
@click.option("--no-validate", is_flag=True, help="Skip the torch-vs-ONNX Runtime validation.")
@click.option("--samples", type=int, default=1000, show_default=True, help="Noisy samples for vote agreement.")
@click.option("--dataset", type=click.Choice(DATASETS), help="Validation images [default: embedded subset].")
@click.option("--data", type=click.Path(), help="Dataset directory or file for --dataset.")
@click.option("--seed", type=int, default=0, show_default=True, help="Noise seed for validation.")
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
    graphs = export_models(config, shape, kw["out"], denoiser=denoiser, classifier=classifier, fp16=kw["fp16"],
                           also_unet=kw["also_unet"], denoiser_source=den_src, classifier_source=cls_src,
                           preset=sources.preset)
    for g in graphs:
        click.echo(f"wrote {g.path}", err=True)
    if kw["no_validate"]:
        click.echo("validation skipped (--no-validate): manifests record validation: null", err=True)
        return
    results = validate_graphs(graphs, config, shape, denoiser=denoiser, classifier=classifier,
                              samples=kw["samples"], seed=kw["seed"], dataset=kw["dataset"], data=kw["data"],
                              raise_on_failure=False)
    _echo_results(results)
    _raise_if_failed(results)


@click.command("validate")
@click.option("--onnx-dir", required=True, type=click.Path(), help="Folder written by `diffsmooth export`.")
@click.option("--samples", type=int, default=1000, show_default=True, help="Noisy samples for vote agreement.")
@click.option("--dataset", type=click.Choice(DATASETS), help="Validation images [default: embedded subset].")
@click.option("--data", type=click.Path(), help="Dataset directory or file for --dataset.")
@click.option("--seed", type=int, default=0, show_default=True, help="Noise seed.")
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

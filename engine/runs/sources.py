"""From the model options to ModelSources: one rule for certify, predict, purify and export."""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields

from diffsmooth.engine.choices import MAX_DIFFUSION_STEPS
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.models import shipped
from diffsmooth.engine.models.diffusers_folder import is_diffusers_folder, read_diffusers_folder
from diffsmooth.engine.models.unet import UNetConfig
from diffsmooth.engine.models.unet import unet_config as build_unet_config
from diffsmooth.engine.runs.assemble import ModelSources, parse_unet_config

# The dataset each preset's checkpoints were trained on, as a normalisation table name.
PRESET_STATS = {"cifar10": "cifar10", "imagenet": "imagenet", "demo": "fashion-mnist"}
# The normalisation table of a dataset kind, for a classifier given without a preset.
DATASET_STATS = {"cifar10": "cifar10", "imagenet": "imagenet", "idx": "fashion-mnist",
                 "embedded": "fashion-mnist", "npz": "cifar10"}
PRESET_IMAGE_SHAPES = {"cifar10": (3, 32, 32), "imagenet": (3, 224, 224), "demo": (1, 32, 32)}
STATS_IMAGE_SHAPES = {"cifar10": (3, 32, 32), "imagenet": (3, 224, 224), "fashion-mnist": (1, 32, 32)}


def default_stats(preset: str | None, dataset_kind: str | None) -> str:
    """The normalisation statistics when --stats is not given.

    They belong to the models, not to the file the images come from: a preset (given, or implied by
    a denoiser) names the dataset its checkpoints were trained on, so it decides. Only a classifier
    without any preset falls back to the dataset being certified, then to cifar10. So the same
    checkpoints get the same input layer whether certified from an .npz copy or the original
    folder, and `export` (which may have no dataset) builds the graph `certify` runs.
    """
    if preset in PRESET_STATS:
        return PRESET_STATS[preset]
    return DATASET_STATS.get(dataset_kind, "cifar10")


@dataclass(frozen=True)
class ModelOptions:
    """The model options as given (certify's, export's, purify's): checkpoints, UNet and schedule, classifier input."""

    denoiser: str | None = None
    scheduler: str | None = None
    classifier: str | None = None
    preset: str | None = None
    unet_config: str | None = None              # JSON text
    schedule: str | None = None
    diffusion_steps: int | None = None
    arch: str | None = None
    normalization: str | None = None
    stats: str | None = None

    @classmethod
    def of(cls, request) -> "ModelOptions":
        """The model options of a RunRequest (its fields of the same names; the single run's classifier)."""
        given = {f.name: getattr(request, f.name) for f in fields(cls) if f.name != "classifier"}
        return cls(classifier=request.classifier_path, **given)


def resolve_sources(options: ModelOptions = ModelOptions(), dataset_kind: str | None = None) -> ModelSources:
    """ModelSources from the model options (--unet-config as JSON text); neither checkpoint given
    means the shipped demo models. A denoiser without preset or --unet-config is a cifar10 one; a
    diffusers folder brings its own configs (and takes `scheduler` when it is a UNet folder).
    `dataset_kind`: the data's kind, whose statistics a classifier without preset takes."""
    denoiser, preset, steps = options.denoiser, options.preset, options.diffusion_steps
    config = parse_unet_config(options.unet_config)
    demo = not denoiser and not options.classifier
    folder = None
    if is_diffusers_folder(denoiser):
        folder = read_diffusers_folder(denoiser, options.scheduler)     # what it is and that its configs are supported
        check_diffusers_options(denoiser, preset=preset, unet_config=config, schedule=options.schedule,
                                diffusion_steps=steps)
    elif options.scheduler is not None:
        raise UserError("`scheduler` is for a diffusers UNet folder given as `denoiser`; a checkpoint file takes "
                        "`preset` / `schedule`")
    elif preset is None:
        if demo:
            preset = shipped.DEMO_PRESET
        elif denoiser and not config:
            preset = "cifar10"
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int)
                              or not 1 <= steps <= MAX_DIFFUSION_STEPS):
        raise UserError(f"`diffusion_steps` must be an integer in 1..{MAX_DIFFUSION_STEPS:,}, got {steps!r}")
    if config and (denoiser or demo):           # the UNet's fields, checked before any model loads
        check_unet_config(preset, config)
    given = {"preset": preset, "unet_config": config, "schedule": options.schedule, "diffusion_steps": steps,
             "arch": options.arch, "normalization": options.normalization,
             "stats": options.stats or default_stats(preset, dataset_kind)}
    if demo:
        return ModelSources.demo(**{k: v for k, v in given.items() if v not in (None, {})})
    return ModelSources(denoiser=denoiser, scheduler=options.scheduler, classifier=options.classifier, diffusers=folder,
                        **given)


def check_diffusers_options(denoiser: str, **options) -> None:
    """A diffusers folder's configs give its UNet and schedule: the options for checkpoint files are refused."""
    given = [name for name, value in options.items() if value not in (None, {})]
    if given:
        raise UserError(f"{denoiser} is a diffusers folder, whose configs give the UNet and its schedule: leave out "
                        f"{', '.join(f'`{g}`' for g in given)}")


def check_unet_config(preset: str | None, config: dict) -> None:
    """UserError for an unknown UNet field or a value the UNet cannot take. Without a preset a config
    missing required fields is left to the denoiser's loading, which names them."""
    known = {f.name: f for f in fields(UNetConfig)}
    unknown = sorted(set(config) - set(known))
    if unknown:
        raise UserError(f"`unet_config`: unknown UNet config key(s) {', '.join(unknown)}; valid keys: {', '.join(known)}")
    required = [name for name, f in known.items() if f.default is MISSING and f.default_factory is MISSING]
    if preset is None and any(name not in config for name in required):
        return
    try:
        build_unet_config(preset, **config)
    except (TypeError, ValueError) as exc:
        raise UserError(f"`unet_config`: {exc}") from None


def default_image_shape(preset: str | None, stats: str | None) -> tuple[int, int, int]:
    """C,H,W of the preset's images, else of the normalisation's dataset (cifar10-sized otherwise)."""
    if preset in PRESET_IMAGE_SHAPES:
        return PRESET_IMAGE_SHAPES[preset]
    return STATS_IMAGE_SHAPES.get(stats, (3, 32, 32))

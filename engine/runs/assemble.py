"""From model sources to loaded models, and from stages to a ready voter: what a run's models are
(`ModelSources`, the loaders), the pipeline around built stages, and the once-per-run check of a fast path
against eager fp32. Building the stages on a backend is engine/runs/stage_build.py's (engine/backends/)."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from typing import Dict, Optional, Sequence, Tuple

import torch

from diffsmooth.engine.base_classifier.configurations import (
    Configuration,
)
from diffsmooth.engine.base_classifier.denoise import load_denoiser
from diffsmooth.engine.base_classifier.methods import MethodConfig
from diffsmooth.engine.certify.monte_carlo import MonteCarloPipeline, initial_score_chunks
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.models import shipped as demo_assets
from diffsmooth.engine.models.checkpoints import load_classifier
from diffsmooth.engine.models.diffusers_folder import DiffusersFolder
from diffsmooth.engine.runs.fast_path import VALIDATE_SAMPLES, FastPath, validate_fast_path
from diffsmooth.engine.runs.vote_agreement import FP16_FLIP_RATE
from diffsmooth.engine.stages.base import BaseClassifierStages


@dataclass
class ModelSources:
    """Checkpoint paths and how to read them; None paths mean the embedded demo models."""

    denoiser: Optional[str] = None
    preset: Optional[str] = None
    unet_config: dict = field(default_factory=dict)
    schedule: Optional[str] = None
    diffusion_steps: Optional[int] = None
    rescale_timesteps: Optional[bool] = None
    scheduler: Optional[str] = None             # a diffusers UNet folder's scheduler folder
    classifier: Optional[str] = None
    arch: Optional[str] = None
    normalization: Optional[str] = None
    stats: str = "cifar10"
    diffusers: Optional[DiffusersFolder] = field(default=None, compare=False, repr=False)   # the denoiser folder, read

    @classmethod
    def demo(cls, **overrides) -> "ModelSources":
        demo_assets.require_demo_assets()
        fields = dict(denoiser=str(demo_assets.DEMO_UNET), preset=demo_assets.DEMO_PRESET,
                      stats=demo_assets.DEMO_STATS)
        fields.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**fields)


def parse_unet_config(text: Optional[str]) -> dict:
    """--unet-config: a JSON object of UNet config fields ({} when not given)."""
    if not text:
        return {}
    def refuse(constant):
        raise ValueError(f"{constant} is not a finite number")

    def finite(number: str) -> float:
        value = float(number)
        return value if math.isfinite(value) else refuse(number)
    try:
        config = json.loads(text, parse_constant=refuse, parse_float=finite)
    except ValueError as exc:                   # JSONDecodeError is a ValueError
        raise UserError(f"`unet_config` is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise UserError("`unet_config` must be a JSON object of UNet config fields")
    return config


def load_denoiser_from(sources: ModelSources):
    """The one-shot denoiser named by `sources` (eval mode, CPU)."""
    if not sources.denoiser:
        raise UserError("give `denoiser` CHECKPOINT")
    return load_denoiser(sources.diffusers or sources.denoiser, sources.preset, schedule=sources.schedule,
                         diffusion_steps=sources.diffusion_steps,
                         rescale_timesteps=sources.rescale_timesteps, scheduler=sources.scheduler,
                         **sources.unet_config)


def classifier_path_for(config: MethodConfig, sources: ModelSources) -> str:
    """The classifier checkpoint named by `sources`, or the demo classifier matching the method's noise level."""
    if sources.classifier:
        return sources.classifier
    if sources.preset != demo_assets.DEMO_PRESET:
        raise UserError("give `classifier` CHECKPOINT")
    return str(config.method.demo_classifier(config))


def load_classifier_from(config: MethodConfig, sources: ModelSources):
    """The classifier named by `sources`, or the demo classifier matching the method's noise level."""
    return load_classifier(classifier_path_for(config, sources), arch=sources.arch, dataset=sources.stats,
                           normalization=sources.normalization)


def load_models(config: MethodConfig, sources: ModelSources):
    """(denoiser or None, classifier) as torch modules on the CPU, in eval mode."""
    if config.purifier.denoises and not sources.denoiser:
        raise UserError(f"method {config.name} needs `denoiser` CHECKPOINT")
    denoiser = load_denoiser_from(sources) if config.purifier.denoises else None
    return denoiser, load_classifier_from(config, sources)


def load_sweep_models(configs: Sequence[Configuration], classifier_paths: Dict[str, str], sources: ModelSources):
    """(denoiser or None, {name: classifier}) of a sweep, each classifier loaded once."""
    needs_denoiser = any(c.config.purifier.denoises for c in configs)
    if needs_denoiser and not sources.denoiser:
        raise UserError("the sweep's dds / diffsmooth configurations need `denoiser` CHECKPOINT")
    denoiser = load_denoiser_from(sources) if needs_denoiser else None
    classifiers = {name: load_classifier(classifier_paths[name], arch=sources.arch, dataset=sources.stats,
                                         normalization=sources.normalization)
                   for name in sorted({c.classifier for c in configs})}
    return denoiser, classifiers


def build_pipeline(stages: BaseClassifierStages, sigma: float, seed: int, fast: FastPath, log=None,
                   configs: Sequence[MethodConfig] = (), backend: str = "torch") -> MonteCarloPipeline:
    """The voter of the stages with the fast path's batch shape, lanes and noise kernel; `configs` and `backend`
    join its settings (what torchrun's ranks compare before summing votes)."""
    voter = MonteCarloPipeline(stages, sigma, seed, static_batch=fast.static_batch, streams=fast.streams,
                               compiled_noise=fast.compiled_noise, log=log, classifier_batch=fast.classifier_batch)
    voter.settings = repr(([c.as_dict() for c in configs], backend, sorted(fast.as_dict().items())))
    return voter


def classifier_call_images(config: MethodConfig, batch: int, image_shape: Tuple[int, ...], device,
                           classifier_batch: Optional[int] = None) -> int:
    """Images per classifier call in a run at `batch`: the pipeline's first chunk of the batch (at most
    `classifier_batch` samples when given), times m for local smoothing (the shape the fused-convolution
    probe must see)."""
    per_sample = config.method.classifier_calls(config)
    numel = 1
    for d in image_shape:
        numel *= int(d)
    pieces = initial_score_chunks(int(batch), per_sample, numel, torch.device(device), most=classifier_batch)
    return (int(batch) // pieces) * per_sample


def check_against_eager(pipeline: MonteCarloPipeline, reference: MonteCarloPipeline, check_images, batch: int,
                        validate_samples: int = VALIDATE_SAMPLES, expected_flip_rate: float = FP16_FLIP_RATE,
                        log=None) -> None:
    """The once-per-run check of a compiled or reduced-precision pipeline's production counts against
    the same stages in eager fp32, on `check_images` ((index, image) pairs), `validate_samples` samples
    each, every configuration of a sweep included; printed, and a path that disagrees is refused."""
    validate_fast_path(pipeline, reference, list(check_images), validate_samples, batch, expected_flip_rate,
                       log or _stderr)


def _stderr(message: str) -> None:
    print(message, file=sys.stderr)

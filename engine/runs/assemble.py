"""From model sources to a ready voter: load models -> build backend stages -> pipeline, for one
configuration or a sweep's configurations.

This is the one place that knows which backend was asked for; everything downstream only sees
stages (engine/backends/base.py).
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from dataclasses import dataclass, field
from typing import Dict, Optional, Sequence, Tuple

import torch

from diffsmooth.engine.backends.base import BaseClassifierStages
from diffsmooth.engine.backends.torch_backend import TorchBackend
from diffsmooth.engine.base_classifier.configurations import (
    Configuration,
    stacked_configuration_stages,
    torch_configuration_stages,
)
from diffsmooth.engine.base_classifier.denoise import load_denoiser
from diffsmooth.engine.base_classifier.methods import MethodConfig
from diffsmooth.engine.base_classifier.onnx_stages import build_onnx_stages
from diffsmooth.engine.base_classifier.tensorrt_stages import build_trt_stages
from diffsmooth.engine.base_classifier.torch_stages import build_torch_stages
from diffsmooth.engine.certify.monte_carlo import MonteCarloPipeline, initial_score_chunks
from diffsmooth.engine.certify.smooth import Smooth
from diffsmooth.engine.choices import BACKENDS
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.models import shipped as demo_assets
from diffsmooth.engine.models.checkpoints import load_classifier
from diffsmooth.engine.runs.fast_path import VALIDATE_SAMPLES, FastPath, validate_fast_path
from diffsmooth.engine.runs.model_set import ModelSet
from diffsmooth.engine.runs.vote_agreement import FP16_FLIP_RATE


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
    return load_denoiser(sources.denoiser, sources.preset, schedule=sources.schedule,
                         diffusion_steps=sources.diffusion_steps,
                         rescale_timesteps=sources.rescale_timesteps, scheduler=sources.scheduler,
                         **sources.unet_config)


def classifier_path_for(config: MethodConfig, sources: ModelSources) -> str:
    """The classifier checkpoint named by `sources`, or the demo classifier matching the method's noise level."""
    if sources.classifier:
        return sources.classifier
    if sources.preset != demo_assets.DEMO_PRESET:
        raise UserError("give `classifier` CHECKPOINT")
    return str(config.kind.demo_classifier(config.sigma, config.local_sigma))


def load_classifier_from(config: MethodConfig, sources: ModelSources):
    """The classifier named by `sources`, or the demo classifier matching the method's noise level."""
    return load_classifier(classifier_path_for(config, sources), arch=sources.arch, dataset=sources.stats,
                           normalization=sources.normalization)


def load_models(config: MethodConfig, sources: ModelSources):
    """(denoiser or None, classifier) as torch modules on the CPU, in eval mode."""
    if config.uses_denoiser and not sources.denoiser:
        raise UserError(f"method {config.method} needs `denoiser` CHECKPOINT")
    denoiser = load_denoiser_from(sources) if config.uses_denoiser else None
    return denoiser, load_classifier_from(config, sources)


def build_stages(config: MethodConfig, sources: ModelSources, image_shape: Tuple[int, ...],
                 num_classes: Optional[int] = None, *, backend: str = "torch", device: str = "cpu",
                 precision: str = "fp32", onnx_dir: Optional[str] = None, fast: FastPath = FastPath(),
                 models=None, log=None, batch: int = 1000, model_set: Optional[ModelSet] = None) -> BaseClassifierStages:
    """The stages of one configuration on the requested backend; probes the models with `image_shape`.
    `models` = (denoiser, classifier) already loaded (torch backend); `model_set`: a table's built
    stages, reused (weights copied in) where the architecture matches."""
    if backend != "torch":
        stages = _exported_stages(config, sources, image_shape, num_classes, backend, device, precision, onnx_dir, batch)
        if model_set is not None:
            model_set.note_built(stages)
        return stages
    runner = _torch_runner(device, precision, fast, log, model_set)
    denoiser, classifier = models or load_models(config, sources)
    return build_torch_stages(config, classifier, denoiser, runner, image_shape, num_classes,
                              fused_attention=fast.fused_attention, fused_conv=fast.fused_conv, log=log,
                              classifier_batch=classifier_call_images(config, batch, image_shape, runner.device,
                                                                      fast.classifier_batch),
                              lean_unet=fast.lean_unet, triton_conv=fast.triton_conv,
                              triton_blocks=fast.triton_blocks, pack_images=fast.pack_images)


def _torch_runner(device: str, precision: str, fast: FastPath, log, model_set: Optional[ModelSet]):
    """The torch backend for the fast path; its stages come from `model_set` when one is given."""
    runner = TorchBackend(device=device, precision=precision, compile=fast.compile, cuda_graphs=fast.cuda_graphs, log=log,
                          compile_mode=fast.compile_mode, inductor=fast.inductor,
                          classifier_compile_mode=fast.classifier_compile_mode)
    return model_set.backend(runner) if model_set is not None else runner


def _exported_stages(config: MethodConfig, sources: ModelSources, image_shape, num_classes, backend: str, device: str,
                     precision: str, onnx_dir: Optional[str], batch: int) -> BaseClassifierStages:
    """One configuration's stages from exported graphs (ONNX Runtime) or plans (TensorRT)."""
    if not onnx_dir:
        raise UserError(f"`backend` {backend} needs `onnx_dir` (graphs from `diffsmooth export`"
                        + (", plans from `diffsmooth build-engine`)" if backend == "tensorrt" else ")"))
    if backend == "onnxruntime":
        return build_onnx_stages(onnx_dir, config, image_shape, num_classes, device=device, precision=precision,
                                 classifier=sources.classifier)
    if backend == "tensorrt":
        return build_trt_stages(onnx_dir, config, image_shape, num_classes, device=device, precision=precision,
                                batch=batch, classifier=sources.classifier)
    raise UserError(f"unknown backend {backend!r}: choose one of {', '.join(BACKENDS)}")


def build_sweep_stages(configs: Sequence[Configuration], classifier_paths: Dict[str, str], sources: ModelSources,
                       image_shape: Tuple[int, ...], num_classes: Optional[int] = None, *, backend: str = "torch",
                       device: str = "cpu", precision: str = "fp32", onnx_dir: Optional[str] = None,
                       fast: FastPath = FastPath(), models=None, log=None, batch: int = 1000,
                       model_set: Optional[ModelSet] = None) -> BaseClassifierStages:
    """The stages of several configurations at one sigma scored on the same samples (a sweep): on the
    torch backend one module scoring all of them; on exported backends each configuration's graph or
    plan, stacked. `models` = (denoiser, {name: classifier}) already loaded (torch backend);
    `model_set` as for build_stages."""
    if backend == "torch":
        runner = _torch_runner(device, precision, fast, log, model_set)
        denoiser, classifiers = models or load_sweep_models(configs, classifier_paths, sources)
        return torch_configuration_stages(configs, classifiers, denoiser, runner, image_shape, num_classes,
                                          fused_attention=fast.fused_attention, lean_unet=fast.lean_unet)

    def stages_of(c: Configuration) -> BaseClassifierStages:
        one = dataclasses.replace(sources, classifier=classifier_paths[c.classifier])
        return build_stages(c.method, one, image_shape, num_classes, backend=backend, device=device,
                            precision=precision, onnx_dir=onnx_dir, fast=fast, log=log, batch=batch,
                            model_set=model_set)
    return stacked_configuration_stages(configs, stages_of)


def load_sweep_models(configs: Sequence[Configuration], classifier_paths: Dict[str, str], sources: ModelSources):
    """(denoiser or None, {name: classifier}) of a sweep, each classifier loaded once."""
    needs_denoiser = any(c.method.uses_denoiser for c in configs)
    if needs_denoiser and not sources.denoiser:
        raise UserError("the sweep's dds / diffsmooth configurations need `denoiser` CHECKPOINT")
    denoiser = load_denoiser_from(sources) if needs_denoiser else None
    classifiers = {name: load_classifier(classifier_paths[name], arch=sources.arch, dataset=sources.stats,
                                         normalization=sources.normalization)
                   for name in sorted({c.classifier for c in configs})}
    return denoiser, classifiers


def build_pipeline(stages: BaseClassifierStages, sigma: float, seed: int, fast: FastPath, log=None) -> MonteCarloPipeline:
    """The voter of the stages with the fast path's batch shape, lanes and noise kernel."""
    return MonteCarloPipeline(stages, sigma, seed, static_batch=fast.static_batch, streams=fast.streams,
                              compiled_noise=fast.compiled_noise, log=log, classifier_batch=fast.classifier_batch)


def build_smooth(config: MethodConfig, sources: ModelSources, image_shape: Tuple[int, ...],
                 num_classes: Optional[int] = None, *, backend: str = "torch", device: str = "cpu",
                 precision: str = "fp32", seed: int = 0, onnx_dir: Optional[str] = None,
                 fast: Optional[FastPath] = None, models=None, log=None, batch: int = 1000) -> Smooth:
    """A Smooth for `config` on the requested backend (the fast path resolved for the device when not given)."""
    fast = fast if fast is not None else FastPath.resolve(device, backend=backend)
    stages = build_stages(config, sources, image_shape, num_classes, backend=backend, device=device,
                          precision=precision, onnx_dir=onnx_dir, fast=fast, models=models, log=log, batch=batch)
    return Smooth(build_pipeline(stages, config.sigma, seed, fast, log))


def classifier_call_images(config: MethodConfig, batch: int, image_shape: Tuple[int, ...], device,
                           classifier_batch: Optional[int] = None) -> int:
    """Images per classifier call in a run at `batch`: the pipeline's first chunk of the batch (at most
    `classifier_batch` samples when given), times m for local smoothing (the shape the fused-convolution
    probe must see)."""
    per_sample = config.kind.classifier_calls(config)
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

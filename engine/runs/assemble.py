"""From user settings to a ready Smooth: load models -> build backend stages -> pipeline.

This is the one place that knows which backend was asked for; everything downstream only sees
stages (engine/backends/base.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Tuple

from diffsmooth.engine.base_classifier.methods import MethodConfig, build_torch_stages
from diffsmooth.engine.certify.core import Smooth
from diffsmooth.engine.certify.monte_carlo import MonteCarloPipeline
from diffsmooth.engine.choices import BACKENDS
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.models import shipped as demo_assets
from diffsmooth.engine.runs.fast_path import VALIDATE_SAMPLES, FastPath, validate_fast_path
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
    import json
    if not text:
        return {}
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"`unet_config` is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise UserError("`unet_config` must be a JSON object of UNet config fields")
    return config


def load_denoiser_from(sources: ModelSources):
    """The one-shot denoiser named by `sources` (eval mode, CPU)."""
    from diffsmooth.engine.base_classifier.denoise import load_denoiser
    if not sources.denoiser:
        raise UserError("give `denoiser` CHECKPOINT")
    return load_denoiser(sources.denoiser, sources.preset, schedule=sources.schedule,
                         diffusion_steps=sources.diffusion_steps,
                         rescale_timesteps=sources.rescale_timesteps, **sources.unet_config)


def classifier_path_for(config: MethodConfig, sources: ModelSources) -> str:
    """The classifier checkpoint named by `sources`, or the demo classifier matching the method's noise level."""
    if sources.classifier:
        return sources.classifier
    if sources.preset != demo_assets.DEMO_PRESET:
        raise UserError("give `classifier` CHECKPOINT")
    return str(demo_assets.demo_classifier_for(config.method, config.sigma, config.local_sigma))


def load_classifier_from(config: MethodConfig, sources: ModelSources):
    """The classifier named by `sources`, or the demo classifier matching the method's noise level."""
    from diffsmooth.engine.models.checkpoints import load_classifier
    return load_classifier(classifier_path_for(config, sources), arch=sources.arch, dataset=sources.stats,
                           normalization=sources.normalization)


def load_models(config: MethodConfig, sources: ModelSources):
    """(denoiser or None, classifier) as torch modules on the CPU, in eval mode."""
    if config.uses_denoiser and not sources.denoiser:
        raise UserError(f"method {config.method} needs `denoiser` CHECKPOINT")
    denoiser = load_denoiser_from(sources) if config.uses_denoiser else None
    return denoiser, load_classifier_from(config, sources)


def build_smooth(config: MethodConfig, sources: ModelSources, image_shape: Tuple[int, ...],
                 num_classes: Optional[int] = None, *, backend: str = "torch", device: str = "cpu",
                 precision: str = "fp32", seed: int = 0, onnx_dir: Optional[str] = None,
                 fast: Optional[FastPath] = None, models=None, log=None, batch: int = 1000) -> Smooth:
    """A Smooth for `config` on the requested backend; probes the models with `image_shape`.

    `fast` (torch backend) picks compiled static-shape stages, CUDA graphs and two streams; by
    default FastPath.resolve(device). `models` = (denoiser, classifier) already loaded.
    """
    if fast is None:
        fast = FastPath.resolve(device) if backend == "torch" else FastPath()
        if backend == "tensorrt" and torch_device_type(device) == "cuda":
            fast = FastPath(static_batch=True, streams=2)       # plans are built for the run's batch
    if backend == "torch":
        from diffsmooth.engine.backends.torch_backend import TorchBackend
        runner = TorchBackend(device=device, precision=precision, compile=fast.compile,
                              cuda_graphs=fast.cuda_graphs, log=log)
        denoiser, classifier = models or load_models(config, sources)
        stages = build_torch_stages(config, classifier, denoiser, runner, image_shape, num_classes,
                                    fused_attention=fast.fused_attention, fused_conv=fast.fused_conv, log=log,
                                    classifier_batch=classifier_call_images(config, batch, image_shape,
                                                                            runner.device))
    elif backend == "onnxruntime":
        from diffsmooth.engine.base_classifier.onnx_stages import build_onnx_stages
        if not onnx_dir:
            raise UserError("`backend` onnxruntime needs `onnx_dir` (made by `diffsmooth export`)")
        stages = build_onnx_stages(onnx_dir, config, image_shape, num_classes, device=device, precision=precision)
    elif backend == "tensorrt":
        from diffsmooth.engine.base_classifier.tensorrt_stages import build_trt_stages
        if not onnx_dir:
            raise UserError("`backend` tensorrt needs `onnx_dir` (graphs from `diffsmooth export`, plans from "
                            "`diffsmooth build-engine`)")
        stages = build_trt_stages(onnx_dir, config, image_shape, num_classes, device=device, precision=precision,
                                  batch=batch)
    else:
        raise UserError(f"unknown backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    return Smooth(MonteCarloPipeline(stages, config.sigma, seed, static_batch=fast.static_batch,
                                     streams=fast.streams, compiled_noise=fast.compiled_noise, log=log))


def classifier_call_images(config: MethodConfig, batch: int, image_shape: Tuple[int, ...], device) -> int:
    """Images per classifier call in a run at `batch`: the pipeline's first chunk of the batch, times m
    for local smoothing (the shape the fused-convolution probe must see)."""
    import torch

    from diffsmooth.engine.certify.monte_carlo import initial_score_chunks
    per_sample = config.m if config.method == "diffsmooth" else 1
    numel = 1
    for d in image_shape:
        numel *= int(d)
    pieces = initial_score_chunks(int(batch), per_sample, numel, torch.device(device))
    return (int(batch) // pieces) * per_sample


def torch_device_type(device: str) -> str:
    import torch
    return torch.device(device).type


def build_checked_smooth(config: MethodConfig, sources: ModelSources, image_shape: Tuple[int, ...],
                         num_classes: Optional[int], first_image, first_index: int, batch: int, *,
                         backend: str = "torch", device: str = "cpu", precision: str = "fp32", seed: int = 0,
                         onnx_dir: Optional[str] = None, fast: Optional[FastPath] = None,
                         validate_samples: int = VALIDATE_SAMPLES, expected_flip_rate: float = FP16_FLIP_RATE,
                         check_images=None, log=None) -> Smooth:
    """build_smooth, then (torch backend, compiled or reduced precision) the once-per-run check of
    its production counts against eager fp32 on `check_images` ((index, image) pairs; default the
    first image), `validate_samples` samples each, printed; refuses a path that disagrees."""
    log = log or _stderr
    models = load_models(config, sources) if backend == "torch" else None
    if backend == "torch" and fast is None:
        fast = FastPath.resolve(device)
    smooth = build_smooth(config, sources, image_shape, num_classes, backend=backend, device=device,
                          precision=precision, seed=seed, onnx_dir=onnx_dir, fast=fast, models=models, log=log,
                          batch=batch)
    if backend == "torch" and (fast.changes_arithmetic or precision != "fp32") and validate_samples > 0:
        reference = build_smooth(config, sources, image_shape, num_classes, device=device, precision="fp32",
                                 seed=seed, fast=FastPath(), models=models, log=log)
        images = list(check_images) if check_images else [(first_index, first_image)]
        validate_fast_path(smooth.pipeline, reference.pipeline, images, validate_samples, batch,
                           expected_flip_rate, log)
    return smooth


def _stderr(message: str) -> None:
    import sys
    print(message, file=sys.stderr)

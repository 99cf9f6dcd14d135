"""The backend contract (after Polygraphy's runners): a backend turns models or exported graphs
into Stages; a Stage maps fp32 device tensors to one fp32 device tensor. The pipeline only ever
calls stages, so it never asks which backend (torch, ONNX Runtime, TensorRT) it holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol, Tuple

import torch

from diffsmooth.engine.hashing import sha256_file
from diffsmooth.engine.stages.weights import Marks, mark_module, value_fingerprint


class Stage(Protocol):
    """One compiled graph: `stage(*inputs) -> output`, inputs/outputs fp32 on `stage.device`."""

    name: str
    device: torch.device
    precision: str

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor: ...


@dataclass
class BaseClassifierStages:
    """The base classifier f as stages: purify (the denoiser; None when nothing is denoised), then score.

    `score` takes the batch's `inputs` in order ("noisy": x + sigma * eps, "denoised": purify of it)
    and, when `local_noise_shape` is set (fresh local noise), noise [B, *local_noise_shape]. It returns
    scores [B, num_classes] whose argmax is the vote, or [B, E, num_classes] when it scores the E
    configurations named in `configs` on the same samples (a sweep).

    `purify_noise`: purify takes a second argument, the rows' own noises (certify/noise.py's RowNoise: a
    reverse chain draws its steps' noise from it); `purified_shape`: one sample's purified shape when it is
    not the image's (a method that purifies each sample several times, [R, C, H, W]); `score_tolerance`: how
    far the fast path's scores may lie from eager fp32's, relative (the method's, when its scores are not
    probabilities or logits).
    """

    method: str
    purify: Optional[Stage]
    score: Stage
    num_classes: int
    local_noise_shape: Optional[Tuple[int, ...]] = None
    configs: Tuple[str, ...] = ()
    inputs: Tuple[str, ...] = ()
    purify_noise: bool = False
    purified_shape: Optional[Tuple[int, ...]] = None
    score_tolerance: Optional[float] = None     # the agreement check's score tolerance (None: its default)

    def __post_init__(self):
        if not self.inputs:
            self.inputs = ("denoised",) if self.purify is not None else ("noisy",)
        if "denoised" in self.inputs and self.purify is None:
            raise ValueError("a score stage that reads denoised samples needs a purify stage")

    @property
    def num_configs(self) -> int:
        return max(1, len(self.configs))

    @property
    def device(self) -> torch.device:
        return self.score.device

    def weight_marks(self) -> Marks:
        """The marks (stages/weights.py) of every torch stage's weights; exported graphs and engine files hold
        theirs inside the engine and show none."""
        marks: Marks = {}
        for stage in (self.purify, self.score):
            module = getattr(stage, "weights", None)
            if module is not None:
                marks.update(mark_module(module, f"{stage.name}: "))
        return marks

    def weight_fingerprint(self) -> str:
        """What every stage computes with, equal wherever the weights are: a torch stage's tensor values, an
        exported graph's or engine file's digest (what torchrun's ranks compare: certify/agreement.py)."""
        parts = []
        for stage in (self.purify, self.score):
            if stage is None:
                continue
            module, path = getattr(stage, "weights", None), getattr(stage, "path", None)
            held = value_fingerprint(module) if module is not None else sha256_file(path) if path is not None else ""
            parts.append(f"{stage.name}[{held}]")
        return " -> ".join(parts)

    def describe(self) -> str:
        parts = [s.name for s in (self.purify, self.score) if s is not None]
        return f"{self.method}: " + " -> ".join(parts) + f" [{self.score.precision}, {self.device}]"

    def describe_config(self, config: int) -> str:
        return f"configuration {self.configs[config]}" if self.configs else self.describe()


class StageBackend(Protocol):
    """A backend as a run sees it: builds the stages of one method config, or of a sweep's configurations on the
    same samples, from the run's model sources and how it builds, and decides its fast path's defaults
    (engine/backends/ has the three, torch, onnxruntime and tensorrt, one folder each, and in registry.py the
    one place that picks one by name)."""

    name: str
    runs_modules: bool          # builds from torch modules (its fast path is checked against eager fp32 per run)
    accepts_torch_options: bool     # reads the torch fast path's options (compile modes, kernels, rewrites)

    def fast_path_defaults(self, cuda: bool, compile: Optional[bool], asked: dict) -> dict: ...

    def stages(self, config, sources, image_shape: Tuple[int, ...], num_classes: Optional[int],
               build) -> "BaseClassifierStages": ...

    def sweep_stages(self, configs, classifier_paths, sources, image_shape: Tuple[int, ...],
                     num_classes: Optional[int], build) -> "BaseClassifierStages": ...

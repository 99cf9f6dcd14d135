"""The backend contract (after Polygraphy's runners): a backend turns models or exported graphs
into Stages; a Stage maps fp32 device tensors to one fp32 device tensor. The pipeline only ever
calls stages, so it never asks which backend (torch, ONNX Runtime, TensorRT) it holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol, Tuple

import torch


class Stage(Protocol):
    """One compiled graph: `stage(*inputs) -> output`, inputs/outputs fp32 on `stage.device`."""

    name: str
    device: torch.device
    precision: str

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor: ...


@dataclass
class BaseClassifierStages:
    """The base classifier f of one method, as stages: purify (None for RS) then score.

    `score` returns [B, num_classes] scores whose argmax is the vote. When
    `local_noise_shape` is set (fresh local noise) the pipeline passes noise of shape
    [B, *local_noise_shape] as score's second input.
    """

    method: str
    purify: Optional[Stage]
    score: Stage
    num_classes: int
    local_noise_shape: Optional[Tuple[int, ...]] = None

    @property
    def device(self) -> torch.device:
        return self.score.device

    def describe(self) -> str:
        parts = [s.name for s in (self.purify, self.score) if s is not None]
        return f"{self.method}: " + " -> ".join(parts) + f" [{self.score.precision}, {self.device}]"

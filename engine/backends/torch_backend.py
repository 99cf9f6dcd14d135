"""Torch backend: stages are nn.Modules run under inference_mode, on CPU or CUDA, in fp32 or
autocast fp16/bf16 (GroupNorm statistics and softmax stay fp32 inside the models)."""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from diffsmooth.engine.errors import UserError

PRECISIONS = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}


def resolve_device(device: str) -> torch.device:
    """torch.device from a user string; a CUDA device that is not there is a UserError."""
    try:
        dev = torch.device(device)
    except RuntimeError as exc:
        raise UserError(f"unknown device {device!r}: use cpu, cuda or cuda:N") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"device {device!r} requested but CUDA is not available on this machine")
    return dev


class TorchStage:
    """A module as a Stage: fp32 tensors in, fp32 tensor out."""

    def __init__(self, module: nn.Module, name: str, device: torch.device, precision: str = "fp32",
                 channels_last: bool = False, compile: bool = False):
        if precision not in PRECISIONS:
            raise UserError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
        if precision != "fp32" and device.type != "cuda":
            raise UserError(f"precision {precision} is for CUDA devices; use fp32 on {device.type}")
        self.name, self.device, self.precision = name, device, precision
        module = module.eval().to(device)
        if channels_last:
            module = module.to(memory_format=torch.channels_last)
        self.module = torch.compile(module) if compile else module

    def _autocast(self):
        dtype = PRECISIONS[self.precision]
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=dtype)

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode(), self._autocast():
            return self.module(*inputs).float()


class TorchBackend:
    """Builds TorchStages on one device and precision."""

    name = "torch"

    def __init__(self, device: str = "cpu", precision: str = "fp32", channels_last: bool = False,
                 compile: bool = False):
        self.device = resolve_device(device)
        self.precision = precision
        self.channels_last = channels_last
        self.compile = compile

    def stage(self, module: nn.Module, name: str) -> TorchStage:
        return TorchStage(module, name, self.device, self.precision, self.channels_last, self.compile)

"""A module's per-sigma constants as buffers: a compiled graph or CUDA graph reads them at run time,
so `set_coefficients` moves a built purifier to another sigma in place (engine/runs/model_set.py)."""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import nn


class BufferedModule(nn.Module):
    """x_rs -> x_hat around `unet`; its constants, named in `buffers` (default BUFFERS), are fp32 buffers that
    forward reads."""

    BUFFERS: Tuple[str, ...] = ()

    def __init__(self, unet: nn.Module, coefficients, channels: int, buffers: Optional[Tuple[str, ...]] = None):
        super().__init__()
        self.unet = unet
        self.channels = channels
        self.buffer_names = tuple(self.BUFFERS if buffers is None else buffers)
        for name in self.buffer_names:
            self.register_buffer(name, torch.zeros((), dtype=torch.float32), persistent=False)
        self.set_coefficients(coefficients)

    def set_coefficients(self, coefficients) -> None:
        """Write another sigma's constants into the buffers (same tensors, new values)."""
        with torch.inference_mode():
            for name in self.buffer_names:
                getattr(self, name).fill_(float(getattr(coefficients, name)))

"""The torch modules of the heads (engine/base_classifier/methods/*_head.py): local smoothing over m noises, or
plain logits.

DiffSmooth: p = mean_i softmax(classifier(x_hat + sigma' * delta_i)), vote = argmax p. The
delta_i are `fixed` (drawn once, shared by every sample, as the reference does) or `fresh`
(new per sample, the paper's Algorithm 3, passed in by the pipeline). RS and DDS vote with
argmax of the plain logits (Cohen et al.; Carlini et al.).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from diffsmooth.engine.choices import LOCAL_NOISE_MODES


class LocalSmoothingModule(nn.Module):
    """x_hat [B,C,H,W] (+ fresh noise [B,m,C,H,W]) -> mean softmax over the m local noises [B,K];
    sigma' is a buffer (a compiled head stays valid when another sigma' is copied in)."""

    def __init__(self, classifier: nn.Module, m: int, local_sigma: float, mode: str = "fixed",
                 fixed_noise: Optional[torch.Tensor] = None):
        super().__init__()
        if mode not in LOCAL_NOISE_MODES:
            raise ValueError(f"local noise mode must be one of {LOCAL_NOISE_MODES}, got {mode!r}")
        if mode == "fixed" and (fixed_noise is None or fixed_noise.shape[0] != m):
            raise ValueError("fixed local noise needs a tensor of shape [m, C, H, W]")
        self.classifier = classifier
        self.m = int(m)
        self.mode = mode
        # a buffer, not a float baked into a compiled graph: a built head moves to another sigma' in place
        self.register_buffer("local_sigma", torch.tensor(float(local_sigma), dtype=torch.float32), persistent=False)
        self.register_buffer("fixed_noise", fixed_noise if mode == "fixed" else None, persistent=False)

    @property
    def takes_noise(self) -> bool:
        """True when the caller must pass the local noise (fresh mode)."""
        return self.mode == "fresh"

    def forward(self, x_hat: torch.Tensor, noise: Optional[torch.Tensor] = None) -> torch.Tensor:
        delta = self.fixed_noise.unsqueeze(0) if self.mode == "fixed" else noise
        return local_probabilities(self.classifier, x_hat, delta, self.local_sigma).mean(dim=1)


def local_probabilities(classifier: nn.Module, x_hat: torch.Tensor, delta: torch.Tensor,
                        local_sigma) -> torch.Tensor:
    """softmax(classifier(x_hat + sigma' * delta_i)) for every local noise i, in ONE classifier
    call over B*m images: x_hat [B,C,H,W], delta [1 or B, m, C,H,W] -> probabilities [B,m,K]."""
    b, m = x_hat.shape[0], delta.shape[1]
    y = (x_hat.unsqueeze(1) + local_sigma * delta.to(x_hat.dtype)).reshape(b * m, *x_hat.shape[1:])
    logits = classifier(y).float()
    return torch.softmax(logits, dim=-1).view(b, m, -1)


class LogitsModule(nn.Module):
    """The plain classifier (RS, DDS): images -> fp32 logits; the vote is their argmax."""

    takes_noise = False

    def __init__(self, classifier: nn.Module):
        super().__init__()
        self.classifier = classifier

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(x).float()

"""One-shot denoising (DDS, DiffSmooth): x_t = sqrt(abar_t*) (2 x_rs - 1) at the t* of sigma, one UNet call, the
clipped x0 mapped back to [0, 1] (engine/base_classifier/one_step.py)."""

from __future__ import annotations

import torch

from diffsmooth.engine.base_classifier.methods.purifier import Purifier
from diffsmooth.engine.base_classifier.purifier_graph import one_shot_graph


class OneShotPurifier(Purifier):
    """One denoised sample per noisy sample; or, in a subclass that declares a setting K (`copies_option`), that
    sample K times: a one-shot denoising is deterministic, so K of them are K copies of one UNet call (a head voting
    over K samples, a majority, sees K equal ones)."""

    denoises = True

    def stage(self, sigma, denoiser, backend, fast=None):
        """The one-shot purifier at sigma; `fast` picks fused attention and the lean (eps-only) UNet."""
        purifier = denoiser.purifier(sigma, bool(getattr(fast, "fused_attention", False)),
                                     lean=bool(getattr(fast, "lean_unet", False)))
        return self._repeated(backend.stage(purifier, "denoiser"))

    def graph(self, sigma, denoiser, image_shape, method):
        return one_shot_graph(denoiser, sigma, image_shape)

    def lookup(self, sigma, method):
        return {"sigma": float(sigma)}

    def exported_stage(self, sigma, graph, manifest):
        return self._repeated(graph)            # exported whole

    def key(self, sigma):
        return ("one-shot", float(sigma)) if self.copies == 1 else ("one-shot", float(sigma), self.copies)

    def serving(self, purifiers):
        return 0

    def share(self, samples):
        return samples

    def unet_calls(self):
        return 1

    def noise_left(self, sigma):
        return 0.0

    def tag(self):
        return f"__K{self.copies}" if self.copies_option is not None else ""

    def _repeated(self, stage):
        """The stage itself, or its output K times ([B,K,C,H,W]) with a setting K."""
        return stage if self.copies_option is None else Repeated(stage, self.copies)


class Repeated:
    """A purify stage's output [B,C,H,W] as K equal samples [B,K,C,H,W] (the stage runs once)."""

    def __init__(self, stage, runs: int):
        self.stage, self.runs = stage, int(runs)
        self.name = f"{stage.name} (x{runs})"
        self.device, self.precision = stage.device, stage.precision
        self.weights = getattr(stage, "weights", None)
        eager = getattr(stage, "eager", stage)
        self.eager = self if eager is stage else Repeated(eager, runs)

    def __call__(self, x_rs: torch.Tensor) -> torch.Tensor:
        x = self.stage(x_rs)
        return x.unsqueeze(1).expand(x.shape[0], self.runs, *x.shape[1:])

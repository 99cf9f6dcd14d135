"""One-shot denoising (DDS, DiffSmooth): x_t = sqrt(abar_t*) (2 x_rs - 1) at the t* of sigma, one UNet call, the
clipped x0 mapped back to [0, 1] (engine/base_classifier/one_step.py)."""

from __future__ import annotations

from typing import Optional

import torch

from diffsmooth.engine.base_classifier.methods.config import MethodOption
from diffsmooth.engine.base_classifier.methods.purifier import Purifier
from diffsmooth.engine.base_classifier.purifier_graph import one_shot_graph


class OneShotDenoising(Purifier):
    """One denoised sample per noisy sample; or, built with `runs` (a setting K), that sample K times: a
    one-shot denoising is deterministic, so K of them are K copies of one UNet call (a head voting over K
    samples, a majority, sees K equal ones)."""

    denoises = True

    def __init__(self, runs: Optional[MethodOption] = None):
        self.runs_option = runs
        self.options = (runs,) if runs is not None else ()

    def stage(self, config, denoiser, backend, fast=None):
        """The one-shot purifier at sigma; `fast` picks fused attention and the lean (eps-only) UNet."""
        purifier = denoiser.purifier(config.sigma, bool(getattr(fast, "fused_attention", False)),
                                     lean=bool(getattr(fast, "lean_unet", False)))
        return self._repeated(config, backend.stage(purifier, "denoiser"))

    def graph(self, config, denoiser, image_shape):
        return one_shot_graph(denoiser, config.sigma, image_shape)

    def lookup(self, config):
        return {"sigma": float(config.sigma)}

    def exported_stage(self, config, graph, manifest):
        return self._repeated(config, graph)            # exported whole

    def key(self, config):
        runs = self.runs(config)
        return ("one-shot", float(config.sigma)) if runs == 1 else ("one-shot", float(config.sigma), runs)

    def sweep_config(self, configs):
        return configs[0]

    def sweep_samples(self, config, samples):
        return samples

    def runs(self, config):
        return int(config.option(self.runs_option.name)) if self.runs_option is not None else 1

    def unet_calls(self, config):
        return 1

    def noise_left(self, config):
        return 0.0

    def tag(self, config):
        return f"__K{self.runs(config)}" if self.runs_option is not None else ""

    def _repeated(self, config, stage):
        """The stage itself, or its output K times ([B,K,C,H,W]) when built with `runs`."""
        return stage if self.runs_option is None else Repeated(stage, self.runs(config))


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

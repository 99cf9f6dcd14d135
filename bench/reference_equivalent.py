"""A baseline with the reference implementation's structure, to measure the engine's speed-up
on the same machine and models: fp32 eager, batch 50, randn_like noise, schedule tables moved
to the device on every call, m classifier calls in a Python loop (each with its own softmax and
accumulation), a host copy per batch and vote counting in a Python loop. Written for this
harness; it reproduces the shape of the reference's work, not its code.

cuDNN autotuning as in the official code: its architectures.py turns `cudnn.benchmark` on for the
ImageNet classifiers (ResNet-50, BEiT) and leaves it off for the CIFAR-10 ResNets. The flag is
process-wide and the engine's fast path turns it on, so the baseline sets its own value around
each of its calls and restores the engine's afterwards.
"""

from __future__ import annotations

import contextlib
import copy
import math
from typing import Optional

import numpy as np
import torch

from diffsmooth.engine.base_classifier.methods import method_named
from diffsmooth.engine.base_classifier.schedule import DiffusionSchedule

REFERENCE_BATCH = 50


class ReferenceEquivalent:
    """Counts votes for rs / dds / diffsmooth the way the reference scripts structure the work."""

    def __init__(self, method: str, classifier: torch.nn.Module, num_classes: int, sigma: float,
                 denoiser=None, m: int = 5, local_sigma: float = 0.25, local_noise_seed: int = 42,
                 device="cpu", cudnn_benchmark: bool = False):
        self.method = method
        self.cudnn_benchmark = bool(cudnn_benchmark)
        self.device = torch.device(device)
        self.classifier = classifier.eval().to(self.device)
        self.num_classes = int(num_classes)
        self.sigma = float(sigma)
        kind = method_named(method)
        self.local_smoothing = kind.head.noise_option == "local_sigma"     # the reference's local smoothing
        self.m = int(m) if self.local_smoothing else 1
        self.local_sigma = float(local_sigma) if self.local_smoothing else 0.0
        self.unet = None
        self.one_step = None                # a diffusers folder's coefficients (Python floats), else tables
        if kind.purifier.denoises:
            if denoiser is None:
                raise ValueError(f"method {method} needs a denoiser")
            self.unet = denoiser.unet.eval().to(self.device)
            self.channels = denoiser.channels
            schedule = denoiser.schedule
            if isinstance(schedule, DiffusionSchedule):
                # Host-side numpy tables, as a diffusion object keeps them (float64).
                abar = schedule.alphas_cumprod
                self.sqrt_abar = np.sqrt(abar)
                self.sqrt_recip_abar = np.sqrt(1.0 / abar)
                self.sqrt_recipm1_abar = np.sqrt(1.0 / abar - 1.0)
                self.t_star = schedule.timestep(self.sigma)
                self.rescale = 1000.0 / schedule.num_steps if schedule.rescale_timesteps else None
            else:
                self.one_step = schedule.coefficients(self.sigma)
        if self.local_smoothing:
            self._local_seed_gen = torch.Generator(device="cpu").manual_seed(local_noise_seed)
        self.local_noises = None            # drawn once on the CPU at first use, shape (m, C, H, W)

    @staticmethod
    def _extract(table: np.ndarray, t: torch.Tensor, ndim: int) -> torch.Tensor:
        """Table lookup the reference way: numpy -> torch -> device on every call, then index."""
        out = torch.from_numpy(table).to(device=t.device)[t].float()
        return out.reshape(-1, *([1] * (ndim - 1)))

    def _denoise_one_step(self, x_rs: torch.Tensor) -> torch.Tensor:
        """A diffusers denoiser the way its scheduler is called: Python-float coefficients, the timestep
        as a fresh [B] tensor, the model output sliced, clamped."""
        c = self.one_step
        x_t = c.input_scale * (2.0 * x_rs - 1.0)
        t = torch.full((x_rs.shape[0],), c.model_timestep, dtype=torch.float32, device=x_rs.device)
        out = self.unet(c.c_in * x_t, t)[:, : self.channels]
        return ((c.c_skip * x_t + c.c_out * out).clamp(-1.0, 1.0) + 1.0) / 2.0

    def _denoise(self, x_rs: torch.Tensor) -> torch.Tensor:
        if self.one_step is not None:
            return self._denoise_one_step(x_rs)
        t = torch.full((x_rs.shape[0],), self.t_star, dtype=torch.long, device=x_rs.device)
        x_start = 2.0 * x_rs - 1.0
        x_t = self._extract(self.sqrt_abar, t, x_rs.dim()) * x_start
        model_t = t.float() * self.rescale if self.rescale is not None else t
        out = self.unet(x_t, model_t)
        eps = out[:, : self.channels]
        x0 = (self._extract(self.sqrt_recip_abar, t, x_t.dim()) * x_t
              - self._extract(self.sqrt_recipm1_abar, t, x_t.dim()) * eps).clamp(-1.0, 1.0)
        return (x0 + 1.0) / 2.0

    def _classify(self, x: torch.Tensor) -> torch.Tensor:
        if not self.local_smoothing:
            return self.classifier(x)
        if self.local_noises is None:
            self.local_noises = torch.randn((self.m, *x.shape[1:]), generator=self._local_seed_gen).to(x.device)
        probs = None
        for i in range(self.m):
            logits = self.classifier(x + self.local_sigma * self.local_noises[i])
            p = torch.softmax(logits, dim=1)
            probs = p if probs is None else probs + p
        return probs / self.m

    @staticmethod
    def _count_arr(predictions: np.ndarray, length: int) -> np.ndarray:
        counts = np.zeros(length, dtype=int)
        for idx in predictions:
            counts[idx] += 1
        return counts

    def count(self, x: torch.Tensor, num: int, batch: int = REFERENCE_BATCH) -> np.ndarray:
        """Vote counts over `num` noisy copies of x (torch.randn_like noise, no fixed seed)."""
        x = x.to(self.device)
        counts = np.zeros(self.num_classes, dtype=int)
        with torch.no_grad(), cudnn_benchmark(self.cudnn_benchmark):
            remaining = num
            for _ in range(int(math.ceil(num / batch))):
                this_batch = min(batch, remaining)
                remaining -= this_batch
                xs = x.repeat((this_batch, 1, 1, 1))
                noisy = xs + torch.randn_like(xs) * self.sigma
                h = self._denoise(noisy) if self.unet is not None else noisy
                predictions = self._classify(h).argmax(1)
                counts += self._count_arr(predictions.cpu().numpy(), self.num_classes)
        return counts


@contextlib.contextmanager
def cudnn_benchmark(enabled: bool):
    """torch.backends.cudnn.benchmark = enabled inside the block, the previous value after it."""
    previous = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = enabled
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = previous


OFFICIAL_CUDNN_BENCHMARK_ARCHS = ("resnet50", "beit_large_patch16_224")


def official_cudnn_benchmark(arch: str) -> bool:
    """The official code's cudnn.benchmark for a classifier architecture: on for its ImageNet
    classifiers, off for the CIFAR-10 ResNets."""
    return arch in OFFICIAL_CUDNN_BENCHMARK_ARCHS


def build_reference(method: str, model_set, sigma: float, m: int, local_sigma: float,
                    device="cpu", seed: Optional[int] = 0, cudnn_benchmark: bool = False) -> ReferenceEquivalent:
    """The baseline on copies of the engine run's torch modules (same weights; copies so the
    engine's channels_last conversion does not change the baseline's memory layout)."""
    if seed is not None:
        torch.manual_seed(seed)
    return ReferenceEquivalent(method, copy.deepcopy(model_set.classifier), model_set.num_classes, sigma,
                               copy.deepcopy(model_set.denoiser) if model_set.denoiser is not None else None,
                               m, local_sigma, device=device, cudnn_benchmark=cudnn_benchmark)

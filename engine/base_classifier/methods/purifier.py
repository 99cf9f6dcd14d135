"""What a purifier is to the engine: the stage that turns the noisy sample x_rs into what the classifier scores
(nothing, one-shot denoising, reverse chains), with its own settings, exported graph and sweep key. One class per
file beside this one; a method pairs one with a head (base.py)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar, Optional, Tuple

from diffsmooth.engine.base_classifier.methods.config import MethodConfig, MethodOption


class Purifier(ABC):
    """x_rs [B,C,H,W] -> the samples the head scores. `denoises`: it runs the UNet (the classifier scores its
    output, the "denoised" samples; else the "noisy" ones); `draws_noise`: its stage takes the rows' own keyed
    noise (certify/noise.py's RowNoise) as a second argument."""

    options: ClassVar[Tuple[MethodOption, ...]] = ()
    runs_option: ClassVar[Optional[MethodOption]] = None    # the setting K of how many samples it hands the head
    denoises: ClassVar[bool]
    draws_noise: ClassVar[bool] = False

    @property
    def reads(self) -> str:
        """Which samples the head scores: "denoised" (this purifier's output) or "noisy" (x + sigma * eps)."""
        return "denoised" if self.denoises else "noisy"

    @abstractmethod
    def stage(self, config: MethodConfig, denoiser, backend, fast=None):
        """The purify stage on `backend` (a TorchBackend); `fast` (a FastPath or None) says which UNet kernels."""

    @abstractmethod
    def graph(self, config: MethodConfig, denoiser, image_shape: Tuple[int, ...]):
        """What `diffsmooth export` writes for the purify stage (a PurifierGraph)."""

    @abstractmethod
    def lookup(self, config: MethodConfig) -> dict:
        """The manifest fields (beside image shape and precision) of the exported purifier graph a run needs."""

    @abstractmethod
    def exported_stage(self, config: MethodConfig, graph, manifest: dict):
        """The purify stage around its exported graph, loaded as `graph` (an ONNX Runtime or TensorRT stage)."""

    @abstractmethod
    def key(self, config: MethodConfig):
        """What its stage computes, as a key: a sweep's configurations share one purify stage, so one key (None:
        it purifies nothing)."""

    @abstractmethod
    def sweep_config(self, configs) -> MethodConfig:
        """Of a sweep's configurations (one key), the one whose purify stage serves them all."""

    @abstractmethod
    def sweep_samples(self, config: MethodConfig, samples):
        """A configuration's share of the serving stage's samples."""

    @abstractmethod
    def runs(self, config: MethodConfig) -> int:
        """Purified samples per noisy sample (1 without `runs_option`: one sample of the image's shape; else K:
        [K, C, H, W])."""

    @abstractmethod
    def unet_calls(self, config: MethodConfig) -> int:
        """UNet calls per Monte Carlo sample (what purifying one costs)."""

    @abstractmethod
    def noise_left(self, config: MethodConfig) -> float:
        """The Gaussian noise std left in its output (the noise a classifier behind it was trained at)."""

    @abstractmethod
    def tag(self, config: MethodConfig) -> str:
        """What a sweep configuration's file name gets from its settings."""

    def purified_shape(self, config: MethodConfig, image_shape) -> Optional[Tuple[int, ...]]:
        """One noisy sample's purified samples' shape when not the image's (None: the image's): [K, C, H, W] for a
        purifier with the setting K (even at K = 1)."""
        return None if self.runs_option is None else (self.runs(config), *map(int, image_shape))

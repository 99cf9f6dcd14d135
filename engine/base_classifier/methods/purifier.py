"""What a purifier is to the engine: the stage that turns the noisy sample x_rs into what the classifier scores
(nothing, one-shot denoising, reverse chains), configured by its constructor (part.py), with its exported graph and
sweep key. One class per file beside this one; a method pairs one with a head (base.py). The smoothing sigma is the
method's, not the purifier's: the methods that depend on it take it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar, Optional, Sequence, Tuple

from diffsmooth.engine.base_classifier.methods.part import Part


class Purifier(Part, ABC):
    """x_rs [B,C,H,W] -> the samples the head scores. `purifies`: it has a purify stage (the classifier scores its
    output, the "denoised" samples; else the "noisy" ones); `denoises`: its stage reads the diffusion denoiser (its
    run loads the UNet; a purifier without one needs no denoiser file); `draws_noise`: its stage takes the rows' own
    keyed noise (certify/noise.py's RowNoise) as a second argument; `copies_option`: the name of its setting K of
    how many samples per noisy sample it hands the head (None: one sample of the image's shape)."""

    copies_option: ClassVar[Optional[str]] = None
    purifies: ClassVar[bool] = True
    denoises: ClassVar[bool]
    draws_noise: ClassVar[bool] = False

    @property
    def reads(self) -> str:
        """Which samples the head scores: "denoised" (this purifier's output) or "noisy" (x + sigma * eps)."""
        return "denoised" if self.purifies else "noisy"

    @property
    def copies(self) -> int:
        """Purified samples per noisy sample: K (its setting `copies_option`), else 1."""
        return int(self.settings[self.copies_option]) if self.copies_option else 1

    @abstractmethod
    def stage(self, sigma: float, denoiser, backend, fast=None):
        """The purify stage at `sigma` on `backend` (a TorchRunner); `denoiser` is None for a purifier that does not
        read it (`denoises` False); `fast` (a FastPath or None) says which UNet kernels."""

    @abstractmethod
    def graph(self, sigma: float, denoiser, image_shape: Tuple[int, ...], method: str):
        """What `diffsmooth export` writes for the purify stage of `method` at `sigma` (a PurifierGraph)."""

    @abstractmethod
    def lookup(self, sigma: float, method: str) -> dict:
        """The manifest fields (beside image shape and precision) of the exported purifier graph a run needs."""

    @abstractmethod
    def exported_stage(self, sigma: float, graph, manifest: dict):
        """The purify stage around its exported graph, loaded as `graph` (an ONNX Runtime or TensorRT stage)."""

    @abstractmethod
    def key(self, sigma: float):
        """What its stage computes, as a key: a sweep's configurations share one purify stage, so one key (None:
        it purifies nothing)."""

    @abstractmethod
    def serving(self, purifiers: Sequence["Purifier"]) -> int:
        """Of a sweep's purifiers (one key), the index of the one whose stage serves them all."""

    @abstractmethod
    def share(self, samples):
        """Its share of the serving stage's samples."""

    @abstractmethod
    def unet_calls(self) -> int:
        """UNet calls per Monte Carlo sample (what purifying one costs)."""

    @abstractmethod
    def noise_left(self, sigma: float) -> float:
        """The Gaussian noise std left in its output (the noise a classifier behind it was trained at)."""

    @abstractmethod
    def tag(self) -> str:
        """What a sweep configuration's file name gets from its settings."""

    def purified_shape(self, image_shape) -> Optional[Tuple[int, ...]]:
        """One noisy sample's purified samples' shape when not the image's (None: the image's): [K, C, H, W] for a
        purifier with the setting K (even at K = 1)."""
        return None if self.copies_option is None else (self.copies, *map(int, image_shape))

"""What a base-classifier method is to the engine: one class that owns everything that differs between
methods (its settings, the stages it needs, its score head, its exported graph, its design flip rate), so
the rest of the engine asks the method instead of comparing its name (docs/extending.md)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Dict, Optional, Tuple

from torch import nn

from diffsmooth.engine.base_classifier.local_smoothing import LogitsHead
from diffsmooth.engine.base_classifier.methods.config import MethodConfig, MethodOption
from diffsmooth.engine.base_classifier.purifier_graph import PurifierGraph, one_shot_graph
from diffsmooth.engine.models import shipped


class Method:
    """A base classifier f: the noisy sample x + sigma * eps, denoised or not, scored by a classifier head whose
    argmax is the vote. This default is DDS-shaped (denoise, then the classifier's logits); a method overrides
    what it does differently. Register a subclass with `methods.register` to make it a `--method`."""

    name: ClassVar[str] = ""                    # the method's name: --method, specs, result settings
    line_name: ClassVar[str] = ""               # a table line's default name
    denoises: ClassVar[bool] = True             # the classifier reads purified samples (the UNet runs)
    local_smoothing: ClassVar[bool] = False     # reads m, sigma' and the local noises (DiffSmooth's settings)
    settings: ClassVar[Tuple[str, ...]] = ()    # the MethodConfig fields it reads beyond its name and sigma
    classifier_label: ClassVar[str] = "classifier"      # the score stage's name in logs
    scores: ClassVar[str] = "logits"            # what its score head returns (an exported graph's `scores`)
    output_name: ClassVar[str] = "logits"       # the exported classifier graph's output
    # Per-sample vote flips of a correct fp16 / bf16 path against eager fp32 that the run-time agreement check
    # expects (engine/runs/vote_agreement.py); each method's figures say where they were measured.
    flip_rates: ClassVar[Dict[str, float]] = {}
    options: ClassVar[Tuple[MethodOption, ...]] = ()    # settings of its own (`--option NAME=VALUE`, spec keys, API)
    purify_noise: ClassVar[bool] = False        # its purify stage draws noises of its own (BaseClassifierStages)
    # Its lines share a table's one pass with other lines on the same one-shot denoised samples (one_pass.py).
    sweeps: ClassVar[bool] = True
    exported: ClassVar[bool] = True             # runs from exported graphs (the onnxruntime and tensorrt backends)

    @property
    def reads(self) -> str:
        """Which samples its classifier scores: "denoised" (purify's output) or "noisy" (x + sigma * eps)."""
        return "denoised" if self.denoises else "noisy"

    def validate(self, config: MethodConfig) -> None:
        """Refuse the config's settings in one line (UserError) where this method cannot run them."""

    def purify_stage(self, config: MethodConfig, denoiser, backend, fast=None):
        """The denoiser half of f as one stage on `backend` (a TorchBackend): the one-shot purifier at sigma,
        x_rs [B,C,H,W] -> [B,C,H,W]; `fast` (a FastPath or None) says which UNet kernels (fused attention,
        the lean UNet)."""
        purifier = denoiser.purifier(config.sigma, bool(getattr(fast, "fused_attention", False)),
                                     lean=bool(getattr(fast, "lean_unet", False)))
        return backend.stage(purifier, "denoiser")

    def purifier_graph(self, config: MethodConfig, denoiser, image_shape: Tuple[int, ...]) -> PurifierGraph:
        """What `diffsmooth export` writes for the purify stage: the one-shot purifier at sigma."""
        return one_shot_graph(denoiser, config.sigma, image_shape)

    def purifier_lookup(self, config: MethodConfig) -> dict:
        """The manifest fields (beside image shape and precision) of the exported purifier graph a run needs."""
        return {"sigma": float(config.sigma)}

    def exported_purify_stage(self, config: MethodConfig, graph, manifest: dict):
        """The purify stage around its exported graph run as `graph` (an ONNX Runtime or TensorRT stage): the
        graph itself, for a purifier exported whole."""
        return graph

    def purifier_key(self, config: MethodConfig):
        """What its purify stage is, as a key: a sweep's configurations must have one key between them (None: it
        purifies nothing). The one-shot purifier at sigma, by default; a method that does not share the one-shot
        samples (`sweeps` False) and says nothing more has a purify stage of each configuration's own."""
        if not self.denoises:
            return None
        return ("one-shot", float(config.sigma)) if self.sweeps else (self.name, float(config.sigma), config.options)

    def sweep_purifier_config(self, configs) -> MethodConfig:
        """Of a sweep's configurations of this method (one purifier_key), the one whose purify stage serves all."""
        return configs[0]

    def sweep_head(self, config: MethodConfig, classifier: nn.Module, image_shape: Tuple[int, ...]) -> Optional[nn.Module]:
        """Its score head in a torch sweep, on the shared purify stage's samples; None: the classifier's logits."""
        return None

    def sweep_samples(self, config: MethodConfig, samples):
        """Its share of the shared purify stage's samples (an exported sweep feeds them to its own graph)."""
        return samples

    def purified_shape(self, config: MethodConfig, image_shape: Tuple[int, ...]) -> Optional[Tuple[int, ...]]:
        """One sample's purified shape when it is not the image's (None: the image's)."""
        return None

    def unet_calls(self, config: MethodConfig) -> int:
        """UNet calls per Monte Carlo sample (what a sample's denoising costs)."""
        return 1 if self.denoises else 0

    def score_head(self, config: MethodConfig, classifier: nn.Module, image_shape: Tuple[int, ...]) -> nn.Module:
        """The classifier half of f as one module: samples [B,C,H,W] (+ fresh noise) -> scores [B,K]."""
        return LogitsHead(classifier)

    def score_tolerance(self, config: MethodConfig) -> Optional[float]:
        """How far a fast path's scores may lie from eager fp32's (relative, runs/vote_agreement.py); None: the
        check's default, made for logits and probabilities."""
        return None

    def classifier_calls(self, config: MethodConfig) -> int:
        """Classifier images per Monte Carlo sample."""
        return 1

    def fresh_noise_shape(self, config: MethodConfig, image_shape) -> Optional[Tuple[int, ...]]:
        """The per-sample noise its score head takes besides the samples ([B, *shape]), or None."""
        return None

    def config_tag(self, config: MethodConfig) -> str:
        """What a sweep configuration's file name adds after `method__classifier` (its settings)."""
        return ""

    def graph_tag(self, config: MethodConfig) -> str:
        """What an exported classifier graph's file name adds after `classifier_METHOD_sSIGMA`."""
        return ""

    def graph_fields(self, config: MethodConfig) -> dict:
        """Its settings in an exported classifier graph's manifest (None: the setting does not apply)."""
        return {}

    def config_from_manifest(self, manifest: dict) -> MethodConfig:
        """The config a classifier graph was exported for, from its manifest (graph_fields' inverse)."""
        return MethodConfig(self.name, float(manifest["sigma"]))

    def demo_noise_level(self, sigma: float, local_sigma: float) -> float:
        """The Gaussian noise std its demo classifier was trained at (the noise its classifier sees)."""
        return 0.0

    def demo_classifier(self, sigma: float, local_sigma: float) -> Path:
        """The shipped demo classifier trained at the noise level this method's classifier sees."""
        return shipped.demo_classifier_at(self.demo_noise_level(sigma, local_sigma), self.name)

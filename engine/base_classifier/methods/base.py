"""What a base-classifier method is to the engine: a pairing of a purifier (purifier.py: how x_rs becomes what the
classifier sees) and a head (head.py: how the classifier's outputs become a vote), with its names and design flip
rates. The rest of the engine asks the method's parts instead of comparing its name (docs/extending.md)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Dict, Optional, Tuple, Type

from torch import nn

from diffsmooth.engine.base_classifier.methods.config import MethodConfig, MethodOption
from diffsmooth.engine.base_classifier.methods.head import Head
from diffsmooth.engine.base_classifier.methods.purifier import Purifier
from diffsmooth.engine.models import shipped


class Method:
    """A base classifier f: the noisy sample x + sigma * eps, purified by a `purifier`, scored by a `head`, whose
    argmax is the vote. A subclass names its two part classes (configured per run from a MethodConfig's settings:
    `config.purifier`, `config.head`); register it with `methods.register` to make it a `--method`."""

    name: ClassVar[str] = ""                    # --method, specs, result settings
    line_name: ClassVar[str] = ""               # a table line's default name
    purifier: ClassVar[Type[Purifier]]
    head: ClassVar[Type[Head]]
    # Per-sample vote flips of a correct fp16 / bf16 path against eager fp32 that the run-time agreement check
    # expects (engine/runs/vote_agreement.py); each method's figures say where they were measured.
    flip_rates: ClassVar[Dict[str, float]] = {}

    @property
    def options(self) -> Tuple[MethodOption, ...]:
        """Its settings: its purifier's options, then its head's."""
        return (*self.purifier.options, *self.head.options)

    def score_head(self, config: MethodConfig, classifier: nn.Module, image_shape: Tuple[int, ...]) -> nn.Module:
        """The classifier half of f as one module: purified samples (+ fresh noise) -> scores [B,K]."""
        return config.head.module(classifier, image_shape, config.purifier.copies)

    def classifier_calls(self, config: MethodConfig) -> int:
        """Classifier images per Monte Carlo sample."""
        return config.head.classifier_calls(config.purifier.copies)

    def score_tolerance(self, config: MethodConfig) -> Optional[float]:
        return config.head.score_tolerance(config.purifier.copies)

    def config_tag(self, config: MethodConfig) -> str:
        """What a sweep configuration's file name adds after `method__classifier`."""
        return config.purifier.tag() + config.head.tag()

    def graph_tag(self, config: MethodConfig) -> str:
        """What an exported classifier graph's file name adds after `classifier_METHOD_sSIGMA`: the number of
        purified samples it reads (K, where its purifier has that setting) and its head's settings."""
        copies = config.purifier.copies_option
        return (f"_K{config.purifier.copies}" if copies is not None else "") + config.head.graph_tag()

    def graph_fields(self, config: MethodConfig) -> dict:
        """Its settings in an exported classifier graph's manifest: the purifier options that shape the graph's
        input (K), its head's settings."""
        copies = config.purifier.copies_option
        return {**({copies: config.purifier.copies} if copies is not None else {}), **config.head.graph_fields()}

    def config_from_manifest(self, manifest: dict) -> MethodConfig:
        """The config a classifier graph was exported for, from its manifest: each setting from the recorded
        method config, else the manifest's field of its name, else its default."""
        recorded = dict(manifest.get("method_config") or {})
        given = {o.name: recorded.get(o.name, manifest.get(o.name)) for o in self.options}
        return MethodConfig(self.name, float(manifest["sigma"]),
                            options={k: v for k, v in given.items() if v is not None})

    def demo_classifier(self, config: MethodConfig) -> Path:
        """The shipped demo classifier trained at the noise level this method's classifier sees."""
        noise = config.head.noise_seen(config.purifier.noise_left(config.sigma))
        return shipped.demo_classifier_at(noise, self.name)

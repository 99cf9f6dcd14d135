"""What a head is to the engine: how the classifier's outputs over one sample's purified samples become its scores
[B, classes], whose argmax is the vote (logits, local smoothing's mean softmax, a majority vote), with its own
settings (its constructor's, part.py), exported classifier graph and sweep sharing. One class per file beside this
one; a method pairs one with a purifier (base.py)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar, Optional, Sequence, Tuple

from torch import nn

from diffsmooth.engine.base_classifier.methods.part import Part


class Head(Part, ABC):
    """The classifier half of the base classifier, configured by its constructor (part.py). `label`: the score
    stage's name in logs; `scores`: what its scores are; `output_name`: the exported classifier graph's output.
    `copies` (the methods below) is the number of purified samples per noisy sample the purifier hands it."""

    noise_option: ClassVar[Optional[str]] = None    # its setting that sets the noise its classifier sees, if any
    label: ClassVar[str]
    scores: ClassVar[str]
    output_name: ClassVar[str]

    @abstractmethod
    def module(self, classifier: nn.Module, image_shape: Tuple[int, ...], copies: int) -> nn.Module:
        """The head as one module: purified samples [B,C,H,W] or [B,copies,C,H,W] (+ fresh noise) -> scores [B,K]."""

    @abstractmethod
    def classifier_calls(self, copies: int) -> int:
        """Classifier images per Monte Carlo sample."""

    @abstractmethod
    def fresh_noise_shape(self, image_shape) -> Optional[Tuple[int, ...]]:
        """The per-sample noise its module takes besides the samples ([B, *shape]), or None."""

    @abstractmethod
    def score_tolerance(self, copies: int) -> Optional[float]:
        """How far a fast path's scores may lie from eager fp32's (relative; None: the check's default, made for
        logits and probabilities)."""

    @abstractmethod
    def noise_seen(self, noise_left: float) -> float:
        """The Gaussian noise std its classifier sees, given what the purifier left (the demo classifier it takes)."""

    @abstractmethod
    def tag(self) -> str:
        """What a sweep configuration's file name gets from its settings."""

    @abstractmethod
    def graph_tag(self) -> str:
        """What an exported classifier graph's file name gets from its settings."""

    @abstractmethod
    def graph_fields(self) -> dict:
        """Its settings in an exported classifier graph's manifest (None: does not apply)."""

    @abstractmethod
    def sweep_scorer(self, heads: Sequence["Head"], classifiers, image_shape, copies: Sequence[int],
                     reads: Sequence[int]) -> "SweepScorer":
        """One module scoring all of a sweep's configurations of this head (`heads`, configured; each with its
        classifier, the purifier's copies and which of the samples it reads, by position), shared work computed once."""


class PlainHead(Head):
    """A head with no settings of its own (logits, a majority vote): no fresh noise, nothing in its file names or
    manifests, its classifier sees the noise the purifier left; its configurations share nothing in a sweep."""

    def fresh_noise_shape(self, image_shape):
        return None

    def noise_seen(self, noise_left):
        return noise_left

    def tag(self):
        return ""

    def graph_tag(self):
        return ""

    def graph_fields(self):
        return {}

    def sweep_scorer(self, heads, classifiers, image_shape, copies, reads):
        return EachOwnScorer([head.module(classifier, image_shape, k)
                              for head, classifier, k in zip(heads, classifiers, copies)], reads)


class SweepScorer(nn.Module):
    """A head's share of a sweep (configurations.ConfigurationHeads): `forward(samples, fresh)` -> one score
    [B,K] per configuration, in the order given; `samples`: the sweep's inputs (noisy and/or denoised, in that order:
    configurations.inputs_of), `fresh`: the sweep's fresh noise or None. `noise_shape`: the fresh noise it takes per
    sample ([M, C, H, W]) or None."""

    noise_shape: Optional[Tuple[int, ...]] = None


class EachOwnScorer(SweepScorer):
    """A sweep share with nothing shared: each configuration's own module on the samples it reads (`reads`: their positions)."""

    def __init__(self, modules, reads):
        super().__init__()
        self.own, self.reads = nn.ModuleList(modules), tuple(reads)

    def forward(self, samples, fresh=None):
        return [module(samples[reads]).float() for module, reads in zip(self.own, self.reads)]

"""Several configurations of the base classifier voting on the same samples (a sweep): each noisy
sample is denoised once and scored by every configuration (method x classifier x sigma' x m at one
sigma), as ONE score stage returning [B, E, K] (stages/base.py), so the one voter and scheduler
run it on any backend.

Why each configuration's votes equal its single run's: every configuration sees the same smoothing
noise (keyed by seed, image and sample index), the same local noises (fixed: the seed-42 draw, whose
first m rows equal the m-row draw where checked, else drawn separately; fresh: Philox prefixes of
the largest m's draw) and the same classifier arithmetic.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from diffsmooth.engine.base_classifier.methods import MethodConfig, method_named
from diffsmooth.engine.base_classifier.methods.config import OPTION_ALIASES, option_variants
from diffsmooth.engine.base_classifier.probe import probed
from diffsmooth.engine.errors import UserError, first_line
from diffsmooth.engine.stages.base import BaseClassifierStages


@dataclass(frozen=True)
class Configuration:
    """One configuration of a sweep: the method's config and the classifier (by name) that votes for it."""

    config: MethodConfig
    classifier: str

    @property
    def name(self) -> str:
        """The configuration's result-file stem, e.g. diffsmooth__resnet110__ls0.25__m5."""
        return f"{self.config.name}__{self.classifier}{self.config.method.config_tag(self.config)}"


def configurations(methods: Sequence[str], sigma: float, options_for, classifiers_for) -> List[Configuration]:
    """Every configuration asked for: each method's settings `options_for(method)` gives (a dict or pairs; a
    sweepable setting with several values gives a configuration each, the last one named varying fastest; an alias
    the method has no setting of is ignored, OPTION_ALIASES), each
    with every classifier `classifiers_for(config)` names (a table's demo runs: the classifier its noise calls for).
    The configurations must share one purify stage (Purifier.key)."""
    found = []
    for method in methods:
        kind = method_named(method)
        declared = {o.name for o in kind.options}
        given = {k: v for k, v in dict(options_for(method)).items() if k in declared or k not in OPTION_ALIASES}
        variants = option_variants(kind, given)
        for _, group in itertools.groupby(variants, key=lambda variant: variant[:-1]):
            group = [MethodConfig(method, sigma, options=own) for own in group]
            found += [Configuration(config, clf) for clf in classifiers_for(group[0]) for config in group]
    keys = {}
    for c in found:
        keys.setdefault(c.config.purifier.key(c.config.sigma), c)
    keys.pop(None, None)
    if len(keys) > 1:
        a, b = list(keys.values())[:2]
        raise UserError(f"configurations {a.name} and {b.name} purify each sample differently: a sweep's "
                        f"configurations share one purify stage (run them apart)")
    if len({c.name for c in found}) != len(found):
        raise UserError("two sweep configurations would share a result file: give classifiers distinct file names")
    return found


def inputs_of(configs: Sequence[Configuration]) -> Tuple[str, ...]:
    """Which samples the configurations read: the noisy ones (rs), the denoised ones (dds, diffsmooth); in that
    order."""
    read = {c.config.purifier.reads for c in configs}
    return tuple(name for name in ("noisy", "denoised") if name in read)


class ConfigurationHeads(nn.Module):
    """(noisy and/or denoised samples [B,C,H,W], + fresh noise [B,M,C,H,W]) -> scores [B, E, K].

    The configurations of one head kind are scored by that head's one sweep scorer (Head.sweep_scorer), which
    computes what they share once (local smoothing: one classifier call at the largest m serves every smaller m).
    What the forward pass does is in plain attributes (which configurations each scorer serves) and in the scorers'
    tensors (the classifiers' weights, sigma' and fixed noises are buffers), never in a sigma, a sigma' or a file
    name: the heads of another sigma or sigma' have the same architecture, so a table's model set copies them into
    one built (and compiled) stage (engine/runs/model_set.py). `stacked` False: a single run (a sweep of one), whose
    scores are its one configuration's [B, K]."""

    def __init__(self, configs: Sequence[Configuration], classifiers: Dict[str, nn.Module], image_shape,
                 stacked: bool = True):
        super().__init__()
        configs = list(configs)
        self.stacked = bool(stacked) or len(configs) != 1
        names = sorted({c.classifier for c in configs})
        self.classifiers = nn.ModuleList(classifiers[name] for name in names)
        inputs = inputs_of(configs)
        self.num_inputs = len(inputs)       # the samples by position, not name: RS and DDS share a single run's stage
        self.image_shape = tuple(int(d) for d in image_shape)
        groups: Dict[type, List[int]] = {}
        for position, c in enumerate(configs):
            groups.setdefault(type(c.config.head), []).append(position)
        self.scorers = nn.ModuleList()
        for positions in groups.values():
            members = [configs[p] for p in positions]
            head = members[0].config.head
            self.scorers.append(head.sweep_scorer(
                [c.config.head for c in members], [self.classifiers[names.index(c.classifier)] for c in members],
                self.image_shape, [c.config.purifier.copies for c in members],
                [inputs.index(c.config.purifier.reads) for c in members]))
        self.positions = tuple(tuple(p) for p in groups.values())
        shapes = [s.noise_shape for s in self.scorers if s.noise_shape is not None]
        if len(shapes) > 1:
            raise UserError("two head kinds of a sweep take fresh noises of their own: run them apart")
        self.noise_shape = shapes[0] if shapes else None

    @property
    def takes_noise(self) -> bool:
        return self.noise_shape is not None

    @property
    def classifier(self) -> nn.Module:
        """The classifier of a run with one (where a fast path's rewrite can be seen)."""
        if len(self.classifiers) != 1:
            raise AttributeError("a sweep of several classifiers has no one classifier")
        return self.classifiers[0]

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        samples = inputs[:self.num_inputs]
        fresh = inputs[self.num_inputs] if self.takes_noise else None
        scores: List[Optional[torch.Tensor]] = [None] * sum(len(p) for p in self.positions)
        for positions, scorer in zip(self.positions, self.scorers):
            for position, score in zip(positions, scorer(samples, fresh)):
                scores[position] = score
        return torch.stack(scores, dim=1) if self.stacked else scores[0]


class StackedScores:
    """Exported score stages, one per configuration (one graph or engine file each), as one score stage
    [B, E, K]; fresh local noise is passed as the prefix of the largest m's draw."""

    def __init__(self, heads: Sequence[Tuple[object, int, Optional[int], MethodConfig]], inputs: Tuple[str, ...]):
        # (stage, position of its samples in `inputs`, m of fresh noise or None, its method config)
        self.heads = list(heads)
        self.inputs = inputs
        first = self.heads[0][0]
        self.device, self.precision = first.device, first.precision
        self.name = f"{len(self.heads)} configurations [{', '.join(h[0].name for h in self.heads[:2])}" + \
            (", ...]" if len(self.heads) > 2 else "]")

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        noise = inputs[len(self.inputs)] if len(inputs) > len(self.inputs) else None
        scores = []
        for stage, position, m, config in self.heads:
            samples = config.purifier.share(inputs[position])     # its share of the shared purify's
            args = [samples] + ([noise[:, :m].contiguous()] if m is not None else [])
            scores.append(stage(*args))
        classes = {int(score.shape[-1]) for score in scores}
        if len(classes) != 1:
            raise UserError(f"the sweep's classifier graphs score different numbers of classes: {sorted(classes)}")
        return torch.stack(scores, dim=1)


def check_classes(classifiers: Dict[str, nn.Module], image_shape, device) -> None:
    """The sweep's classifiers must take the images and score the same number of classes."""
    counts = {}
    for name, module in classifiers.items():
        try:
            with torch.no_grad():
                out = module.to(device)(torch.full((1, *image_shape), 0.5, device=device))
        except RuntimeError as exc:
            raise UserError(f"classifier {name} cannot take images of shape {tuple(image_shape)}: {first_line(exc)}") from None
        counts[name] = int(out.shape[-1])
    if len(set(counts.values())) > 1:
        raise UserError(f"the sweep's classifiers score different numbers of classes: {sorted(set(counts.values()))}")


def purifier_config(configs: Sequence[Configuration]) -> Optional[MethodConfig]:
    """The configuration whose purify stage serves the whole sweep (its method's choice), or None: none purifies."""
    purifying = [c.config for c in configs if c.config.purifier.purifies]
    if not purifying:
        return None
    same = [m for m in purifying if m.method is purifying[0].method]
    return same[same[0].purifier.serving([m.purifier for m in same])]


def stacked_configuration_stages(configs: Sequence[Configuration], stages_of, image_shape,
                                 num_classes: Optional[int] = None) -> BaseClassifierStages:
    """The sweep's stages from exported ones: `stages_of(configuration)` gives each configuration's
    single stages (graphs or engine files, unprobed); the purify stage of purifier_config's serves all, probed once with
    every score stage (checked_stages)."""
    inputs = inputs_of(configs)
    singles = [stages_of(c) for c in configs]
    serving = purifier_config(configs)
    shared = next((s for c, s in zip(configs, singles) if c.config == serving), None)
    fresh_ms = [s.local_noise_shape[0] for s in singles if s.local_noise_shape is not None]
    heads = [(s.score, inputs.index(c.config.purifier.reads),
              s.local_noise_shape[0] if s.local_noise_shape is not None else None, c.config)
             for c, s in zip(configs, singles)]
    local_shape = None
    if fresh_ms:
        local_shape = (max(fresh_ms), *next(s.local_noise_shape[1:] for s in singles if s.local_noise_shape))
    return checked_stages(configs, shared.purify if shared else None, StackedScores(heads, inputs), local_shape,
                          inputs, image_shape, num_classes)


def checked_stages(configs, purify, score, local_shape, inputs, image_shape, num_classes) -> BaseClassifierStages:
    """Stages of the configurations, probed once with a blank image (classes counted and checked)."""
    stages = BaseClassifierStages("sweep", purify, score, num_classes or 0, local_shape,
                                  tuple(c.name for c in configs), inputs)
    shared = purifier_config(configs)
    if shared is not None and purify is not None:
        stages.purify_noise = shared.purifier.draws_noise
        stages.purified_shape = shared.purifier.purified_shape(tuple(image_shape))
    return probed(stages, tuple(image_shape), num_classes, "the classifiers")

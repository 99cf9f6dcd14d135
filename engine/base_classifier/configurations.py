"""Several configurations of the base classifier voting on the same samples (a sweep): each noisy
sample is denoised once and scored by every configuration (method x classifier x sigma' x m at one
sigma), as ONE score stage returning [B, E, K] (backends/base.py), so the one voter and scheduler
run it on any backend.

Why each configuration's votes equal its single run's: every configuration sees the same smoothing
noise (keyed by seed, image and sample index), the same local noises (fixed: the seed-42 draw, whose
first m rows equal the m-row draw where checked, else drawn separately; fresh: Philox prefixes of
the largest m's draw) and the same classifier arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from diffsmooth.engine.backends.base import BaseClassifierStages
from diffsmooth.engine.base_classifier.local_smoothing import local_probabilities
from diffsmooth.engine.base_classifier.methods import MethodConfig, method_named
from diffsmooth.engine.base_classifier.methods.config import option_variants
from diffsmooth.engine.base_classifier.probe import probe
from diffsmooth.engine.certify.noise import fixed_local_noise
from diffsmooth.engine.choices import FIXED_LOCAL_NOISE_SEED
from diffsmooth.engine.errors import UserError, first_line


@dataclass(frozen=True)
class Configuration:
    """One configuration of a sweep: the method and the classifier (by name) that votes for it."""

    method: MethodConfig
    classifier: str

    @property
    def name(self) -> str:
        """The configuration's result-file stem, e.g. diffsmooth__resnet110__ls0.25__m5."""
        return f"{self.method.method}__{self.classifier}{self.method.kind.config_tag(self.method)}"


def configurations(methods: Sequence[str], sigma: float, local_sigmas: Sequence[float], ms: Sequence[int],
                   local_noise: str, classifiers_for, options_for=None) -> List[Configuration]:
    """Every (method, classifier, sigma', m) asked for; `classifiers_for(method, sigma')` names the
    classifiers a method uses at that local sigma (sigma' None for a method without local smoothing);
    `options_for(method)`: the method's own settings (None: their defaults; a sweepable one with several values
    gives a configuration each). The configurations must share one purify stage (Method.purifier_key)."""
    found = []
    for method in methods:
        kind = method_named(method)
        for own in option_variants(kind, options_for(method) if options_for is not None else ()):
            if kind.local_smoothing:
                found += [Configuration(MethodConfig(method, sigma, int(m), float(ls), local_noise, options=own), clf)
                          for ls in local_sigmas for clf in classifiers_for(method, float(ls)) for m in ms]
            else:
                found += [Configuration(MethodConfig(method, sigma, local_noise=local_noise, options=own), clf)
                          for clf in classifiers_for(method, None)]
    keys = {}
    for c in found:
        keys.setdefault(c.method.kind.purifier_key(c.method), c)
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
    read = {c.method.kind.reads for c in configs}
    return tuple(name for name in ("noisy", "denoised") if name in read)


class ConfigurationHeads(nn.Module):
    """(noisy and/or denoised samples [B,C,H,W], + fresh local noise [B,M,C,H,W]) -> scores [B, E, K].

    Local smoothing of one classifier at one sigma' runs once on the largest m's noises; smaller m
    average a prefix of its softmax outputs, so m in {1,3,5,11,21} costs one call at m = 21.

    What the forward pass does is in plain attributes (`plan`: per configuration the samples it reads, the index
    of its classifier, of its local-smoothing call and of its noise group, m, and the index of its method's own
    head, for a method that scores its own way: Method.sweep_head) and in tensors (the
    classifiers' weights, each call's sigma' and the fixed noises are buffers), never in a sigma,
    a sigma' or a file name: the heads of another sigma or sigma' have the same architecture, so a
    table's model set copies them into one built (and compiled) stage (engine/runs/model_set.py)."""

    def __init__(self, configs: Sequence[Configuration], classifiers: Dict[str, nn.Module], image_shape,
                 local_noise: str = "fixed", local_noise_seed: int = FIXED_LOCAL_NOISE_SEED):
        super().__init__()
        configs = list(configs)
        names = sorted({c.classifier for c in configs})
        self.classifiers = nn.ModuleList(classifiers[name] for name in names)
        self.inputs = inputs_of(configs)
        self.local_noise = local_noise
        self.image_shape = tuple(int(d) for d in image_shape)
        ms = sorted({c.method.m for c in configs if c.method.kind.local_smoothing})
        self.largest_m = ms[-1] if ms else None
        groups = self._noise_groups(ms, local_noise_seed)
        self.groups = [(big_m, members) for big_m, members, _ in groups]
        for k, (_, _, noise) in enumerate(groups):
            self.register_buffer(f"noise_{k}", noise, persistent=False)
        calls: List[Tuple[str, float, int]] = []            # (classifier, sigma', noise group) of each call
        plan = []
        self.method_heads = nn.ModuleList()                 # the heads of methods that score their own way
        for c in configs:
            index = names.index(c.classifier)
            if not c.method.kind.local_smoothing:
                head = c.method.kind.sweep_head(c.method, self.classifiers[index], self.image_shape)
                if head is not None:
                    self.method_heads.append(head)
                plan.append((c.method.kind.reads, index, None, None, None,
                             None if head is None else len(self.method_heads) - 1))
                continue
            k = next(k for k, (_, members) in enumerate(self.groups) if c.method.m in members)
            call = (c.classifier, float(c.method.local_sigma), k)
            if call not in calls:
                self.register_buffer(f"local_sigma_{len(calls)}", torch.tensor(call[1], dtype=torch.float32),
                                     persistent=False)
                calls.append(call)
            plan.append((c.method.kind.reads, index, calls.index(call), k, int(c.method.m), None))
        self.plan = tuple(plan)

    @property
    def takes_noise(self) -> bool:
        return self.local_noise == "fresh" and self.largest_m is not None

    def _noise_groups(self, ms: List[int], seed: int) -> List[Tuple[int, List[int], Optional[torch.Tensor]]]:
        """(M, the m served by the first M local noises, the fixed noises or None when fresh)."""
        if not ms:
            return []
        if self.local_noise == "fresh":                 # Philox: prefixes are exact by construction
            return [(ms[-1], ms, None)]
        full = fixed_local_noise(ms[-1], self.image_shape, seed)
        shared = [m for m in ms if torch.equal(full[:m], fixed_local_noise(m, self.image_shape, seed))]
        return [(ms[-1], shared, full)] + [(m, [m], fixed_local_noise(m, self.image_shape, seed))
                                           for m in ms if m not in shared]

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        samples = dict(zip(self.inputs, inputs))
        fresh = inputs[len(self.inputs)] if self.takes_noise else None
        probabilities = {}
        scores = []
        for reads, index, call, k, m, head in self.plan:
            classifier = self.classifiers[index]
            if head is not None:                # the method's own head on the samples it reads
                score = self.method_heads[head](samples[reads]).float()
            elif call is None:                  # the plain classifier on the samples the method reads
                score = classifier(samples[reads]).float()
            else:                               # local smoothing: a prefix of one call's m noises
                big_m = self.groups[k][0]
                if call not in probabilities:
                    delta = fresh if fresh is not None else getattr(self, f"noise_{k}").unsqueeze(0)
                    probabilities[call] = local_probabilities(classifier, samples["denoised"], delta,
                                                              getattr(self, f"local_sigma_{call}"))
                p = probabilities[call]
                score = p.mean(dim=1) if m == big_m else p[:, :m].contiguous().mean(dim=1)
            scores.append(score)
        return torch.stack(scores, dim=1)


class StackedScores:
    """Exported score stages, one per configuration (one graph or plan each), as one score stage
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
            samples = config.kind.sweep_samples(config, inputs[position])      # its share of the shared purify's
            args = [samples] + ([noise[:, :m].contiguous()] if m is not None else [])
            scores.append(stage(*args))
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


@dataclass(frozen=True)
class _Kernels:
    """The UNet kernels a sweep's purify stage runs (what Method.purify_stage reads of a fast path)."""

    fused_attention: bool = False
    lean_unet: bool = False


def purifier_config(configs: Sequence[Configuration]) -> Optional[MethodConfig]:
    """The configuration whose purify stage serves the whole sweep (its method's choice), or None: none denoises."""
    denoising = [c.method for c in configs if c.method.uses_denoiser]
    if not denoising:
        return None
    return denoising[0].kind.sweep_purifier_config([m for m in denoising if m.kind is denoising[0].kind])


def torch_configuration_stages(configs: Sequence[Configuration], classifiers: Dict[str, nn.Module], denoiser, backend,
                               image_shape, num_classes: Optional[int] = None,
                               fused_attention: bool = False, lean_unet: bool = False) -> BaseClassifierStages:
    """The sweep's stages on a TorchBackend: the denoiser once (the method's purify stage, Method.purify_stage, of
    purifier_config), every configuration in one score stage (`lean_unet`: the denoiser on its UNet's eps-only
    copy, DiffusionDenoiser.purifier)."""
    local_noise = configs[0].method.local_noise
    inputs = inputs_of(configs)
    if "denoised" in inputs and denoiser is None:
        raise UserError("the sweep's denoising configurations need `denoiser` CHECKPOINT")
    check_classes({c.classifier: classifiers[c.classifier] for c in configs}, image_shape, torch.device("cpu"))
    shared = purifier_config(configs) if "denoised" in inputs else None
    purify = (shared.kind.purify_stage(shared, denoiser, backend, _Kernels(fused_attention, lean_unet))
              if shared is not None else None)
    heads = ConfigurationHeads(configs, classifiers, image_shape, local_noise,
                               configs[0].method.local_noise_seed)
    score = backend.stage(heads, f"{len(configs)} configurations")
    local_shape = (heads.largest_m, *image_shape) if heads.takes_noise else None
    return checked_stages(configs, purify, score, local_shape, inputs, image_shape, num_classes)


def stacked_configuration_stages(configs: Sequence[Configuration], stages_of) -> BaseClassifierStages:
    """The sweep's stages from exported ones: `stages_of(configuration)` gives each configuration's
    single stages (graphs or plans); the purify stage of purifier_config's serves all."""
    inputs = inputs_of(configs)
    singles = [stages_of(c) for c in configs]
    serving = purifier_config(configs)
    shared = next((s for c, s in zip(configs, singles) if c.method == serving), None)
    fresh_ms = [c.method.m for c, s in zip(configs, singles) if s.local_noise_shape is not None]
    heads = [(s.score, inputs.index(c.method.kind.reads),
              c.method.m if s.local_noise_shape is not None else None, c.method) for c, s in zip(configs, singles)]
    local_shape = None
    if fresh_ms:
        local_shape = (max(fresh_ms), *next(s.local_noise_shape[1:] for s in singles if s.local_noise_shape))
    classes = {s.num_classes for s in singles}
    if len(classes) != 1:
        raise UserError(f"the sweep's classifier graphs score different numbers of classes: {sorted(classes)}")
    return BaseClassifierStages("sweep", shared.purify if shared else None, StackedScores(heads, inputs), classes.pop(),
                                local_shape, tuple(c.name for c in configs), inputs,
                                purify_noise=bool(shared and shared.purify_noise),
                                purified_shape=shared.purified_shape if shared else None)


def checked_stages(configs, purify, score, local_shape, inputs, image_shape, num_classes) -> BaseClassifierStages:
    """Stages of the configurations, probed once with a blank image (classes counted and checked)."""
    stages = BaseClassifierStages("sweep", purify, score, num_classes or 0, local_shape,
                                  tuple(c.name for c in configs), inputs)
    shared = purifier_config(configs)
    if shared is not None and purify is not None:
        stages.purify_noise = shared.kind.purify_noise
        stages.purified_shape = shared.kind.purified_shape(shared, tuple(image_shape))
    stages.num_classes = probe(stages, tuple(image_shape))
    if num_classes is not None and num_classes > stages.num_classes:
        raise UserError(f"the data has labels up to {num_classes - 1} but the classifiers score only "
                        f"{stages.num_classes} classes")
    return stages

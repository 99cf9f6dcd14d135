"""Local smoothing (DiffSmooth): the mean softmax of a smoothed classifier over m Gaussian noises of std sigma' added
to the purified sample votes. Its settings are its options: m, sigma' (`local_sigma`), the local noises `fixed`
(drawn once from `local_noise_seed`, as the reference does) or `fresh` (per sample, the paper's Algorithm 3)."""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch import nn

from diffsmooth.engine.base_classifier.methods.config import MethodOption
from diffsmooth.engine.base_classifier.methods.head import Head, SweepScorer
from diffsmooth.engine.certify.noise import fixed_local_noise
from diffsmooth.engine.choices import (
    DEFAULT_LOCAL_NOISE,
    DEFAULT_LOCAL_SIGMA,
    DEFAULT_M,
    FIXED_LOCAL_NOISE_SEED,
    LOCAL_NOISE_MODES,
    MAX_LOCAL_NOISES,
    MAX_SEED,
)


class LocalSmoothingModule(nn.Module):
    """x_hat [B,C,H,W] (+ fresh noise [B,m,C,H,W]) -> mean softmax over the m local noises [B,K];
    sigma' is a buffer (a compiled head stays valid when another sigma' is copied in)."""

    def __init__(self, classifier: nn.Module, m: int, local_sigma: float, mode: str = "fixed",
                 fixed_noise: Optional[torch.Tensor] = None):
        super().__init__()
        if mode not in LOCAL_NOISE_MODES:
            raise ValueError(f"local noise mode must be one of {LOCAL_NOISE_MODES}, got {mode!r}")
        if mode == "fixed" and (fixed_noise is None or fixed_noise.shape[0] != m):
            raise ValueError("fixed local noise needs a tensor of shape [m, C, H, W]")
        self.classifier = classifier
        self.m = int(m)
        self.mode = mode
        # a buffer, not a float baked into a compiled graph: a built head moves to another sigma' in place
        self.register_buffer("local_sigma", torch.tensor(float(local_sigma), dtype=torch.float32), persistent=False)
        self.register_buffer("fixed_noise", fixed_noise if mode == "fixed" else None, persistent=False)

    @property
    def takes_noise(self) -> bool:
        """True when the caller must pass the local noise (fresh mode)."""
        return self.mode == "fresh"

    def forward(self, x_hat: torch.Tensor, noise: Optional[torch.Tensor] = None) -> torch.Tensor:
        delta = self.fixed_noise.unsqueeze(0) if self.mode == "fixed" else noise
        return local_probabilities(self.classifier, x_hat, delta, self.local_sigma).mean(dim=1)


def local_probabilities(classifier: nn.Module, x_hat: torch.Tensor, delta: torch.Tensor,
                        local_sigma) -> torch.Tensor:
    """softmax(classifier(x_hat + sigma' * delta_i)) for every local noise i, in ONE classifier
    call over B*m images: x_hat [B,C,H,W], delta [1 or B, m, C,H,W] -> probabilities [B,m,K]."""
    b, m = x_hat.shape[0], delta.shape[1]
    y = (x_hat.unsqueeze(1) + local_sigma * delta.to(x_hat.dtype)).reshape(b * m, *x_hat.shape[1:])
    logits = classifier(y).float()
    return torch.softmax(logits, dim=-1).view(b, m, -1)


class LocalSmoothingHead(Head):
    options = (MethodOption("local_sigma", float, DEFAULT_LOCAL_SIGMA, 0.0, None, "sigma' of the local noises",
                            sweepable=True, label="sigma'"),
               MethodOption("m", int, DEFAULT_M, 1, MAX_LOCAL_NOISES, "local noises per sample", sweepable=True,
                            preview=1),
               MethodOption("local_noise", str, DEFAULT_LOCAL_NOISE, help="fixed: drawn once; fresh: per sample",
                            choices=LOCAL_NOISE_MODES, preview="fixed"),
               MethodOption("local_noise_seed", int, FIXED_LOCAL_NOISE_SEED, 0, MAX_SEED,
                            "the seed of the fixed local noises", recorded=False))
    noise_option = "local_sigma"            # its classifier sees the local noises' sigma'
    label = "local-smoothing classifier"
    scores = "mean_softmax"
    output_name = "probs"

    def module(self, classifier, image_shape, copies):
        fixed = fixed_local_noise(self.m, image_shape, self.local_noise_seed) if self.local_noise == "fixed" else None
        return LocalSmoothingModule(classifier, self.m, self.local_sigma, self.local_noise, fixed)

    def classifier_calls(self, copies):
        return self.m * int(copies)

    def fresh_noise_shape(self, image_shape):
        return (self.m, *map(int, image_shape)) if self.local_noise == "fresh" else None

    def score_tolerance(self, copies):
        return None

    def noise_seen(self, noise_left):
        return (noise_left ** 2 + self.local_sigma ** 2) ** 0.5

    def tag(self):
        return f"__ls{self.local_sigma:g}__m{self.m}"

    def graph_tag(self):
        tag = f"_m{self.m}_ls{self.local_sigma:g}_{self.local_noise}"
        fixed = self.local_noise == "fixed" and self.local_noise_seed != FIXED_LOCAL_NOISE_SEED
        return tag + (f"_seed{self.local_noise_seed}" if fixed else "")

    def graph_fields(self):
        return {"m": self.m, "local_sigma": self.local_sigma, "local_noise": self.local_noise,
                "local_noise_seed": self.local_noise_seed if self.local_noise == "fixed" else None}

    def sweep_scorer(self, heads, classifiers, image_shape, copies, reads):
        return LocalSmoothingScorer(heads, classifiers, image_shape, reads)


class LocalSmoothingScorer(SweepScorer):
    """A sweep's local-smoothing configurations: one classifier call per (classifier, sigma', noise group) on the
    largest m's noises; a smaller m averages a prefix of its softmax outputs, so m in {1,3,5,11,21} costs one call at
    m = 21. Fixed noises: the seed's draw, whose first m rows equal the m-row draw where checked (else drawn apart);
    fresh: Philox prefixes of the largest m's draw. sigma' and the noises are buffers, never plain attributes: the
    scorer of another sigma' has the same architecture (engine/runs/model_set.py copies it in)."""

    def __init__(self, heads, classifiers, image_shape, reads):
        super().__init__()
        settings = [(int(h.m), float(h.local_sigma), h.local_noise, int(h.local_noise_seed)) for h in heads]
        self.local_noise = settings[0][2]
        self.image_shape = tuple(int(d) for d in image_shape)
        ms = sorted({m for m, _, _, _ in settings})
        self.largest_m = ms[-1]
        groups = self._noise_groups(ms, settings[0][3])
        self.groups = [(big_m, members) for big_m, members, _ in groups]
        for k, (_, _, noise) in enumerate(groups):
            self.register_buffer(f"noise_{k}", noise, persistent=False)
        self.classifiers = torch.nn.ModuleList(classifiers)
        calls: List[Tuple[int, float, int, str]] = []   # (classifier index, sigma', noise group, samples) of each call
        assignments = []
        for index, (m, local_sigma, _, _) in enumerate(settings):
            k = next(k for k, (_, members) in enumerate(self.groups) if m in members)
            call = (_first(classifiers, classifiers[index]), float(local_sigma), k, reads[index])
            if call not in calls:
                self.register_buffer(f"local_sigma_{len(calls)}", torch.tensor(call[1], dtype=torch.float32),
                                     persistent=False)
                calls.append(call)
            assignments.append((call[0], calls.index(call), k, m, reads[index]))
        self.assignments = tuple(assignments)
        self.noise_shape = (self.largest_m, *self.image_shape) if self.local_noise == "fresh" else None

    def _noise_groups(self, ms: List[int], seed: int) -> List[Tuple[int, List[int], Optional[torch.Tensor]]]:
        """(M, the m served by the first M local noises, the fixed noises or None when fresh)."""
        if self.local_noise == "fresh":                 # Philox: prefixes are exact by construction
            return [(ms[-1], ms, None)]
        full = fixed_local_noise(ms[-1], self.image_shape, seed)
        shared = [m for m in ms if torch.equal(full[:m], fixed_local_noise(m, self.image_shape, seed))]
        return [(ms[-1], shared, full)] + [(m, [m], fixed_local_noise(m, self.image_shape, seed))
                                           for m in ms if m not in shared]

    def forward(self, samples, fresh=None):
        probabilities, scores = {}, []
        for index, call, k, m, reads in self.assignments:
            big_m = self.groups[k][0]
            if call not in probabilities:
                delta = fresh if fresh is not None else getattr(self, f"noise_{k}").unsqueeze(0)
                probabilities[call] = local_probabilities(self.classifiers[index], samples[reads], delta,
                                                          getattr(self, f"local_sigma_{call}"))
            p = probabilities[call]
            scores.append(p.mean(dim=1) if m == big_m else p[:, :m].contiguous().mean(dim=1))
        return scores


def _first(modules, module) -> int:
    """The index of `module`'s first occurrence in `modules` (configurations of one classifier share its calls)."""
    return next(i for i, other in enumerate(modules) if other is module)


LocalSmoothing = LocalSmoothingHead      # its name before parts ended in Purifier / Head: scripts written with it keep working

"""Local smoothing (DiffSmooth): the mean softmax of a smoothed classifier over m Gaussian noises of std sigma' added
to the purified sample votes. Its settings are its options: m, sigma' (`local_sigma`), the local noises `fixed`
(drawn once from `local_noise_seed`, as the reference does) or `fresh` (per sample, the paper's Algorithm 3)."""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from diffsmooth.engine.base_classifier.local_smoothing import LocalSmoothingModule, local_probabilities
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
        plan = []
        for index, (m, local_sigma, _, _) in enumerate(settings):
            k = next(k for k, (_, members) in enumerate(self.groups) if m in members)
            call = (_first(classifiers, classifiers[index]), float(local_sigma), k, reads[index])
            if call not in calls:
                self.register_buffer(f"local_sigma_{len(calls)}", torch.tensor(call[1], dtype=torch.float32),
                                     persistent=False)
                calls.append(call)
            plan.append((call[0], calls.index(call), k, m, reads[index]))
        self.plan = tuple(plan)
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
        for index, call, k, m, reads in self.plan:
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

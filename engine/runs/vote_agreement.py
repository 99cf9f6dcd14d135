"""Judging a fast path against eager fp32 from arrays alone: production vote counts per image,
per-sample scores of both paths (numpy/scipy on the arrays; only the design flip rates come from the
methods), so any scheduler that yields counts can be judged.

Sizing: a correct path flips a vote with a per-sample probability that depends on its precision and on
the method (each method's `flip_rates`, engine/base_classifier/methods/, measured on an H200). Each of the
two comparisons (production counts, per-sample votes) allows the number of flips that such a path exceeds
with probability <= half the false-refusal rate, so a correct path is refused less than once in
1 / FALSE_REFUSAL runs; a wrong image, noise or batch moves far more votes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import List, Optional, Sequence

import numpy as np
from scipy.stats import binom

from diffsmooth.engine.base_classifier.methods import BUILT_IN, method_named

# Per-sample vote flips of a correct path against eager fp32 (TF32 off): each method's own (its `flip_rates`,
# measured on an H200 on the demo models). The default of a check that names no method: the smallest built-in fp16
# rate (the noise-trained classifiers', DiffSmooth's measured one).
FP16_FLIP_RATE = min(method.flip_rates["fp16"] for method in BUILT_IN)
FALSE_REFUSAL = 1e-4         # a correct path at the design flip rate is refused less often than this
SCORE_TOLERANCE = 0.05       # max |score difference| / (1 + max |reference score|): fp16 measured 1e-3


def flip_budget(samples: int, flip_rate: float = FP16_FLIP_RATE, false_refusal: float = FALSE_REFUSAL / 2) -> int:
    """The smallest F with P(Binomial(samples, flip_rate) > F) <= false_refusal."""
    if samples <= 0:
        return 0
    budget = 0
    while binom.sf(budget, samples, flip_rate) > false_refusal:
        budget += 1
    return budget


def design_flip_rate(precision: str, methods: Sequence[str]) -> float:
    """The flip rate the check expects of a run: the largest measured rate among its methods at its precision
    (an fp32 fast path counts as fp16: cuDNN's TF32 convolutions keep fp16's 10 mantissa bits)."""
    bits = "bf16" if precision == "bf16" else "fp16"
    return max(method_named(method).flip_rates[bits] for method in methods)


def moved_votes(a: np.ndarray, b: np.ndarray) -> int:
    """Votes that changed class between two count vectors of the same samples (half the L1 distance)."""
    return int(np.abs(np.asarray(a, np.int64) - np.asarray(b, np.int64)).sum() // 2)


@dataclass
class AgreementReport:
    """The check's findings; `problems` empty means the fast path may count."""

    image_indices: List[int]
    samples: int                        # per image
    count_moved: List[int]              # per image: votes moved between classes, production vs reference
    count_sums: List[int]               # per image: votes the production path counted
    spread: List[int]                   # per image: classes with reference votes
    flips: int                          # per-sample votes that differ
    compared: int                       # per-sample votes compared
    max_abs_diff: float                 # per-sample scores
    score_scale: float                  # max |reference score|
    budget: int                         # allowed flips per comparison
    problems: List[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def agree(self) -> int:
        return self.compared - self.flips

    @property
    def fraction(self) -> float:
        return self.agree / self.compared if self.compared else 1.0

    def line(self) -> str:
        per_image = ", ".join(f"{i}: {m}" for i, m in zip(self.image_indices, self.count_moved))
        return (f"{len(self.image_indices)} images x {self.samples} samples: production counts moved "
                f"{sum(self.count_moved)} votes ({per_image}), per-sample votes differ on {self.flips} of "
                f"{self.compared}, max |score difference| {self.max_abs_diff:.3g}; budget {self.budget} flips each")

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(ok=self.ok, agree=self.agree, fraction=self.fraction)
        return d


def judge_agreement(fast_counts: Sequence[np.ndarray], fast_scores: Sequence[np.ndarray],
                    reference_scores: Sequence[np.ndarray], image_indices: Optional[Sequence[int]] = None,
                    flip_rate: float = FP16_FLIP_RATE, false_refusal: float = FALSE_REFUSAL,
                    score_tolerance: float = SCORE_TOLERANCE) -> AgreementReport:
    """Per image: the production path's counts [K] over samples 0..S-1, both paths' scores [S, K] on
    those samples (the reference's votes are its argmax). Refuses counts that do not sum to S (a
    dropped or repeated batch), more moved votes or per-sample flips than `flip_budget`, non-finite
    fast scores, and scores further apart than `score_tolerance` (wrong noise on an image whose
    votes all agree shows only there)."""
    refs = [np.asarray(r, np.float64) for r in reference_scores]
    fasts = [np.asarray(f, np.float64) for f in fast_scores]
    counts = [np.asarray(c, np.int64) for c in fast_counts]
    if not (len(refs) == len(fasts) == len(counts)) or not refs:
        raise ValueError("need counts and scores of the same images, at least one")
    indices = list(image_indices) if image_indices is not None else list(range(len(refs)))
    samples = refs[0].shape[0]
    if any(r.shape[0] != samples or f.shape != r.shape for r, f in zip(refs, fasts)):
        raise ValueError("every image needs scores [samples, classes] of the same shape from both paths")
    problems, moved, sums, spread = [], [], [], []
    flips, worst, scale = 0, 0.0, 0.0
    for i, c, f, r in zip(indices, counts, fasts, refs):
        ref_votes = r.argmax(axis=1)
        ref_counts = np.bincount(ref_votes, minlength=max(len(c), r.shape[1]))
        sums.append(int(c.sum()))
        spread.append(int((ref_counts > 0).sum()))
        if sums[-1] != samples:
            problems.append(f"image {i}: the production path counted {sums[-1]} votes for {samples} samples "
                            f"(a dropped or repeated batch)")
        padded = np.zeros_like(ref_counts)
        padded[:len(c)] = c[:len(padded)]
        moved.append(moved_votes(padded, ref_counts))
        if not np.isfinite(f).all():
            problems.append(f"image {i}: the fast path's scores contain NaN/Inf")
            continue
        flips += int((f.argmax(axis=1) != ref_votes).sum())
        if r.size:
            worst = max(worst, float(np.abs(f - r).max()))
            scale = max(scale, float(np.abs(r).max()))
    compared = samples * len(refs)
    budget = flip_budget(compared, flip_rate, false_refusal / 2)
    if sum(moved) > budget:
        problems.append(f"the production counts moved {sum(moved)} votes against eager fp32 (budget {budget})")
    if flips > budget:
        problems.append(f"{flips} of {compared} per-sample votes differ from eager fp32 (budget {budget})")
    if worst > score_tolerance * (1.0 + scale):
        problems.append(f"scores differ from eager fp32 by up to {worst:.3g} (tolerance "
                        f"{score_tolerance * (1.0 + scale):.3g}): another image, noise or model")
    return AgreementReport(indices, samples, moved, sums, spread, flips, compared, worst, scale, budget, problems)

"""The smoothed classifier g (Cohen et al. 2019) around a DiffSmooth/DDS/RS base classifier.

certify: n0 samples select cA, n further samples estimate pA; radius sigma * Phi^-1(pA_lower).
predict: n samples, abstain unless a binomial test separates the top two classes.
"""

from __future__ import annotations

from typing import Tuple

import torch

from diffsmooth.engine.certify.certification import ABSTAIN, certify_from_counts, predict_from_counts
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.certify.monte_carlo import MonteCarloPipeline


def check_certify_parameters(n0: int, n: int, alpha: float, batch: int) -> None:
    """UserError for parameters CERTIFY cannot work with."""
    if n0 < 1:
        raise UserError(f"n0 must be >= 1, got {n0}")
    if n < 1:
        raise UserError(f"n must be >= 1, got {n}")
    if not 0 < alpha < 1:
        raise UserError(f"alpha must be in (0, 1), got {alpha}")
    if batch < 1:
        raise UserError(f"batch must be >= 1, got {batch}")


class Smooth:
    """g(x) = the most probable vote of the base classifier under N(x, sigma^2 I)."""

    ABSTAIN = ABSTAIN

    def __init__(self, pipeline: MonteCarloPipeline):
        self.pipeline = pipeline
        self.sigma = pipeline.sigma

    def certify(self, x: torch.Tensor, n0: int, n: int, alpha: float, batch: int,
                image_index: int = 0) -> Tuple[int, float]:
        """(cA, radius) with P[g(x + delta) = cA for all ||delta|| < radius] >= 1 - alpha,
        or (ABSTAIN, 0.0). Samples 0..n0-1 select, samples n0..n0+n-1 estimate."""
        check_certify_parameters(n0, n, alpha, batch)
        selection = self.pipeline.count(x, image_index, 0, n0, batch)
        estimation = self.pipeline.count(x, image_index, n0, n, batch)
        return certify_from_counts(selection.tolist(), estimation.tolist(), alpha, self.sigma)

    def predict(self, x: torch.Tensor, n: int, alpha: float, batch: int, image_index: int = 0) -> int:
        """g(x), or ABSTAIN; wrong with probability at most alpha when it does not abstain."""
        check_certify_parameters(1, n, alpha, batch)
        counts = self.pipeline.count(x, image_index, 0, n, batch)
        return predict_from_counts(counts.tolist(), alpha)

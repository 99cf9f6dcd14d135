"""Monte Carlo vote counting: noisy copies of one image -> base classifier -> class counts.

Sample j of image i always gets the same noise (engine/certify/noise.py), so counts do not depend on
the batch size. Votes are counted on the device with bincount; the host sees one count
vector per call (one sync per CERTIFY pass, not per batch).
"""

from __future__ import annotations

import numpy as np
import torch

from diffsmooth.engine.backends.base import BaseClassifierStages
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.certify.noise import STREAM_LOCAL, STREAM_SMOOTHING, gaussian


def noisy_batch(x: torch.Tensor, sigma: float, seed: int, image_index: int, first_sample: int,
                size: int) -> torch.Tensor:
    """x + sigma * eps for samples first_sample..first_sample+size-1 (fp32, on x's device)."""
    eps = gaussian(seed, STREAM_SMOOTHING, image_index, first_sample, size, x.shape, x.device)
    return x.unsqueeze(0) + sigma * eps


class NonFiniteScores(UserError):
    """A backend produced NaN/Inf scores: the votes of that pass cannot be trusted."""


class MonteCarloPipeline:
    """Counts votes of the base classifier on x + sigma * eps for a range of sample indices."""

    def __init__(self, stages: BaseClassifierStages, sigma: float, seed: int = 0):
        if not sigma > 0:
            raise UserError(f"sigma must be > 0, got {sigma}")
        self.stages = stages
        self.sigma = float(sigma)
        self.seed = int(seed)

    @property
    def num_classes(self) -> int:
        return self.stages.num_classes

    def noisy_batch(self, x: torch.Tensor, image_index: int, first_sample: int, size: int) -> torch.Tensor:
        return noisy_batch(x, self.sigma, self.seed, image_index, first_sample, size)

    def scores(self, x: torch.Tensor, image_index: int, first_sample: int, size: int) -> torch.Tensor:
        """The base classifier's scores [size, K] on one batch of noisy copies of x."""
        stages = self.stages
        h = self.noisy_batch(x, image_index, first_sample, size)
        if stages.purify is not None:
            h = stages.purify(h)
        inputs = [h]
        if stages.local_noise_shape is not None:
            inputs.append(gaussian(self.seed, STREAM_LOCAL, image_index, first_sample, size,
                                   stages.local_noise_shape, h.device))
        return stages.score(*inputs)

    def count(self, x: torch.Tensor, image_index: int, first_sample: int, num: int,
              batch: int) -> np.ndarray:
        """Vote counts (int64 [K]) over samples first_sample..first_sample+num-1 of image_index."""
        if num < 1 or batch < 1:
            raise UserError(f"need num >= 1 and batch >= 1, got num={num}, batch={batch}")
        device = self.stages.device
        x = x.to(device=device, dtype=torch.float32)
        counts = torch.zeros(self.num_classes, dtype=torch.int64, device=device)
        finite = torch.ones((), dtype=torch.bool, device=device)
        done = 0
        while done < num:
            size = min(batch, num - done)
            scores = self.scores(x, image_index, first_sample + done, size)
            finite &= torch.isfinite(scores).all()
            counts += torch.bincount(scores.argmax(dim=1), minlength=self.num_classes)
            done += size
        if not bool(finite):
            raise NonFiniteScores(
                f"image {image_index}: {self.stages.describe()} produced NaN/Inf scores; no result written")
        return counts.cpu().numpy()

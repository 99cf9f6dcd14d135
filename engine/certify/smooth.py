"""The smoothed classifier g of Cohen et al. on a Monte Carlo voter: CERTIFY, sequential CERTIFY and
PREDICT of one image, each run as a job by the scheduler (certify/cohen.py, certify/sequential.py)."""

from __future__ import annotations

from typing import Optional

from diffsmooth.engine.certify.blocks import SampleBlocks
from diffsmooth.engine.certify.cohen import ABSTAIN, Certificate, certify_job, check_certify_parameters, only, predict_job
from diffsmooth.engine.certify.monte_carlo import MonteCarloPipeline
from diffsmooth.engine.certify.sequential import SequentialRule, sequential_job
from diffsmooth.engine.errors import UserError


def require_image_index(image_index: Optional[int]) -> int:
    """The image's index keys its noise: without one, every image would draw the same noise."""
    if image_index is None:
        raise UserError("give `image_index`: it keys the image's Monte Carlo noise, so each image needs its own "
                        "(its dataset index); images sharing one draw correlated noise")
    if isinstance(image_index, bool) or not isinstance(image_index, int) or not 0 <= image_index < 2 ** 32:
        raise UserError(f"`image_index` must be an integer in [0, 2^32), got {image_index!r}")
    return image_index


class Smooth:
    """g(x) = the most probable vote of the base classifier under N(x, sigma^2 I), one configuration."""

    ABSTAIN = ABSTAIN

    def __init__(self, pipeline: MonteCarloPipeline, blocks: Optional[SampleBlocks] = None):
        """`blocks`: under torchrun, this rank's share of every image's samples (certify/blocks.py)."""
        if pipeline.num_configs != 1:
            raise ValueError("Smooth certifies one configuration; a sweep's voter runs through engine/runs")
        self.pipeline = pipeline
        self.blocks = blocks
        self.sigma = pipeline.sigma

    def certify(self, x, n0: int, n: int, alpha: float, batch: int, *, image_index: Optional[int] = None) -> Certificate:
        """cA and a radius with P[g(x + delta) = cA for all ||delta|| < radius] >= 1 - alpha, or
        ABSTAIN. Samples 0..n0-1 select, samples n0..n0+n-1 estimate."""
        check_certify_parameters(n0, n, alpha)
        job = certify_job(n0, n, alpha, self.sigma)
        return only(self.pipeline.run_one(x, require_image_index(image_index), job, batch, self.blocks,
                                         f"certify n0={n0} n={n} alpha={alpha!r}"))

    def certify_sequential(self, x, n0: int, rule: SequentialRule, batch: int, *,
                           image_index: Optional[int] = None) -> Certificate:
        """CERTIFY that stops once every radius of `rule` is settled (certify/sequential.py)."""
        if rule.sigma != self.sigma:
            raise UserError(f"the sequential rule is for sigma={rule.sigma}, this classifier smooths at {self.sigma}")
        job = sequential_job(n0, rule)
        return only(self.pipeline.run_one(x, require_image_index(image_index), job, batch, self.blocks,
                                         f"sequential n0={n0} {rule!r}"))

    def predict(self, x, n: int, alpha: float, batch: int, *, image_index: Optional[int] = None) -> int:
        """g(x), or ABSTAIN; wrong with probability at most alpha when it does not abstain."""
        check_certify_parameters(1, n, alpha)
        return only(self.pipeline.run_one(x, require_image_index(image_index), predict_job(n, alpha), batch,
                                         self.blocks, f"predict n={n} alpha={alpha!r}"))

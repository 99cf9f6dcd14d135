"""Stage timers wrapped around the engine from outside (no engine file is edited): timed stages,
a timed noise generator, and the linear extrapolation from a measured small n to the requested n.

On CUDA every timed section synchronises before and after, so the split adds syncs; the
whole-pipeline rate is then measured in a separate pass without timers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections import defaultdict
from typing import Dict, Iterable, Optional

import torch

from diffsmooth.engine.certify import monte_carlo as pipeline_module
from diffsmooth.engine.certify.monte_carlo import MonteCarloPipeline

STAGE_NAMES = ("noise", "denoise", "classify", "vote_count", "statistics", "io")


def synchronize(device) -> None:
    """Wait for queued device work (CUDA only) so a wall-clock reading covers it."""
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


class StageClock:
    """Accumulates seconds per named section; nested sections count only in the outermost one."""

    def __init__(self, device="cpu"):
        self.device = torch.device(device)
        self.seconds: Dict[str, float] = defaultdict(float)
        self.calls: Dict[str, int] = defaultdict(int)
        self._depth = 0

    @contextlib.contextmanager
    def section(self, name: str):
        if self._depth:
            yield
            return
        synchronize(self.device)
        self._depth += 1
        start = time.perf_counter()
        try:
            yield
        finally:
            synchronize(self.device)
            self.seconds[name] += time.perf_counter() - start
            self.calls[name] += 1
            self._depth -= 1

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()


class TimedStage:
    """A Stage with the same interface whose calls are timed under `section`."""

    def __init__(self, stage, clock: StageClock, section: str):
        self.stage = stage
        self.clock = clock
        self.section_name = section
        self.name, self.device, self.precision = stage.name, stage.device, stage.precision

    def __call__(self, *inputs):
        with self.clock.section(self.section_name):
            return self.stage(*inputs)


def timed_stages(stages, clock: StageClock):
    """A copy of BaseClassifierStages whose purify/score are timed as denoise/classify (every other field kept:
    a purifier's own noise draws, timed inside `denoise`, and its purified shape)."""
    return dataclasses.replace(
        stages,
        purify=TimedStage(stages.purify, clock, "denoise") if stages.purify is not None else None,
        score=TimedStage(stages.score, clock, "classify"),
    )


@contextlib.contextmanager
def timed_noise(clock: StageClock):
    """Time every Gaussian draw of the pipeline (smoothing and fresh local noise) as `noise`.

    Swaps the `gaussian_rows` the pipeline module calls for a timed wrapper and restores it after.
    """
    original = pipeline_module.gaussian_rows

    def gaussian_rows(*args, **kwargs):
        with clock.section("noise"):
            return original(*args, **kwargs)

    pipeline_module.gaussian_rows = gaussian_rows
    try:
        yield
    finally:
        pipeline_module.gaussian_rows = original


def make_timed_pipeline(stages, sigma: float, seed: int, clock: StageClock, **pipeline_options):
    """A MonteCarloPipeline over timed stages whose noisy samples (noise + add) are timed as `noise`
    (serial: the timers synchronise anyway; `pipeline_options` e.g. static_batch, compiled_noise)."""
    class TimedPipeline(MonteCarloPipeline):
        def noisy(self, x_rows, rows):
            with clock.section("noise"):
                return super().noisy(x_rows, rows)

    return TimedPipeline(timed_stages(stages, clock), sigma, seed, streams=1, **pipeline_options)


def extrapolate_seconds(per_sample_s: float, per_image_fixed_s: float, n0: int, n: int) -> float:
    """Seconds per certified image at (n0, n): (n0 + n) samples at the measured per-sample cost
    plus the per-image fixed cost (statistics, row write). Linear in samples."""
    return per_sample_s * (int(n0) + int(n)) + per_image_fixed_s


def extrapolation_table(per_sample_s: float, per_image_fixed_s: float, n0: int,
                        ns: Iterable[int]) -> Dict[str, float]:
    """{str(n): seconds per image} for each target n (same n0)."""
    return {str(int(n)): extrapolate_seconds(per_sample_s, per_image_fixed_s, n0, n) for n in ns}


def split_fractions(seconds: Dict[str, float], total: Optional[float] = None) -> Dict[str, float]:
    """Each stage's share of the total (the sum of the stages unless `total` is given)."""
    total = total if total is not None else sum(seconds.values())
    return {k: (v / total if total > 0 else 0.0) for k, v in seconds.items()}

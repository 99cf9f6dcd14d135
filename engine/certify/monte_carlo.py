"""Monte Carlo vote counting: noisy copies of images -> base classifier -> votes.

MonteCarloPipeline is the base classifier as the scheduler's *voter*: it turns a packed batch of
rows (image slot, image index, sample index) into noisy samples (lane 1: noise + denoiser) and
votes (lane 2: classifier, argmax), for one configuration or for every configuration of a sweep
scored on the same denoised batch (the stages say which; stages/base.py). Sample j of image i always gets the same
noise (engine/certify/noise.py), so which samples are counted never depends on the batch size or
on which other images share the batch. The scheduler (certify/scheduler.py) packs the batches and
counts the votes on the device. On CUDA with two streams, the denoiser of batch k+1 runs while the
classifier of batch k runs (engine/certify/lanes.py).

Static batches (the compiled fast path): every batch has the same size, so one compiled graph and
one CUDA graph serve the whole run; only the last batch of a run is padded, and its padded rows
are never counted.
"""

from __future__ import annotations

import sys
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from diffsmooth.engine.certify.agreement import digest64
from diffsmooth.engine.certify.blocks import SampleBlocks
from diffsmooth.engine.certify.jobs import count_job
from diffsmooth.engine.certify.lanes import lanes_for
from diffsmooth.engine.certify.noise import STREAM_LOCAL, STREAM_PURIFY, STREAM_SMOOTHING, NoiseKeys, RowNoise, gaussian_rows
from diffsmooth.engine.certify.scheduler import BatchRows, NonFiniteScores, Scheduler, Work
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.stages.base import BaseClassifierStages
from diffsmooth.engine.stages.eager_fallback import eager_fallback
from diffsmooth.engine.stages.weights import Marks, first_change

__all__ = ["MonteCarloPipeline", "NonFiniteScores", "WeightsChanged", "initial_score_chunks", "divisors"]

# Rough working set of one classifier image, in units of its input size (fp32): a conservative
# stand-in for the activations of ResNet-50/110 at inference; only the first chunk count uses it,
# an out-of-memory error halves the chunk and retries that batch.
ACTIVATION_FACTOR = 64


class WeightsChanged(UserError):
    """The weights of a checked pipeline changed under it: its counts would certify another model."""


def divisors(n: int) -> List[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def initial_score_chunks(batch: int, images_per_sample: int, image_numel: int, device: torch.device,
                         free_fraction: float = 0.5, most: Optional[int] = None) -> int:
    """How many equal pieces the classifier stage's input is cut into so that one call fits in
    `free_fraction` of the free GPU memory (1 on CPU). A divisor of `batch`: shapes stay static.
    `most` (the classifier's own batch, `classifier_batch`): at most that many samples per call instead,
    the fewest pieces that keep to it, on any device."""
    if most is not None:
        return next(k for k in divisors(batch) if batch // k <= most)
    if device.type != "cuda":
        return 1
    free, _ = torch.cuda.mem_get_info(device)
    per_sample = images_per_sample * image_numel * 4 * ACTIVATION_FACTOR
    for k in divisors(batch):
        if (batch // k) * per_sample <= free * free_fraction:
            return k
    return batch


class MonteCarloPipeline:
    """The base classifier on x + sigma * eps, as the scheduler's voter (E = stages.num_configs)."""

    def __init__(self, stages: BaseClassifierStages, sigma: float, seed: int = 0, *,
                 static_batch: bool = False, streams: int = 1, compiled_noise: bool = False,
                 log: Optional[Callable[[str], None]] = None, classifier_batch: Optional[int] = None):
        if not sigma > 0:
            raise UserError(f"sigma must be > 0, got {sigma}")
        self.stages = stages
        self.sigma = float(sigma)
        self.seed = int(seed)
        self.static_batch = bool(static_batch)
        self.compiled_noise = bool(compiled_noise)
        self.lanes = lanes_for(stages.device, streams)
        self.score_chunks: dict = {}            # computed batch size -> pieces per classifier call
        self.classifier_batch = classifier_batch    # most samples per classifier call (None: from free memory)
        self.samples_computed = 0               # noisy samples run through the stages (padding included)
        self._keys = {}
        self.log = log or (lambda message: print(message, file=sys.stderr))
        self.batch_hooks: List[Callable[[int], None]] = []     # told each classified batch's rows (a table times its pilot)
        self._sealed: Optional[Marks] = None     # the stages' weights as the agreement check saw them
        self.settings = ""     # what else determines the votes, as text (runs/assemble.py): ranks compare it (`identity`)
        self._weights_digest: Optional[int] = None

    def identity(self) -> Dict[str, int]:
        """The run's digests that torchrun's ranks compare per image (certify/agreement.py): "settings" (the
        method, its configurations, sigma, seed, precision and `settings`) and "weights" (every stage's, read
        once per seal)."""
        if self._weights_digest is None:
            self._weights_digest = digest64(self.stages.weight_fingerprint())
        precision = self.stages.score.precision
        described = (self.stages.method, self.stages.configs, self.stages.inputs, self.sigma, self.seed, precision,
                     self.settings)
        return {"settings": digest64(repr(described)), "weights": self._weights_digest}

    def seal_weights(self) -> None:
        """Mark the stages' weights as they are now (after the agreement check judged them): from here on
        the scheduler refuses counts read after any of them moved, was re-allocated or written."""
        self._sealed = self.stages.weight_marks()
        self._weights_digest = None         # read again: what the sealed weights hold

    @property
    def sealed(self) -> bool:
        return self._sealed is not None

    def verify_weights(self) -> None:
        """A UserError when a sealed pipeline's weights changed since the seal (stages/weights.py)."""
        if self._sealed is None:
            return
        change = first_change(self._sealed, self.stages.weight_marks())
        if change is not None:
            raise WeightsChanged(f"the models changed under a checked run ({change}) after the agreement check "
                                 f"judged them; the votes read since are refused and no row was written from them. "
                                 f"Nothing may move, replace or write a model's weights while it certifies")

    @property
    def num_classes(self) -> int:
        return self.stages.num_classes

    @property
    def num_configs(self) -> int:
        return self.stages.num_configs

    def keys(self, stream: int) -> NoiseKeys:
        """The noise keys of a stream for the current seed, made once (no per-batch host copies)."""
        if (stream, self.seed) not in self._keys:
            self._keys[(stream, self.seed)] = NoiseKeys(self.seed, stream, self.stages.device)
        return self._keys[(stream, self.seed)]

    @property
    def device(self) -> torch.device:
        return self.stages.device

    def describe(self) -> str:
        parts = [self.stages.describe()]
        if self.static_batch:
            parts.append("static batch")
        if self.lanes.overlapping:
            parts.append("2 streams")
        return "; ".join(parts)

    def describe_config(self, config: int) -> str:
        return self.stages.describe_config(config)

    # -- the two halves of the base classifier ------------------------------------------------

    def produce(self, x_rows: torch.Tensor, rows: BatchRows):
        """The score stage's inputs for a packed batch (lane 1): the noisy samples x + sigma * eps
        and/or their denoised form, one tensor or a tuple in `stages.inputs` order."""
        self.samples_computed += rows.size
        with torch.inference_mode():    # as the purifier's output: a score stage shared by both compiles one graph
            noisy = self.noisy(x_rows, rows)
        denoised = self.purified(noisy, rows) if "denoised" in self.stages.inputs else None
        produced = tuple(noisy if name == "noisy" else denoised for name in self.stages.inputs)
        return produced[0] if len(produced) == 1 else produced

    def purified(self, noisy: torch.Tensor, rows: BatchRows) -> torch.Tensor:
        """The purify stage on the noisy samples, given the rows' own noises when it draws some (a reverse chain)."""
        if not self.stages.purify_noise:
            return self.stages.purify(noisy)
        return self.stages.purify(noisy, RowNoise(self.keys(STREAM_PURIFY), rows.image, rows.sample, self.compiled_noise))

    def noisy(self, x_rows: torch.Tensor, rows: BatchRows) -> torch.Tensor:
        """x + sigma * eps, eps keyed by each row's (image index, sample index)."""
        eps = gaussian_rows(self.keys(STREAM_SMOOTHING), rows.image, rows.sample, x_rows.shape[1:], self.compiled_noise)
        return x_rows + self.sigma * eps

    def classify(self, h, rows: BatchRows):
        """(votes [E, B], finite [E, B]) of the score stage on produced samples (lane 2)."""
        scores = self.scores_of(h, rows)
        votes, finite = scores.argmax(dim=2).T.contiguous(), torch.isfinite(scores).all(dim=2).T.contiguous()
        for hook in self.batch_hooks:
            hook(rows.size)
        return votes, finite

    def scores_of(self, h, rows: BatchRows) -> torch.Tensor:
        """Scores [B, E, K] of the score stage, in equal chunks that fit the GPU; an out-of-memory
        error halves the chunk and retries."""
        parts = h if isinstance(h, tuple) else (h,)
        size = parts[0].shape[0]
        while True:
            pieces = self.score_chunks.get(size)
            if pieces is None:
                per_sample = self.stages.local_noise_shape[0] if self.stages.local_noise_shape else 1
                pieces = initial_score_chunks(size, per_sample, parts[0][0].numel(), parts[0].device,
                                              most=self.classifier_batch)
                self.score_chunks[size] = pieces
            try:
                return self._score_in_pieces(parts, rows, pieces)
            except torch.cuda.OutOfMemoryError:
                more = [d for d in divisors(size) if d >= 2 * pieces]
                if not more:
                    raise UserError(f"the classifier stage does not fit on {parts[0].device} even one sample at a "
                                    f"time; use a smaller `batch` or `m`") from None
                self.stages.score = eager_fallback(self.stages.score, self.log,
                                                   f"out of memory at {size // pieces} samples per call")
                torch.cuda.empty_cache()
                self.score_chunks[size] = more[0]
                self.log(f"# classifier stage out of memory at {size // pieces} samples per call; "
                         f"using {size // more[0]}")

    def _score_in_pieces(self, parts: Tuple[torch.Tensor, ...], rows: BatchRows, pieces: int) -> torch.Tensor:
        step = parts[0].shape[0] // pieces
        out = []
        for p in range(pieces):
            lo = p * step
            inputs = [t[lo:lo + step] for t in parts]
            if self.stages.local_noise_shape is not None:
                part = rows.part(lo, lo + step)
                inputs.append(gaussian_rows(self.keys(STREAM_LOCAL), part.image, part.sample, self.stages.local_noise_shape,
                                            self.compiled_noise))
            scores = self.stages.score(*inputs)
            out.append(scores.unsqueeze(1) if scores.dim() == 2 else scores)
        return out[0] if pieces == 1 else torch.cat(out)

    # -- running jobs -------------------------------------------------------------------------

    def scheduler(self, batch: int, window: Optional[int] = None, blocks: Optional[SampleBlocks] = None) -> Scheduler:
        """The continuous-batching scheduler on this voter; `blocks`: this rank's share of every image's
        samples under torchrun (certify/blocks.py)."""
        return Scheduler(self, batch, window, blocks)

    def run_one(self, x: torch.Tensor, image_index: int, job, batch: int, blocks: Optional[SampleBlocks] = None,
                recipe: str = ""):
        """One image's job to its end (the scheduler with a window of one image); `blocks`: its samples
        shared by torchrun's ranks, who compare `recipe` (what the job asks) before summing them."""
        results = []
        self.scheduler(batch, 1, blocks).run([Work(image_index, x, job, recipe=recipe)],
                                             lambda done: results.append(done.result))
        return results[0]

    def count(self, x: torch.Tensor, image_index: int, first_sample: int, num: int,
              batch: int) -> np.ndarray:
        """Vote counts (int64 [E, K]) over samples first_sample..first_sample+num-1 of image_index."""
        if num < 1 or batch < 1:
            raise UserError(f"need num >= 1 and batch >= 1, got num={num}, batch={batch}")
        return self.run_one(x, image_index, count_job(first_sample, num), batch)

    def count_many(self, images: Sequence[Tuple[int, torch.Tensor]], first_sample: int, num: int, batch: int,
                   window: Optional[int] = None) -> List[np.ndarray]:
        """Vote counts [E, K] of samples first_sample..first_sample+num-1 of each (index, image), packed
        into shared batches as a run packs them (the production path); in the order given."""
        results = {}
        works = [Work(index, x, count_job(first_sample, num), tag=k) for k, (index, x) in enumerate(images)]
        self.scheduler(batch, window).run(works, lambda done: results.__setitem__(done.work.tag, done.result))
        return [results[k] for k in range(len(works))]

    def all_scores(self, x: torch.Tensor, image_index: int, first_sample: int, num: int,
                   batch: int) -> torch.Tensor:
        """Scores [num, E, K] of every sample (serially, for agreement checks), at the batch shape."""
        x = x.to(self.device, torch.float32)
        out = []
        for start in range(first_sample, first_sample + num, batch):
            used = min(batch, first_sample + num - start)
            size = batch if self.static_batch else used
            sample = torch.arange(start, start + size, dtype=torch.int64, device=self.device)
            image = torch.full((size,), image_index, dtype=torch.int64, device=self.device)
            rows = BatchRows(image, image, sample, image, size, [])
            h = self.produce(x.unsqueeze(0).expand(size, *x.shape), rows)
            out.append(self.scores_of(h, rows)[:used])
        return torch.cat(out)

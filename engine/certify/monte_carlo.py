"""Monte Carlo vote counting: noisy copies of one image -> base classifier -> class counts.

Sample j of image i always gets the same noise (engine/certify/noise.py), so which samples are
counted never depends on the batch size. Votes are added on the device with a scatter-add into a
fixed-length vector (no host sync per batch, unlike bincount on CUDA), NaN/Inf are tracked on the
device too, and the host reads both once per call: one sync per CERTIFY pass.

Static batches (the compiled fast path): every batch of a pass has the same size; the last one is
filled with the following sample indices and their votes are dropped, so one compiled graph and
one CUDA graph serve the whole run. On CUDA with two streams, the denoiser of batch k+1 runs
while the classifier of batch k runs (engine/certify/lanes.py).
"""

from __future__ import annotations

import sys
from typing import Callable, List, Optional, Tuple

import numpy as np
import torch

from diffsmooth.engine.backends.base import BaseClassifierStages
from diffsmooth.engine.certify.lanes import double_buffered, lanes_for
from diffsmooth.engine.certify.noise import STREAM_LOCAL, STREAM_SMOOTHING, gaussian
from diffsmooth.engine.errors import UserError

# Rough working set of one classifier image, in units of its input size (fp32): a conservative
# stand-in for the activations of ResNet-50/110 at inference; only the first chunk count uses it,
# an out-of-memory error halves the chunk and retries that batch.
ACTIVATION_FACTOR = 64


def noisy_batch(x: torch.Tensor, sigma: float, seed: int, image_index: int, first_sample: int,
                size: int, compiled_noise: bool = False) -> torch.Tensor:
    """x + sigma * eps for samples first_sample..first_sample+size-1 (fp32, on x's device)."""
    eps = gaussian(seed, STREAM_SMOOTHING, image_index, first_sample, size, x.shape, x.device,
                   compiled=compiled_noise)
    return x.unsqueeze(0) + sigma * eps


def plan_batches(first_sample: int, num: int, batch: int, static: bool) -> List[Tuple[int, int, int]]:
    """(first sample, samples counted, samples computed) per batch of a pass. Static: every batch
    computes `batch` samples (the tail is padded with the next indices); else the tail is short."""
    plan, done = [], 0
    while done < num:
        used = min(batch, num - done)
        plan.append((first_sample + done, used, batch if static else used))
        done += used
    return plan


def divisors(n: int) -> List[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def initial_score_chunks(batch: int, images_per_sample: int, image_numel: int, device: torch.device,
                         free_fraction: float = 0.5) -> int:
    """How many equal pieces the classifier stage's input is cut into so that one call fits in
    `free_fraction` of the free GPU memory (1 on CPU). A divisor of `batch`: shapes stay static."""
    if device.type != "cuda":
        return 1
    free, _ = torch.cuda.mem_get_info(device)
    per_sample = images_per_sample * image_numel * 4 * ACTIVATION_FACTOR
    for k in divisors(batch):
        if (batch // k) * per_sample <= free * free_fraction:
            return k
    return batch


class KeptVotes:
    """The votes of a static batch's padded tail (samples first.. of one image), kept so that the
    next pass of the same image that starts there counts them instead of computing them again.
    Votes are a dict: one vote tensor per sweep configuration; MonteCarloPipeline uses the key "votes"."""

    def __init__(self):
        self._kept = None       # (image tensor as given, image index, first sample, {key: votes}, all finite)

    def keep(self, source: torch.Tensor, image_index: int, first_sample: int, votes: dict, finite) -> None:
        self._kept = (source.detach().clone(), image_index, first_sample, votes, finite)

    def take(self, source: torch.Tensor, image_index: int, first_sample: int, num: int):
        """(votes of samples first_sample..first_sample+used-1 as {key: tensor}, finite, used) for
        this very image, or None. Votes beyond `num` stay kept for the pass after."""
        kept, self._kept = self._kept, None
        if kept is None:
            return None
        kept_source, kept_index, kept_first, votes, finite = kept
        if (kept_index != image_index or kept_first != first_sample or kept_source.shape != source.shape
                or not torch.equal(kept_source, source)):
            return None
        length = len(next(iter(votes.values())))
        used = min(length, num)
        if used < length:
            self._kept = (kept_source, image_index, first_sample + used, {k: v[used:] for k, v in votes.items()},
                          finite)
        return {k: v[:used] for k, v in votes.items()}, finite, used


class NonFiniteScores(UserError):
    """A backend produced NaN/Inf scores: the votes of that pass cannot be trusted."""


class MonteCarloPipeline:
    """Counts votes of the base classifier on x + sigma * eps for a range of sample indices."""

    def __init__(self, stages: BaseClassifierStages, sigma: float, seed: int = 0, *,
                 static_batch: bool = False, streams: int = 1, compiled_noise: bool = False,
                 log: Optional[Callable[[str], None]] = None):
        if not sigma > 0:
            raise UserError(f"sigma must be > 0, got {sigma}")
        self.stages = stages
        self.sigma = float(sigma)
        self.seed = int(seed)
        self.static_batch = bool(static_batch)
        self.compiled_noise = bool(compiled_noise)
        self.lanes = lanes_for(stages.device, streams)
        self.score_chunks: dict = {}            # computed batch size -> pieces per classifier call
        self.samples_computed = 0               # noisy samples run through the stages (padding included)
        self.kept = KeptVotes()
        self.log = log or (lambda message: print(message, file=sys.stderr))

    @property
    def num_classes(self) -> int:
        return self.stages.num_classes

    def describe(self) -> str:
        parts = [self.stages.describe()]
        if self.static_batch:
            parts.append("static batch")
        if self.lanes.overlapping:
            parts.append("2 streams")
        return "; ".join(parts)

    def noisy_batch(self, x: torch.Tensor, image_index: int, first_sample: int, size: int) -> torch.Tensor:
        return noisy_batch(x, self.sigma, self.seed, image_index, first_sample, size, self.compiled_noise)

    # -- the two halves of the base classifier ------------------------------------------------

    def produce(self, x: torch.Tensor, image_index: int, first_sample: int, size: int) -> torch.Tensor:
        """Noisy samples, denoised when the method has a denoiser (lane 1)."""
        self.samples_computed += size
        h = self.noisy_batch(x, image_index, first_sample, size)
        return self.stages.purify(h) if self.stages.purify is not None else h

    def classify(self, h: torch.Tensor, image_index: int, first_sample: int) -> torch.Tensor:
        """Scores [size, K] of the classifier stage on produced samples (lane 2), in equal chunks
        that fit the GPU; an out-of-memory error halves the chunk and retries."""
        size = h.shape[0]
        while True:
            pieces = self.score_chunks.get(size)
            if pieces is None:
                per_sample = self.stages.local_noise_shape[0] if self.stages.local_noise_shape else 1
                pieces = initial_score_chunks(size, per_sample, h[0].numel(), h.device)
                self.score_chunks[size] = pieces
            try:
                return self._score_in_pieces(h, image_index, first_sample, pieces)
            except torch.cuda.OutOfMemoryError:
                more = [d for d in divisors(size) if d >= 2 * pieces]
                if not more:
                    raise UserError(f"the classifier stage does not fit on {h.device} even one sample at a "
                                    f"time; use a smaller --batch or --m") from None
                from diffsmooth.engine.backends.eager_fallback import eager_fallback
                self.stages.score = eager_fallback(self.stages.score, self.log,
                                                   f"out of memory at {size // pieces} samples per call")
                torch.cuda.empty_cache()
                self.score_chunks[size] = more[0]
                self.log(f"# classifier stage out of memory at {size // pieces} samples per call; "
                         f"using {size // more[0]}")

    def _score_in_pieces(self, h: torch.Tensor, image_index: int, first_sample: int, pieces: int) -> torch.Tensor:
        step = h.shape[0] // pieces
        out = []
        for p in range(pieces):
            lo = p * step
            inputs = [h[lo:lo + step]]
            if self.stages.local_noise_shape is not None:
                inputs.append(gaussian(self.seed, STREAM_LOCAL, image_index, first_sample + lo, step,
                                       self.stages.local_noise_shape, h.device, compiled=self.compiled_noise))
            out.append(self.stages.score(*inputs))
        return out[0] if pieces == 1 else torch.cat(out)

    def scores(self, x: torch.Tensor, image_index: int, first_sample: int, size: int) -> torch.Tensor:
        """The base classifier's scores [size, K] on one batch of noisy copies of x."""
        h = self.produce(x.to(self.stages.device, torch.float32), image_index, first_sample, size)
        return self.classify(h, image_index, first_sample)

    # -- a pass -------------------------------------------------------------------------------

    def count(self, x: torch.Tensor, image_index: int, first_sample: int, num: int,
              batch: int) -> np.ndarray:
        """Vote counts (int64 [K]) over samples first_sample..first_sample+num-1 of image_index.

        With static batches the padded tail's votes are real samples (the next indices): they are
        kept, and a following call on the same image that starts at those indices (CERTIFY's
        estimation after its selection, or the next look of a sequential run) counts them instead of
        computing them again."""
        if num < 1 or batch < 1:
            raise UserError(f"need num >= 1 and batch >= 1, got num={num}, batch={batch}")
        device = self.stages.device
        source = x
        x = x.to(device=device, dtype=torch.float32)
        counts = torch.zeros(self.num_classes, dtype=torch.int64, device=device)
        finite = torch.ones((), dtype=torch.bool, device=device)
        ones = torch.ones(max(batch, num), dtype=torch.int64, device=device)
        start_sample, remaining = first_sample, num
        kept = self.kept.take(source, image_index, first_sample, num)
        if kept is not None:
            votes, kept_finite, used = kept
            counts.scatter_add_(0, votes["votes"], ones[:used])
            finite.logical_and_(kept_finite)
            start_sample, remaining = first_sample + used, num - used
        plan = plan_batches(start_sample, remaining, batch, self.static_batch) if remaining > 0 else []
        lanes = self.lanes
        in_flight = {}
        lanes.begin()
        for step, k in double_buffered(len(plan)):
            start, used, computed = plan[k]
            if step == "produce":
                with lanes.producer():
                    h = self.produce(x, image_index, start, computed)
                    in_flight[k] = (h, lanes.handoff([h]))
                continue
            h, token = in_flight.pop(k)
            with lanes.consumer():
                lanes.accept(token, [h])
                scores = self.classify(h, image_index, start)
                votes = scores.argmax(dim=1)
                finite.logical_and_(torch.isfinite(scores[:used]).all())
                counts.scatter_add_(0, votes[:used], ones[:used])
                if computed > used:
                    self.kept.keep(source, image_index, start + used, {"votes": votes[used:]},
                                   torch.isfinite(scores[used:]).all())
        lanes.end()
        if not bool(finite):
            raise NonFiniteScores(
                f"image {image_index}: {self.stages.describe()} produced NaN/Inf scores; no result written")
        return counts.cpu().numpy()

    def all_scores(self, x: torch.Tensor, image_index: int, first_sample: int, num: int,
                   batch: int) -> torch.Tensor:
        """Scores [num, K] of every sample (serially, for agreement checks), at the pass's batch shape."""
        x = x.to(self.stages.device, torch.float32)
        out = []
        for start, used, computed in plan_batches(first_sample, num, batch, self.static_batch):
            h = self.produce(x, image_index, start, computed)
            out.append(self.classify(h, image_index, start)[:used])
        return torch.cat(out)

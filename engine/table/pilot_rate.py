"""The rate the main phase's seconds are predicted at, read from the pilot's own batches: no sample
is drawn for timing alone.

Each batch is timed from the end of the batch before it to its own end (on CUDA after a device
sync), so the planning and bookkeeping between batches count as they will in the main phase; the
run's first batch, which may compile or capture graphs, only starts the clock.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator, List, Optional, Tuple

import torch

MIN_FULL_BATCHES = 2        # full batches needed to take their rate; else the largest batches' rate


class BatchClock:
    """Told each classified batch's rows (MonteCarloPipeline.batch_hooks); keeps (rows, seconds)."""

    def __init__(self, device: torch.device, clock=time.perf_counter):
        self.device, self.clock = torch.device(device), clock
        self.batches: List[Tuple[int, float]] = []
        self._last: Optional[float] = None

    def __call__(self, rows: int) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)         # the batch's kernels, not their launch
        now = self.clock()
        if self._last is not None:
            self.batches.append((int(rows), now - self._last))
        self._last = now

    def rate(self, batch: int) -> Optional[float]:
        """Samples per second of full batches (`batch` rows) when at least MIN_FULL_BATCHES were
        timed; else of the largest timed batches (at least half the largest size: a lower bound for
        full ones, since a batch's fixed costs are shared by fewer rows); None when none was timed."""
        if not self.batches:
            return None
        full = [(r, s) for r, s in self.batches if r >= batch]
        if len(full) < MIN_FULL_BATCHES:
            largest = max(r for r, _ in self.batches)
            full = [(r, s) for r, s in self.batches if 2 * r >= largest]
        seconds = sum(s for _, s in full)
        return sum(r for r, _ in full) / seconds if seconds > 0 else None

    def describe(self, batch: int) -> str:
        full = sum(1 for r, _ in self.batches if r >= batch)
        if full >= MIN_FULL_BATCHES:
            return f"{full} full batches of the pilot"
        largest = max((r for r, _ in self.batches), default=0)
        return f"the pilot's largest batches ({largest} of {batch} rows: a lower bound)"


@contextmanager
def timed_batches(voter, enabled: bool = True) -> Iterator[Optional[BatchClock]]:
    """A BatchClock on `voter`'s batches for the length of the block (None when not `enabled`)."""
    if not enabled:
        yield None
        return
    clock = BatchClock(voter.device)
    voter.batch_hooks.append(clock)
    try:
        yield clock
    finally:
        voter.batch_hooks.remove(clock)

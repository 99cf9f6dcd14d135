"""Continuous batching of certification: many images' Monte Carlo samples packed into every batch.

Images are requests and samples are tokens, as in an LLM server. Each image runs a *job* (a plain
Python generator, certify/jobs.py) that yields `Request`s for sample ranges and is sent their vote
counts [configurations, classes]. The scheduler keeps a window of images in flight and fills
each batch with the next pending samples of several of them: a batch is a list of segments
(image slot, count row, first sample, count). Images join when a batch has room and leave when
their job returns. When no image can join (the end of a run, or every image waiting for its votes),
a static batch's free rows compute *look-ahead* samples: the next sample indices of images in
flight, whose votes are kept and counted if the image's next request starts there.

Why the rows do not depend on the packing: the noise of a sample is keyed by (seed, stream, image
index, sample index) and drawn per row (certify/noise.py), each row's votes are scatter-added into
the count row of its own request, and a job sees exactly the counts of the samples it asked for.
The host reads counts only when a request completes: at most one sync per batch.

Under torchrun (`blocks`, certify/blocks.py) every rank runs every image's job and computes its own
samples of each request (sample s is rank s mod ranks's): the scheduler then plans in the rank's own
sample order, so look-ahead works as in one process. The ranks meet once per batch: the images every
rank has completed get their counts summed and sent to their jobs, the same on every rank, and new
images join the window only there, so every rank holds the same images in the same slots.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, Dict, Generator, Iterable, Iterator, List, Optional, Tuple

import numpy as np
import torch

from diffsmooth.engine.certify.agreement import FIELDS, Identity, RankFailed, RanksDisagree, mismatch_line
from diffsmooth.engine.certify.blocks import NO_STOP, TERMINATE, SampleBlocks
from diffsmooth.engine.certify.jobs import Request
from diffsmooth.engine.certify.noise import check_indices
from diffsmooth.engine.errors import Terminated, UserError, first_line

# Images in flight are kept on the device; this bounds their memory (a 224x224 RGB image is 0.6 MB).
WINDOW_BYTES = 512 * 2 ** 20


def default_window(batch: int, image_numel: int) -> int:
    """Most images in flight: enough to fill a batch with one sample each while as many wait for
    their votes (2 * batch + 2), at most WINDOW_BYTES of fp32 images."""
    return max(2, min(2 * int(batch) + 2, WINDOW_BYTES // (4 * max(1, int(image_numel)))))


@dataclass
class Work:
    """One image to run: its dataset index (which keys its noise), the image, its job, a tag handed back
    with the result, and its job's recipe."""

    index: int
    image: torch.Tensor
    job: Generator
    tag: Any = None
    recipe: str = ""        # what the job asks (n0, n, alpha, looks, its start): ranks compare it (certify/agreement.py)


@dataclass
class Finished:
    """A job's result with the image's share of the compute time and the samples it counted."""

    work: Work
    result: Any
    seconds: float
    samples: int


@dataclass
class SchedulerStats:
    batches: int = 0
    syncs: int = 0
    samples_computed: int = 0       # rows run through the stages, padding included
    samples_counted: int = 0        # rows whose votes a request counted (this rank's, under torchrun)
    meetings: int = 0               # torchrun: the ranks' meetings (one per batch) and the seconds spent in them
    meeting_seconds: float = 0.0    # (waiting for the slowest rank included)
    max_window: int = 0
    stopped: bool = False           # a stop was asked (under torchrun: on any rank, agreed at a meeting)
    seconds: float = 0.0            # wall time shared out to the images (the run up to its last result)

    @property
    def overhead(self) -> float:
        """Samples computed per sample counted (1.0: no padding)."""
        return self.samples_computed / max(1, self.samples_counted)


@dataclass
class BatchRows:
    """One packed batch, row by row, on the device: which window slot holds the image, its dataset
    index and sample index (the noise keys), and the count row its vote goes to."""

    slot: torch.Tensor
    image: torch.Tensor
    sample: torch.Tensor
    count_row: torch.Tensor
    size: int
    segments: List[Tuple["_Slot", Optional["_Pending"], int, int]]   # (slot, request or None: look-ahead, first, rows)

    def tensors(self) -> List[torch.Tensor]:
        """The device tensors of the batch's keys (handed from the producer lane to the consumer lane)."""
        return [self.slot, self.image, self.sample, self.count_row]

    def part(self, lo: int, hi: int) -> "BatchRows":
        """Rows lo..hi-1 (for chunked classifier calls)."""
        return BatchRows(self.slot[lo:hi], self.image[lo:hi], self.sample[lo:hi], self.count_row[lo:hi],
                         hi - lo, [])


@dataclass
class _Pending:
    """A request of one image: its count row, the samples this process computes for it (lo..lo+num-1 in
    its own sample order: all of them in one process, its share under torchrun) and how far they have
    been planned and counted."""

    request: Request
    row: int
    lo: int
    num: int
    planned: int = 0
    counted: int = 0

    @property
    def complete(self) -> bool:
        return self.counted == self.num


@dataclass
class _Slot:
    """An image in flight: its window slot, job, and the requests of the job's current ask."""

    number: int
    work: Work
    ask_is_tuple: bool = False
    pending: List[_Pending] = field(default_factory=list)
    seconds: float = 0.0
    counted: int = 0
    rows_since_mark: int = 0
    frontier: int = 0               # the first sample index no request or look-ahead has planned
    ahead_first: int = 0            # look-ahead votes kept: samples ahead_first.. (contiguous chunks)
    ahead: List[Tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)   # (votes [E, n], finite [E, n])

    @property
    def ahead_count(self) -> int:
        return sum(v.shape[1] for v, _ in self.ahead)


class NonFiniteScores(UserError):
    """A backend produced NaN/Inf scores: the votes of that image cannot be trusted."""


class MiscountedSamples(UserError):
    """A request's counts do not hold one vote per sample: samples counted twice or lost."""


class Scheduler:
    """Runs jobs on a voter (certify/monte_carlo.py) with continuous batching.

    The voter provides `device`, `num_classes`, `num_configs` (E), `static_batch`, `lanes`,
    `produce(x_rows, rows)`, `classify(h, rows) -> (votes [E, B], finite [E, B])`, `describe_config(e)`
    and `verify_weights()` (raises when what it computes with changed under the run: no result read
    after the change is handed out); a job is sent the counts [E, K] of each request."""

    TRASH = 0       # count row 0 takes the votes of padded rows and is never read

    def __init__(self, voter, batch: int, window: Optional[int] = None, blocks: Optional[SampleBlocks] = None):
        if batch < 1:
            raise UserError(f"batch must be >= 1, got {batch}")
        if window is not None and window < 1:
            raise UserError(f"the window of images in flight must be >= 1, got {window}")
        self.voter = voter
        self.batch = int(batch)
        self.window = window
        self.blocks = blocks
        self._end = 2 ** 32 if blocks is None else blocks.local(2 ** 32)      # the first sample index not allowed
        self.stats = SchedulerStats()
        self.device = voter.device
        self._x: Optional[torch.Tensor] = None          # [window, *image shape] images in flight
        self._counts: Optional[torch.Tensor] = None     # [E, rows, K] votes per request
        self._bad: Optional[torch.Tensor] = None        # [E, rows] non-finite scores per request
        self._free_rows: List[int] = []
        self._free_slots: List[int] = []
        self._ones = torch.ones(self.batch, dtype=torch.int64, device=self.device)

    # -- memory for the window ---------------------------------------------------------------

    def _allocate(self, image: torch.Tensor) -> None:
        """The window's images live on the producer lane, the count rows on the consumer lane (each
        tensor is made and used on one lane; what crosses is handed off, see `run`)."""
        cap = self.window or default_window(self.batch, image.numel())
        self.window = cap
        with self.voter.lanes.producer():
            self._x = torch.zeros((cap, *image.shape), dtype=torch.float32, device=self.device)
        self._free_slots = list(range(cap - 1, -1, -1))
        with self.voter.lanes.consumer():
            self._grow_rows(2 * cap + 1)

    def _grow_rows(self, rows: int) -> None:
        e, k = self.voter.num_configs, self.voter.num_classes
        counts = torch.zeros((e, rows, k), dtype=torch.int64, device=self.device)
        bad = torch.zeros((e, rows), dtype=torch.int64, device=self.device)
        old = 0 if self._counts is None else self._counts.shape[1]
        if old:
            counts[:, :old] = self._counts
            bad[:, :old] = self._bad
        self._counts, self._bad = counts, bad
        self._free_rows += list(range(rows - 1, max(old, self.TRASH + 1) - 1, -1))

    def _take_row(self) -> int:
        if not self._free_rows:
            with self.voter.lanes.consumer():
                self._grow_rows(2 * self._counts.shape[1])
        return self._free_rows.pop()

    # -- images joining and leaving ----------------------------------------------------------

    def _admit(self, work: Work, active: Dict[int, _Slot], on_finish) -> bool:
        """Start the image's job; an image whose job asks for nothing finishes at once. Whether it joined."""
        if self._x is None:
            self._allocate(work.image)
        if tuple(work.image.shape) != tuple(self._x.shape[1:]):
            raise UserError(f"image {work.index} has shape {tuple(work.image.shape)}, the run's images have "
                            f"{tuple(self._x.shape[1:])}")
        slot = _Slot(self._free_slots.pop(), work)
        try:
            ask = next(work.job)
        except StopIteration as done:
            self._free_slots.append(slot.number)
            on_finish(Finished(work, done.value, 0.0, 0))
            return False
        image = work.image.detach().to(torch.float32)
        if self.device.type == "cuda":
            image = image.pin_memory()
        with self.voter.lanes.producer():
            self._x[slot.number].copy_(image, non_blocking=True)
        self._set_ask(slot, ask)
        active[slot.number] = slot
        self.stats.max_window = max(self.stats.max_window, len(active))
        return True

    def _set_ask(self, slot: _Slot, ask) -> None:
        slot.ask_is_tuple = not isinstance(ask, Request)
        requests = tuple(ask) if slot.ask_is_tuple else (ask,)
        for r in requests:
            if not isinstance(r, Request) or r.num < 1:
                raise ValueError(f"a job asked for {r!r}: requests need num >= 1")
            check_indices(slot.work.index, r.first, r.num)
        slot.pending = [self._pending(r) for r in requests]
        if slot.ahead and slot.ahead_first != slot.pending[0].lo:
            slot.ahead = []                              # the job did not continue where the look-ahead did
        self._serve_from_ahead(slot)
        slot.frontier = max([slot.frontier] + [p.lo + p.num for p in slot.pending])

    def _pending(self, request: Request) -> _Pending:
        """The request's count row and this process's samples of it (its own, in its order, under torchrun)."""
        if self.blocks is None:
            return _Pending(request, self._take_row(), request.first, request.num)
        lo = self.blocks.local(request.first)
        return _Pending(request, self._take_row(), lo, self.blocks.local(request.first + request.num) - lo)

    def _serve_from_ahead(self, slot: _Slot) -> None:
        """Count kept look-ahead votes for requests that start where they do (nothing planned yet)."""
        for p in slot.pending:
            if not slot.ahead or p.planned or slot.ahead_first != p.lo or not p.num:
                continue
            votes, finite = [torch.cat(parts, dim=1) for parts in zip(*slot.ahead)]
            used = min(p.num, votes.shape[1])
            self._add_votes(p.row, votes[:, :used], finite[:, :used])
            p.planned = p.counted = used
            slot.counted += used
            self.stats.samples_counted += used
            rest = (votes[:, used:], finite[:, used:])
            slot.ahead = [rest] if rest[0].shape[1] else []
            slot.ahead_first += used

    def _add_votes(self, row: int, votes: torch.Tensor, finite: torch.Tensor) -> None:
        """Scatter-add votes [E, n] (and their non-finite flags) into count row `row`."""
        e, rows, k = self._counts.shape
        flat_rows = (torch.arange(e, device=self.device) * rows + row).unsqueeze(1).expand_as(votes)
        self._counts.view(-1).scatter_add_(0, (flat_rows * k + votes).reshape(-1),
                                            votes.new_ones(votes.numel()))      # kept votes may span batches
        self._bad.view(-1).scatter_add_(0, flat_rows[:, 0].contiguous(), (~finite).sum(dim=1))

    # -- one batch -----------------------------------------------------------------------------

    def _plan(self, active: Dict[int, _Slot], admit: Callable[[], bool]) -> Optional[BatchRows]:
        """Fill one batch with the next pending samples, oldest image first, admitting new images
        while there is room; None when there is nothing to compute."""
        space, segments = self.batch, []

        def take_from(slot: _Slot) -> None:
            nonlocal space
            for p in slot.pending:
                if space == 0:
                    return
                rows = min(p.num - p.planned, space)
                if rows > 0:
                    segments.append((slot, p, p.lo + p.planned, rows))
                    p.planned += rows
                    space -= rows

        for slot in list(active.values()):
            take_from(slot)
        while space > 0 and admit():
            take_from(next(reversed(active.values())))
        if not segments:
            return None
        if self.voter.static_batch and space > 0:
            space = self._look_ahead(list(active.values()), space, segments)
        return self._rows(segments, space if self.voter.static_batch else 0)

    def _look_ahead(self, slots: List[_Slot], space: int, segments: list) -> int:
        """Spend a static batch's free rows on the next samples of the images in flight (shared
        evenly); returns the rows still free (padding)."""
        share = -(-space // len(slots))
        for slot in slots:
            rows = min(share, space, self._end - slot.frontier)
            if rows > 0:
                segments.append((slot, None, slot.frontier, rows))
                slot.frontier += rows
                space -= rows
        return space

    def _rows(self, segments, padding: int) -> BatchRows:
        """The batch's per-row keys as one int64 block, copied to the device without a host sync."""
        size = sum(rows for *_, rows in segments) + padding
        block = np.empty((4, size), dtype=np.int64)
        at = 0
        for slot, p, first, rows in segments:
            block[0, at:at + rows] = slot.number
            block[1, at:at + rows] = slot.work.index
            block[2, at:at + rows] = np.arange(first, first + rows)
            block[3, at:at + rows] = p.row if p is not None else self.TRASH
            at += rows
        if self.blocks is not None:                     # this rank's own order -> the samples' indices
            block[2, :at] = self.blocks.global_samples(block[2, :at])
        if padding:                                     # any valid keys; votes go to the trash row
            block[0, at:] = segments[0][0].number
            block[1, at:] = segments[0][0].work.index
            block[2, at:] = np.arange(padding)
            block[3, at:] = self.TRASH
        host = torch.from_numpy(block)
        if self.device.type == "cuda":
            device_block = host.pin_memory().to(self.device, non_blocking=True)
        else:
            device_block = host.to(self.device, copy=True)     # an op on every device: lane checks see it
        return BatchRows(device_block[0], device_block[1], device_block[2], device_block[3], size, segments)

    def _produce(self, rows: BatchRows):
        self.stats.batches += 1
        self.stats.samples_computed += rows.size
        x_rows = self._x.index_select(0, rows.slot)
        return self.voter.produce(x_rows, rows)

    def _count(self, h, rows: BatchRows):
        """Scatter-add each row's vote into its request's count row, per configuration; returns the
        votes and finite flags [E, B] (look-ahead rows keep theirs)."""
        votes, finite = self.voter.classify(h, rows)
        e, slots, k = self._counts.shape
        offsets = (torch.arange(e, device=self.device) * slots).unsqueeze(1)       # cached by the allocator
        flat_rows = offsets + rows.count_row.unsqueeze(0)                          # [E, B]
        self._counts.view(-1).scatter_add_(0, (flat_rows * k + votes).view(-1), self._ones[:rows.size].repeat(e))
        self._bad.view(-1).scatter_add_(0, flat_rows.view(-1), (~finite).view(-1).to(torch.int64))
        return votes, finite

    # -- the run -------------------------------------------------------------------------------

    def run(self, works: Iterable[Work], on_finish: Callable[[Finished], None],
            stop: Callable[[], bool] = lambda: False) -> SchedulerStats:
        """Run every work item's job to its end; on_finish gets each result as its image completes
        (completion order). After stop() turns true no new image joins; those in flight finish (TERMINATE under
        torchrun: every rank drops them and raises Terminated). Under torchrun a rank's stop() reaches every rank
        at the next meeting, so all ranks admit the same images, and stats.stopped is the agreed stop."""
        self.voter.verify_weights()             # weights changed before the run: refused before they compute
        if self.blocks is not None:
            return self._run_shared(iter(works), on_finish, stop)
        source: Iterator[Work] = iter(works)
        active: Dict[int, _Slot] = {}
        exhausted = False
        depth = 2 if self.voter.lanes.overlapping else 1     # batches in flight: produce k+1 before consuming k
        in_flight: Deque[Tuple[BatchRows, Any, Any]] = deque()
        lanes = self.voter.lanes
        mark = time.perf_counter()

        def admit() -> bool:
            nonlocal exhausted
            while not exhausted and not stop() and len(active) < (self.window or 2 ** 62):
                try:
                    work = next(source)
                except StopIteration:
                    exhausted = True
                    return False
                if self._admit(work, active, on_finish):
                    return True
            return False

        def complete(rows: BatchRows, votes, finite) -> None:
            nonlocal mark
            mark = self._complete(rows, votes, finite, active, on_finish, mark)

        lanes.begin()
        try:
            while self._step(active, in_flight, depth, admit, complete):
                pass
        finally:
            lanes.end()
        self.stats.stopped = bool(stop())
        return self.stats

    def _run_shared(self, source: Iterator[Work], on_finish: Callable[[Finished], None],
                    stop: Callable[[], int]) -> SchedulerStats:
        """`run` under torchrun: the ranks first agree on the window's size, the settings and the weights; then
        each loop computes (and counts) at most one batch of this rank's samples and the ranks meet
        (certify/blocks.py). The meeting compares the identity of every image that joined since the last one
        (certify/agreement.py) before any vote of it is summed, says whether a rank failed (every rank then stops
        with the failing rank's line) and agrees on stops; the images every rank has completed then get their
        summed counts, the same on every rank. Images join the window only after a meeting, up to the window's
        size, so every rank holds the same images in the same slots. The loop ends when no rank has an image or
        a batch."""
        active: Dict[int, _Slot] = {}
        exhausted = False
        stopping = NO_STOP
        depth = 2 if self.voter.lanes.overlapping else 1
        in_flight: Deque[Tuple[BatchRows, Any, Any]] = deque()
        lanes = self.voter.lanes
        mark = time.perf_counter()
        failure: Optional[BaseException] = None
        done_slots: List[_Slot] = []
        try:
            run_identity = self.voter.identity()
            first = next(source, None)
            source = itertools.chain([first], source) if first is not None else iter(())
            window = self.window or (default_window(self.batch, first.image.numel()) if first is not None else 0)
        except Exception as exc:            # noqa: BLE001 - re-raised after the first meeting, on every rank
            failure, run_identity, window = exc, {"settings": 0, "weights": 0}, 0
        self.window = window or self.window
        failed, differs = self.blocks.start(window, run_identity, failure is not None, self.device)
        self._refuse_on_failure(failed, failure)
        if differs is not None:
            held = self.blocks.gather(window if differs == "window" else run_identity[differs])
            raise RanksDisagree(mismatch_line(differs, held, None))
        lanes.begin()
        try:
            while True:
                joined: List[Identity] = []
                try:                # this rank's own work: what it raises reaches every rank at the meeting below
                    if done_slots:
                        mark, _ = self._deliver(done_slots, active, on_finish, mark)
                    while not exhausted and not stopping and len(active) < window:
                        work = next(source, None)
                        if work is None:
                            exhausted = True
                        elif self._admit(work, active, on_finish):
                            joined.append(Identity.of(work.index, work.image, work.recipe))
                    self._step(active, in_flight, depth, lambda: False,
                               lambda rows, votes, finite: self._book(rows, votes, finite, active))
                except Exception as exc:        # noqa: BLE001 - re-raised after the meeting, on every rank
                    failure = failure or exc
                done_slots = []
                with lanes.consumer():
                    started = time.perf_counter()
                    waiting = np.zeros(window, dtype=np.int64)
                    if failure is None:
                        for slot in active.values():
                            waiting[slot.number] = not all(p.complete for p in slot.pending)
                    met = self.blocks.step(waiting, bool(in_flight), int(stop()), failure is not None, joined,
                                           self.device)
                    self.stats.meetings += 1
                    self.stats.meeting_seconds += time.perf_counter() - started
                self._refuse_on_failure(met.failed, failure)
                self._refuse_on_mismatch(met.mismatch, joined)
                stopping = max(stopping, met.stop)
                if met.stop == TERMINATE:
                    self.stats.stopped = True
                    raise Terminated("terminated (SIGTERM) on a rank: the images in flight were dropped; every "
                                     "finished row is kept: run the same command again to continue")
                done_slots = [slot for slot in active.values() if met.ready[slot.number]]
                if not done_slots and not active and not met.busy and (exhausted or stopping):
                    break
        finally:
            lanes.end()
        self.stats.stopped = bool(stopping)
        return self.stats

    def _step(self, active: Dict[int, _Slot], in_flight: Deque, depth: int, admit: Callable[[], bool],
              book: Callable) -> bool:
        """Plan and produce the next batch (admitting images through `admit`; the batch's keys are copied on the
        lane that reads them first), and count the oldest batch in flight once `depth` are, or when nothing new
        was planned: `book(rows, votes, finite)` takes it. Whether anything was planned or counted."""
        lanes = self.voter.lanes
        with lanes.producer():
            rows = self._plan(active, admit)
            if rows is not None:
                h = self._produce(rows)
                in_flight.append((rows, h, lanes.handoff(_tensors(h) + rows.tensors())))
        if not in_flight:
            return False
        if rows is None or len(in_flight) >= depth:
            done, h, token = in_flight.popleft()
            with lanes.consumer():
                lanes.accept(token, _tensors(h) + done.tensors())
                book(done, *self._count(h, done))
        return True

    def _refuse_on_failure(self, failed: bool, failure: Optional[BaseException]) -> None:
        """A rank failed: it raises its own error, every other rank the failing rank's line."""
        if not failed:
            return
        lines = self.blocks.gather(None if failure is None else f"{type(failure).__name__}: {first_line(failure)}")
        if failure is not None:
            raise failure
        rank = next(r for r, line in enumerate(lines) if line is not None)
        raise RankFailed(f"rank {rank} failed ({lines[rank]}); every rank stopped, no votes of the images in flight "
                         f"were summed: finished rows are kept, run the same command again to continue")

    def _refuse_on_mismatch(self, field: Optional[str], joined: List[Identity]) -> None:
        """Images that joined and differ between ranks in `field`: every rank stops with the same line naming
        the first such image and which ranks hold what."""
        if field is None:
            return
        column = FIELDS.index(field)
        held = self.blocks.gather([(i.digests[column], i.index) for i in joined])
        position = next(p for p in range(max(len(h) for h in held))
                        if len({h[p] if p < len(h) else None for h in held}) > 1)
        values = [h[position][0] if position < len(h) else None for h in held]
        indices = [h[position][1] if position < len(h) else None for h in held]
        raise RanksDisagree(mismatch_line(field, values, indices))

    def _complete(self, rows: BatchRows, votes, finite, active: Dict[int, _Slot], on_finish, mark: float) -> float:
        """Book the consumed rows (keep look-ahead votes); read the counts of requests that completed
        (a host sync), send them to their jobs, and finish the images whose jobs return; repeat while
        new requests are served whole from look-ahead votes. Returns the new time mark."""
        ready = self._book(rows, votes, finite, active)
        while ready:
            mark, ready = self._deliver(ready, active, on_finish, mark)
        return mark

    def _book(self, rows: BatchRows, votes, finite, active: Dict[int, _Slot]) -> List[_Slot]:
        """Count the consumed rows into their requests (keep look-ahead votes); the slots whose every
        request is now complete."""
        ready, at = [], 0
        for slot, p, first, n in rows.segments:
            slot.rows_since_mark += n
            if p is not None:
                p.counted += n
                slot.counted += n
                self.stats.samples_counted += n
            elif active.get(slot.number) is slot:
                self._keep_ahead(slot, first, votes[:, at:at + n], finite[:, at:at + n])
            at += n
            if active.get(slot.number) is slot and all(q.complete for q in slot.pending) and slot not in ready:
                ready.append(slot)
        return ready

    def _keep_ahead(self, slot: _Slot, first: int, votes: torch.Tensor, finite: torch.Tensor) -> None:
        """Keep look-ahead votes that continue the slot's kept ones and lie beyond what its requests
        have planned; serve a waiting request that starts there."""
        planned_end = max((p.lo + p.planned for p in slot.pending), default=0)
        if first < planned_end:
            return
        if slot.ahead and first != slot.ahead_first + slot.ahead_count:
            return
        if not slot.ahead:
            slot.ahead_first = first
        slot.ahead.append((votes, finite))
        self._serve_from_ahead(slot)

    def _deliver(self, ready: List[_Slot], active: Dict[int, _Slot], on_finish, mark: float):
        """Read the counts of the ready slots' requests (one host sync), send them to their jobs;
        returns (new time mark, slots whose next requests are already complete)."""
        read = [p.row for slot in ready for p in slot.pending]
        column_of = {row: column for column, row in enumerate(read)}
        index = torch.from_numpy(np.asarray(read, dtype=np.int64))
        index = index.pin_memory().to(self.device, non_blocking=True) if self.device.type == "cuda" else index
        if self.blocks is None:
            counts = self._counts.index_select(1, index).cpu().numpy()        # the host sync
            bad = self._bad.index_select(1, index).cpu().numpy()
        else:                               # every rank's samples of these requests, summed
            counts, bad = self.blocks.merge(self._counts.index_select(1, index), self._bad.index_select(1, index))
        self._counts.index_fill_(1, index, 0)
        self._bad.index_fill_(1, index, 0)
        self.stats.syncs += 1
        now = time.perf_counter()
        self._share_time(active, now - mark)
        again, verified = [], False
        for slot in ready:
            got = []
            for p in slot.pending:
                column = column_of[p.row]
                if bad[:, column].any():
                    configs = [self.voter.describe_config(e) for e in np.flatnonzero(bad[:, column])]
                    raise NonFiniteScores(f"image {slot.work.index}: {', '.join(configs)} produced NaN/Inf "
                                          f"scores; no result written for it")
                if (counts[:, column, :].sum(axis=1) != p.request.num).any():
                    raise MiscountedSamples(f"image {slot.work.index}: samples {p.request.first}.."
                                            f"{p.request.first + p.request.num - 1} hold "
                                            f"{counts[:, column, :].sum(axis=1).max()} votes, not {p.request.num}: "
                                            f"samples were counted twice or lost (do all ranks run the same command?); "
                                            f"no result written for it")
                got.append(counts[:, column, :])
                self._free_rows.append(p.row)
            try:
                ask = slot.work.job.send(tuple(got) if slot.ask_is_tuple else got[0])
            except StopIteration as finished:
                if not verified:        # once per read that finishes an image: its counts came from the sealed weights
                    self.voter.verify_weights()
                    verified = True
                del active[slot.number]
                self._free_slots.append(slot.number)
                on_finish(Finished(slot.work, finished.value, slot.seconds, slot.counted))
                continue
            self._set_ask(slot, ask)
            if all(q.complete for q in slot.pending):
                again.append(slot)
        return now, again

    def _share_time(self, active: Dict[int, _Slot], seconds: float) -> None:
        """Split the wall time since the last read over the images by their rows in it."""
        total = sum(s.rows_since_mark for s in active.values())
        self.stats.seconds += seconds if total else 0.0
        for s in active.values():
            if total:
                s.seconds += seconds * s.rows_since_mark / total
            s.rows_since_mark = 0


def _tensors(h) -> List[torch.Tensor]:
    """The tensors a produced batch hands across lanes (one, or a tuple: noisy and denoised samples)."""
    return [t for t in (h if isinstance(h, tuple) else (h,)) if isinstance(t, torch.Tensor)]

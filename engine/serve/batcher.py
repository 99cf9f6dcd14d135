"""One continuous-batching scheduler per model for every request in flight: a worker thread feeds the images of
all requests, as they arrive, into the same scheduler (certify/scheduler.py), so their samples share batches."""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable, Deque, Dict, List, Optional

import numpy as np
import torch

from diffsmooth.engine.certify.cohen import certify_job, only, predict_job
from diffsmooth.engine.certify.jobs import Request
from diffsmooth.engine.certify.scheduler import BatchRows, Finished, Scheduler, Work
from diffsmooth.engine.certify.sequential import sequential_job
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.runs.request import sequential_rule
from diffsmooth.engine.serve.limits import Busy
from diffsmooth.engine.serve.noise_key import IndexCounter
from diffsmooth.engine.serve.protocol import Asked

CANCELLED = object()        # what a job returns once its request's client is gone


@dataclass
class Ticket:
    """One request's images in the worker: a result per image, the future its handler waits on, and whether its
    client gave up (its images then stop at their next look and free their samples)."""

    count: int
    first_index: int
    future: Future = field(default_factory=Future)
    results: List = field(default_factory=list)
    cancelled: bool = False
    left: int = 0

    def __post_init__(self):
        self.results = [None] * self.count
        self.left = self.count

    def finish(self, position: int, result) -> None:
        self.results[position] = result
        self.left -= 1
        if self.left == 0 and not self.future.done():
            self.future.set_result(self.results)

    def fail(self, exc: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(exc)


def job_for(asked: Asked, sigma: float):
    """The job of one image: PREDICT, sequential CERTIFY over `radii` (the default) or Cohen's CERTIFY."""
    if asked.mode == "predict":
        return predict_job(asked.n, asked.alpha)
    if asked.sequential:
        return sequential_job(asked.n0, sequential_rule(list(asked.radii), sigma, asked.alpha, asked.n))
    return certify_job(asked.n0, asked.n, asked.alpha, sigma)


def cancellable(job, ticket: Ticket, chunk: int):
    """The job with its sample ranges asked `chunk` at a time (the same counts: noise is keyed by sample), stopped at
    the next chunk once the ticket is cancelled (then it returns CANCELLED): a client gone frees its samples."""
    try:
        ask = next(job)
    except StopIteration as done:
        return done.value
    while True:
        counts = yield from _chunked(ask, ticket, chunk)
        if counts is None:
            return CANCELLED
        try:
            ask = job.send(counts)
        except StopIteration as done:
            return done.value


def _chunked(ask, ticket: Ticket, chunk: int):
    """The counts of `ask` (a Request or a tuple of them), asked at most `chunk` samples at a time; None if cancelled."""
    requests = (ask,) if isinstance(ask, Request) else tuple(ask)
    got = []
    for request in requests:
        total = None
        for first in range(request.first, request.first + request.num, chunk):
            if ticket.cancelled:
                return None
            part = yield Request(first, min(chunk, request.first + request.num - first))
            total = part if total is None else total + part
        got.append(total)
    return got[0] if isinstance(ask, Request) else tuple(got)


SHARED = 8      # requests that get an equal slice of every batch (batch // SHARED rows each) before any gets more


class ServingScheduler(Scheduler):
    """The scheduler of a run that never runs out of images: `serve` admits each image as it is taken, and waits
    for the next when nothing is in flight; `on_batch(requests, rows)` hears how many requests share each batch.
    Each batch is shared fairly: every request in flight (oldest first, up to `shared` of them) gets a slice of
    batch // shared rows, then the rows left go oldest first; the answers do not move (noise is keyed per sample)."""

    on_batch: Callable[[int, int], None] = staticmethod(lambda requests, rows: None)

    def __init__(self, voter, batch: int, shared: int = SHARED):
        super().__init__(voter, batch)
        self.slice = max(1, self.batch // max(1, shared))

    def _plan(self, active: Dict, admit: Callable[[], bool]) -> Optional[BatchRows]:
        """One batch: a slice per request (its images oldest first), new images admitted while a slice fits,
        then the free rows to the oldest pending samples; None when there is nothing to compute."""
        space, segments, given = self.batch, [], {}

        def take_from(slot, cap: Optional[int]) -> None:
            nonlocal space
            request = id(slot.work.tag[0]) if isinstance(slot.work.tag, tuple) else id(slot)
            for p in slot.pending:
                room = space if cap is None else min(space, cap - given.get(request, 0))
                rows = min(p.num - p.planned, room)
                if rows > 0:
                    segments.append((slot, p, p.lo + p.planned, rows))
                    p.planned += rows
                    space -= rows
                    given[request] = given.get(request, 0) + rows

        for slot in list(active.values()):
            take_from(slot, self.slice)
        while space > 0 and admit():
            before = space
            take_from(next(reversed(active.values())), self.slice)
            if space == before:         # its request has had its slice: the queue waits for the next batch
                break
        for slot in list(active.values()):
            if space == 0:
                break
            take_from(slot, None)
        if not segments:
            return None
        if self.voter.static_batch and space > 0:
            space = self._look_ahead(list(active.values()), space, segments)
        return self._rows(segments, space if self.voter.static_batch else 0)

    def _produce(self, rows: BatchRows):
        self.on_batch(len({id(slot.work.tag[0]) for slot, *_ in rows.segments}), rows.size)
        return super()._produce(rows)

    def serve(self, take: Callable[[bool], Optional[Work]], on_finish: Callable[[Finished], None],
              closing: Callable[[], bool]) -> None:
        """Run images from take(block) (None: none now) until closing() and nothing is in flight or waiting."""
        self.voter.verify_weights()
        active: Dict = {}
        in_flight: Deque = deque()
        depth = 2 if self.voter.lanes.overlapping else 1
        mark = [time.perf_counter()]

        def admit() -> bool:
            while len(active) < (self.window or 2 ** 62):
                work = take(False)
                if work is None:
                    return False
                if self._admit(work, active, on_finish):
                    return True
            return False

        def complete(rows: BatchRows, votes, finite) -> None:
            mark[0] = self._complete(rows, votes, finite, active, on_finish, mark[0])

        self.voter.lanes.begin()
        try:
            while True:
                if self._step(active, in_flight, depth, admit, complete):
                    continue
                work = take(True)
                if work is not None:
                    mark[0] = time.perf_counter()
                    self._admit(work, active, on_finish)
                elif closing():
                    return
        finally:
            self.voter.lanes.end()


class ModelWorker:
    """A model's queue and its one scheduler thread: `submit` queues a request's images (bounded, 503 past it),
    hands each a fresh server-chosen image index and returns the request's Ticket."""

    def __init__(self, pipeline, batch: int, max_queue: int, counter: IndexCounter,
                 log: Callable[[str], None] = print):
        self.pipeline, self.batch, self.max_queue, self.counter, self.log = pipeline, batch, max_queue, counter, log
        self.queue: Deque[Work] = deque()
        self.cond = threading.Condition()
        self.waiting = 0                # images queued or in flight
        self.closing = False
        self.samples = 0                # samples counted, for samples/s
        self.scheduler: Optional[ServingScheduler] = None
        self.on_batch: Callable[[int, int], None] = lambda requests, rows: None    # metrics.py listens
        self.thread = threading.Thread(target=self._run, name="serve-worker", daemon=True)

    def start(self) -> "ModelWorker":
        self.thread.start()
        return self

    def submit(self, images: np.ndarray, asked: Asked) -> Ticket:
        with self.cond:
            if self.closing:
                raise Busy("the server is stopping")
            if self.waiting + len(images) > self.max_queue:
                raise Busy(f"the model's queue is full ({self.waiting} of {self.max_queue} images waiting or in flight)")
            try:
                ticket = Ticket(len(images), self.counter.take(len(images)))
            except UserError as exc:
                raise Busy(str(exc)) from None
            for k, image in enumerate(images):
                job = cancellable(job_for(asked, self.pipeline.sigma), ticket, self.batch)     # a batch at a time
                self.queue.append(Work(ticket.first_index + k, torch.from_numpy(image.copy()), job, tag=(ticket, k)))
            self.waiting += len(images)
            self.cond.notify()
        return ticket

    def close(self) -> None:
        with self.cond:
            self.closing = True
            self.cond.notify()

    def _take(self, block: bool) -> Optional[Work]:
        with self.cond:
            if not self.queue and block and not self.closing:
                self.cond.wait(timeout=0.2)
            while self.queue:
                work = self.queue.popleft()
                if not work.tag[0].cancelled:
                    return work
                self.waiting -= 1
            return None

    def _finished(self, done: Finished) -> None:
        ticket, position = done.work.tag
        with self.cond:
            self.waiting -= 1
        self.samples += done.samples
        ticket.finish(position, done.result)

    def _run(self) -> None:
        """Serve until closed; a failure (a stage that raises) fails the requests in flight and starts afresh."""
        while True:
            self.scheduler = ServingScheduler(self.pipeline, self.batch)
            self.scheduler.on_batch = lambda requests, rows: self.on_batch(requests, rows)     # set after start too
            started: Dict[int, Work] = {}

            def take(block: bool) -> Optional[Work]:
                work = self._take(block)
                if work is not None:
                    started[id(work)] = work
                return work

            def finish(done: Finished) -> None:
                started.pop(id(done.work), None)
                self._finished(done)

            try:
                self.scheduler.serve(take, finish, lambda: self.closing and not self.queue)
                return
            except Exception as exc:        # noqa: BLE001 - the requests in flight answer 500; the model keeps serving
                self.log(f"# model stage failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}")
                for work in started.values():
                    work.tag[0].fail(exc)
                with self.cond:
                    self.waiting -= len(started)


def result_of(result, asked: Asked):
    """(label, radius, samples) of one image's job result (a cancelled one: None)."""
    if result is CANCELLED:
        return None
    value = only(result)
    if asked.mode == "predict":
        return int(value), 0.0, asked.n
    return int(value.prediction), float(value.radius), int(value.samples)

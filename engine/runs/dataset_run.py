"""Certify or predict a selection of dataset images and write one TSV row per finished image and
configuration (one result file each: a single run has one, a sweep one per configuration).

Every image runs as a job on the continuous-batching scheduler (certify/scheduler.py): many images
share each batch, and rows are written (fsynced) in the order images finish. Resumable (every index
already in the file is skipped), SIGINT-safe (no new image starts; those in flight finish), SIGTERM-safe
(a scheduler's notice before it kills: no new batch, the images in flight are dropped, the finished
rows stay; `Terminated` is raised within a batch), and per-image seeded, so interrupted, resumed,
packed and sharded runs give the same rows. The `time`
column is the image's share of the compute time: its samples' share of each batch's wall time, so
the column sums to the run's wall time.
"""

from __future__ import annotations

import signal
import threading
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping, Optional, Sequence, Tuple

from tqdm import tqdm

from diffsmooth.engine.certify.cohen import Certificate, certify_job, predict_job
from diffsmooth.engine.certify.scheduler import Finished, Work
from diffsmooth.engine.certify.sequential import SequentialRule, SequentialState, sequential_job
from diffsmooth.engine.errors import Terminated
from diffsmooth.engine.runs.results import (
    CERTIFY_COLUMNS,
    PREDICT_COLUMNS,
    SEQUENTIAL_EXTRA,
    ResultWriter,
    format_radius,
    format_time,
)
from diffsmooth.engine.runs.row_states import append_state, states_path

TERMINATED = ("terminated (SIGTERM): the images in flight were dropped; every finished row is kept: run the same "
              "command again to continue")


class StopFlag:
    """`stop`: set by the first Ctrl-C (no new image starts; the images in flight finish) or by SIGTERM.
    `terminated`: SIGTERM came; `writing` > 0 while an image's rows are written, so that SIGTERM never
    cuts a row or writes an image to some configurations' files only (it is raised once they are)."""

    def __init__(self):
        self.stop = False
        self.terminated = False
        self.writing = 0

    @contextmanager
    def rows(self):
        """Write one image's rows; a SIGTERM that came meanwhile is raised after them."""
        self.writing += 1
        try:
            yield
        finally:
            self.writing -= 1
        if self.terminated and not self.writing:
            raise Terminated(TERMINATED)


@contextmanager
def stop_after_current_image():
    """Ctrl-C: the first lets the images in flight finish, a second interrupts at once. SIGTERM: stop at
    once (Terminated, raised between two Python steps of the current batch, never inside a row write)."""
    flag = StopFlag()
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return
    previous = signal.getsignal(signal.SIGINT)
    previous_term = signal.getsignal(signal.SIGTERM)

    def handler(signum, frame):
        if flag.stop:                       # a second Ctrl-C interrupts at once
            signal.signal(signal.SIGINT, previous)
            raise KeyboardInterrupt
        flag.stop = True

    def terminate(signum, frame):
        flag.stop = flag.terminated = True
        signal.signal(signal.SIGTERM, signal.SIG_IGN)      # one notice is enough; the unwinding is not cut
        if not flag.writing:
            raise Terminated(TERMINATED)

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, terminate)
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.signal(signal.SIGTERM, previous_term)


def image_works(dataset, indices: Iterable[int], make_job: Callable[[int], object]) -> Iterable[Work]:
    """Work items for the scheduler, loading each image only when it joins the window."""
    for index in indices:
        x, label = dataset[index]
        yield Work(index, x, make_job(index), tag=int(label))


@dataclass(frozen=True)
class RunSummary:
    """What a run wrote: rows, where, and the samples its batches computed and counted."""

    written: int
    skipped_done: int
    interrupted: bool
    path: str
    files: Tuple[str, ...]
    samples_computed: int = 0
    samples_counted: int = 0
    max_window: int = 0

    def line(self) -> str:
        """One line saying what the run wrote."""
        state = "interrupted after" if self.interrupted else "wrote"
        return f"{state} {self.written} rows ({self.skipped_done} already done) to {self.path}"


def job_factory(mode: str, n0: int, n: int, alpha: float, sigma: float,
                sequential: Optional[SequentialRule] = None,
                starts: Optional[Mapping[int, Sequence[SequentialState]]] = None) -> Callable[[int], object]:
    """A new job per image index: sequential CERTIFY (from the image's `starts` where given), CERTIFY or
    PREDICT (certify/cohen.py, certify/sequential.py)."""
    if sequential is not None:
        starts = starts or {}
        return lambda index: sequential_job(n0, sequential, starts.get(index))
    if mode == "certify":
        return lambda index: certify_job(n0, n, alpha, sigma)
    return lambda index: predict_job(n, alpha)


def columns_of(mode: str, sequential: bool) -> Tuple[str, ...]:
    """The reference TSV's columns; sequential rows add the samples drawn and the selected class's
    estimation votes at the stopping look (a simulator replays the image from the two)."""
    if mode == "predict":
        return PREDICT_COLUMNS
    return CERTIFY_COLUMNS + (SEQUENTIAL_EXTRA if sequential else ())


def result_row(index: int, label: int, result, seconds: float, columns: Sequence[str]) -> dict:
    """One configuration's row: a Certificate (certify) or a class (predict)."""
    if isinstance(result, Certificate):
        prediction = result.prediction
        row = dict(radius=format_radius(result.radius), samples=result.samples, top_votes=result.top_votes)
    else:
        prediction, row = int(result), {}
    row.update(idx=index, label=label, predict=prediction, correct=int(prediction == label), time=format_time(seconds))
    return {c: row[c] for c in columns}


def run_dataset(voter, dataset, indices: Sequence[int], files: Sequence, *, mode: str = "certify",
                n0: int = 100, n: int = 10000, alpha: float = 0.001, batch: int = 1000,
                progress: bool = True, on_row: Optional[Callable[[dict], None]] = None,
                sequential: Optional[SequentialRule] = None, window: Optional[int] = None,
                claim: Optional[Callable[[Sequence[int]], Iterable[int]]] = None, skip=(),
                starts: Optional[Mapping[int, Sequence[SequentialState]]] = None,
                keep_states: bool = False) -> RunSummary:
    """Certify (or predict) dataset[i] for i in indices on `voter` (certify/monte_carlo.py), appending
    each configuration's row to its file in `files` (one per configuration, in the voter's order) as
    images finish. With `sequential`, certify stops early per image and rows get trailing `samples`
    and `top_votes` columns. `window` bounds the images in flight (1: one image at a time). `claim(todo)` hands out the
    images this process runs (default: all of todo, in order; under torchrun, pulled from a shared
    counter); `skip` holds indices finished elsewhere. Sequential only: `starts` continues images from
    the states of an earlier run (rows as from the first sample); `keep_states` keeps each row's state
    beside its result file (engine/runs/row_states.py)."""
    if len(files) != voter.num_configs:
        raise ValueError(f"{voter.num_configs} configurations vote, {len(files)} result files given")
    columns = columns_of(mode, sequential is not None)
    make_job = job_factory(mode, n0, n, alpha, voter.sigma, sequential, starts)
    written = 0
    with ExitStack() as stack:
        writers = [stack.enter_context(ResultWriter(f, columns)) for f in files]
        flag = stack.enter_context(stop_after_current_image())
        todo = [i for i in indices if i not in skip and any(i not in w.done for w in writers)]
        mine = claim(todo) if claim is not None else todo
        bar = None
        if progress:
            what = voter.stages.method if voter.num_configs == 1 else f"{voter.num_configs} configs"
            bar = stack.enter_context(tqdm(total=len(indices), initial=len(indices) - len(todo), unit="img",
                                           desc=f"{mode} {what}", dynamic_ncols=True))

        def finished(done: Finished) -> None:
            nonlocal written
            with flag.rows():
                for writer, result in zip(writers, done.result):
                    if done.work.index in writer.done:
                        continue
                    row = result_row(done.work.index, done.work.tag, result, done.seconds, columns)
                    writer.write(**row)
                    if on_row:
                        on_row(row)
                    if keep_states and getattr(result, "state", None) is not None:
                        append_state(states_path(Path(writer.path)), done.work.index, result.state)
                written += 1
            if bar is not None:
                bar.update(1)

        try:
            stats = voter.scheduler(batch, window).run(image_works(dataset, mine, make_job), finished,
                                                       stop=lambda: flag.stop)
        except Terminated:
            where = files[0] if len(files) == 1 else Path(files[0]).parent
            raise Terminated(f"terminated (SIGTERM): the images in flight were dropped; {written} rows written "
                             f"this run, every finished row is kept in {where}: run the same command again to "
                             f"continue") from None
        return RunSummary(written, len(indices) - len(todo), flag.stop, str(files[0] if len(files) == 1 else
                                                                           Path(files[0]).parent),
                          tuple(str(f) for f in files), stats.samples_computed, stats.samples_counted,
                          stats.max_window)

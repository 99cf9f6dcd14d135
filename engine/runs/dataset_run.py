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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping, Optional, Sequence, Tuple

from tqdm import tqdm

from diffsmooth.engine.certify.blocks import SampleBlocks
from diffsmooth.engine.certify.cohen import Certificate, certify_job, predict_job
from diffsmooth.engine.certify.scheduler import Finished, Work
from diffsmooth.engine.certify.sequential import SequentialRule, SequentialState, sequential_job
from diffsmooth.engine.choices import DEFAULT_ALPHA, DEFAULT_N, DEFAULT_N0
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

    def __init__(self, shared: bool = False):
        self.stop = False
        self.terminated = False
        self.writing = 0
        self.shared = shared        # torchrun's ranks: SIGTERM is agreed at a meeting, never raised alone

    @contextmanager
    def rows(self):
        """Write one image's rows; a SIGTERM that came meanwhile is raised after them (in one process)."""
        self.writing += 1
        try:
            yield
        finally:
            self.writing -= 1
        if self.terminated and not self.writing and not self.shared:
            raise Terminated(TERMINATED)

    def level(self) -> int:
        """The stop this process asks of the scheduler: none (0), finish the images in flight (1), drop them (2)."""
        return 2 if self.terminated else 1 if self.stop else 0


@contextmanager
def stop_after_current_image(shared: bool = False):
    """Ctrl-C: the first lets the images in flight finish, a second interrupts at once. SIGTERM: stop at
    once (Terminated, raised between two Python steps of the current batch, never inside a row write).
    `shared` (torchrun's ranks): SIGTERM only sets the flag, which the ranks agree on at their next meeting
    (every rank then drops its images in flight and raises Terminated there, certify/scheduler.py)."""
    flag = StopFlag(shared)
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
        if not flag.writing and not shared:
            raise Terminated(TERMINATED)

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, terminate)
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.signal(signal.SIGTERM, previous_term)


def image_works(dataset, indices: Iterable[int], jobs: "Jobs") -> Iterable[Work]:
    """Work items for the scheduler, loading each image only when it joins the window."""
    for index in indices:
        x, label = dataset[index]
        yield Work(index, x, jobs(index, int(label)), tag=int(label), recipe=jobs.recipe(index, int(label)))


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


@dataclass(frozen=True)
class Jobs:
    """What every image of a run computes, and the row it writes: CERTIFY (n0, n, alpha), sequential CERTIFY
    with `sequential` (from the image's `starts`, the states of an earlier run, where given; rows as from
    the first sample), or PREDICT. `keep_states`: each sequential row's state is kept beside its result
    file (engine/runs/row_states.py), for a later run to go on from. `stop_wrong_class` (a table's sequential
    runs): an image whose selected class is not its label stops after the n0 selection samples and abstains
    (engine/certify/sequential.py); no cell counts it either way."""

    mode: str = "certify"
    n0: int = DEFAULT_N0
    n: int = DEFAULT_N
    alpha: float = DEFAULT_ALPHA
    sigma: float = 0.0
    sequential: Optional[SequentialRule] = None
    starts: Mapping[int, Sequence[SequentialState]] = field(default_factory=dict)
    keep_states: bool = False
    stop_wrong_class: bool = False

    @classmethod
    def of(cls, request, **continuation) -> "Jobs":
        """The jobs a RunRequest asks for; `continuation`: `starts` and `keep_states`."""
        return cls(request.mode, request.n0, request.n, request.alpha, request.sigma, request.sequential, **continuation)

    def __call__(self, index: int, label: Optional[int] = None):
        """A new job for image `index` whose label is `label` (certify/cohen.py, certify/sequential.py)."""
        if self.sequential is not None:
            stop_at = label if self.stop_wrong_class and label is not None else None
            return sequential_job(self.n0, self.sequential, self.starts.get(index), stop_at)
        if self.mode == "certify":
            return certify_job(self.n0, self.n, self.alpha, self.sigma)
        return predict_job(self.n, self.alpha)

    def recipe(self, index: int, label: Optional[int] = None) -> str:
        """What image `index`'s job asks, as text (torchrun's ranks compare it before summing its votes)."""
        return repr((self.mode, self.n0, self.n, self.alpha, self.sigma, self.sequential, self.starts.get(index),
                     self.stop_wrong_class and label))

    @property
    def columns(self) -> Tuple[str, ...]:
        return columns_of(self.mode, self.sequential is not None)


@dataclass(frozen=True)
class Images:
    """The images of a run and how they are batched: dataset[i] for i in `indices`, `batch` noisy samples per
    batch, at most `window` images in flight (None: as many as fit), a progress bar or not. A ResolvedRun
    (engine/runs/resolve.py) answers the same questions."""

    dataset: object
    indices: Sequence[int]
    batch: int = 1000
    window: Optional[int] = None
    progress: bool = True


def columns_of(mode: str, sequential: bool) -> Tuple[str, ...]:
    """The reference TSV's columns; sequential rows add the samples drawn, the selected class's estimation
    votes at the stopping look (a simulator replays the image from the two) and the selected class (so an
    abstaining row says whether its class was the label)."""
    if mode == "predict":
        return PREDICT_COLUMNS
    return CERTIFY_COLUMNS + (SEQUENTIAL_EXTRA if sequential else ())


def result_row(index: int, label: int, result, seconds: float, columns: Sequence[str]) -> dict:
    """One configuration's row: a Certificate (certify) or a class (predict)."""
    if isinstance(result, Certificate):
        prediction = result.prediction
        row = dict(radius=format_radius(result.radius), samples=result.samples, top_votes=result.top_votes,
                   selected=result.state.selected if result.state is not None else None)
    else:
        prediction, row = int(result), {}
    row.update(idx=index, label=label, predict=prediction, correct=int(prediction == label), time=format_time(seconds))
    return {c: row[c] for c in columns}


def run_dataset(voter, run, files: Sequence, jobs: Jobs, *, on_row: Optional[Callable[[dict], None]] = None,
                blocks: Optional[SampleBlocks] = None, skip=()) -> RunSummary:
    """Run `jobs` on every image of `run` (an Images, or a ResolvedRun) on `voter` (certify/monte_carlo.py),
    appending each configuration's row to its file in `files` (one per configuration, in the voter's order)
    as images finish. Sequential rows get trailing `samples` and `top_votes` columns. `blocks`: under
    torchrun, this rank's share of every image's samples (certify/blocks.py); every rank runs every image,
    rank 0 alone writes the rows, and the images still to run are rank 0's list. `skip` holds indices
    finished elsewhere."""
    if len(files) != voter.num_configs:
        raise ValueError(f"{voter.num_configs} configurations vote, {len(files)} result files given")
    dataset, indices, batch, mode = run.dataset, list(run.indices), run.batch, jobs.mode
    columns = jobs.columns
    written = 0
    writes = blocks is None or blocks.writes
    with ExitStack() as stack:
        writers = [stack.enter_context(ResultWriter(f, columns)) for f in files] if writes else []
        flag = stack.enter_context(stop_after_current_image(shared=blocks is not None))
        todo = [i for i in indices if i not in skip and any(i not in w.done for w in writers)] if writes else None
        if blocks is not None:
            todo = blocks.agree(todo)       # every rank runs the same images, in the same order
        bar = None
        if run.progress and writes:
            what = voter.stages.method if voter.num_configs == 1 else f"{voter.num_configs} configs"
            bar = stack.enter_context(tqdm(total=len(indices), initial=len(indices) - len(todo), unit="img",
                                           desc=f"{mode} {what}", dynamic_ncols=True))

        def finished(done: Finished) -> None:
            nonlocal written
            if not writes:
                return
            with flag.rows():
                for writer, result in zip(writers, done.result):
                    if done.work.index in writer.done:
                        continue
                    row = result_row(done.work.index, done.work.tag, result, done.seconds, writer.columns)
                    # the state first: a run killed between the two leaves a state without its row (the image
                    # runs again, its new state read last), never a row without its state (which the race
                    # would have to rerun from its first sample, into another file than one process's)
                    if jobs.keep_states and getattr(result, "state", None) is not None:
                        append_state(states_path(Path(writer.path)), done.work.index, result.state)
                    writer.write(**row)
                    if on_row:
                        on_row(row)
                written += 1
            if bar is not None:
                bar.update(1)

        try:
            stats = voter.scheduler(batch, run.window, blocks).run(image_works(dataset, todo, jobs), finished,
                                                               stop=flag.level)
        except Terminated:
            where = files[0] if len(files) == 1 else Path(files[0]).parent
            raise Terminated(f"terminated (SIGTERM): the images in flight were dropped; {written} rows written "
                             f"this run, every finished row is kept in {where}: run the same command again to "
                             f"continue") from None
        return RunSummary(written, len(indices) - len(todo), stats.stopped, str(files[0] if len(files) == 1 else
                                                                           Path(files[0]).parent),
                          tuple(str(f) for f in files), stats.samples_computed, stats.samples_counted,
                          stats.max_window)

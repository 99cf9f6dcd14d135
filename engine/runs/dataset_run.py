"""Certify or predict a selection of dataset images and write one TSV row per finished image.

Every image runs as a job on the continuous-batching scheduler (certify/scheduler.py): many images
share each batch, and rows are written (fsynced) in the order images finish. Resumable (every index
already in the file is skipped), SIGINT-safe (no new image starts; those in flight finish), and
per-image seeded, so interrupted, resumed, packed and sharded runs give the same rows. The `time`
column is the image's share of the compute time: its samples' share of each batch's wall time, so
the column sums to the run's wall time.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Callable, Iterable, Optional, Sequence

from diffsmooth.engine.certify.core import Smooth, certify_job, predict_job
from diffsmooth.engine.certify.scheduler import Finished, Work
from diffsmooth.engine.certify.sequential import SequentialRule, sequential_job
from diffsmooth.engine.runs.results import CERTIFY_COLUMNS, PREDICT_COLUMNS, ResultWriter, format_radius, format_time


class StopFlag:
    """Set by the first Ctrl-C: no new image starts; the images in flight finish."""

    def __init__(self):
        self.stop = False


@contextmanager
def stop_after_current_image():
    flag = StopFlag()
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return
    previous = signal.getsignal(signal.SIGINT)

    def handler(signum, frame):
        if flag.stop:                       # a second Ctrl-C interrupts at once
            signal.signal(signal.SIGINT, previous)
            raise KeyboardInterrupt
        flag.stop = True

    signal.signal(signal.SIGINT, handler)
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, previous)


def image_works(dataset, indices: Iterable[int], make_job: Callable[[], object]) -> Iterable[Work]:
    """Work items for the scheduler, loading each image only when it joins the window."""
    for index in indices:
        x, label = dataset[index]
        yield Work(index, x, make_job(), tag=int(label))


def run_dataset(smooth: Smooth, dataset, indices: Sequence[int], out_path, *, mode: str = "certify",
                n0: int = 100, n: int = 10000, alpha: float = 0.001, batch: int = 1000,
                progress: bool = True, on_row: Optional[Callable[[dict], None]] = None,
                sequential: Optional[SequentialRule] = None, window: Optional[int] = None,
                claim: Optional[Callable[[Sequence[int]], Iterable[int]]] = None, skip=()) -> dict:
    """Certify (or predict) dataset[i] for i in indices, appending rows to out_path as images finish.
    With `sequential`, certify stops early per image (engine/certify/sequential.py) and the rows get
    a trailing `samples` column. `window` bounds the images in flight (1: one image at a time).
    `claim(todo)` hands out the images this process runs (default: all of todo, in order; under
    torchrun, pulled from a shared counter); `skip` holds indices finished elsewhere."""
    columns = CERTIFY_COLUMNS if mode == "certify" else PREDICT_COLUMNS
    if sequential is not None:
        columns = CERTIFY_COLUMNS + ("samples",)
    if sequential is not None:
        make_job = lambda: sequential_job(n0, sequential)           # noqa: E731
    elif mode == "certify":
        make_job = lambda: certify_job(n0, n, alpha, smooth.sigma)  # noqa: E731
    else:
        make_job = lambda: predict_job(n, alpha)                    # noqa: E731
    written = 0
    with ResultWriter(out_path, columns) as writer, stop_after_current_image() as flag:
        todo = [i for i in indices if i not in writer.done and i not in skip]
        mine = claim(todo) if claim is not None else todo
        bar = None
        if progress:
            from tqdm import tqdm
            bar = tqdm(total=len(indices), initial=len(indices) - len(todo), unit="img",
                       desc=f"{mode} {smooth.pipeline.stages.method}", dynamic_ncols=True)

        def finished(done: Finished) -> None:
            nonlocal written
            if sequential is not None:
                prediction, radius, samples = done.result
            elif mode == "certify":
                (prediction, radius), samples = done.result, None
            else:
                prediction, samples = done.result, None
            label = done.work.tag
            row = dict(idx=done.work.index, label=label, predict=prediction,
                       correct=int(prediction == label), time=format_time(done.seconds))
            if mode == "certify":
                row["radius"] = format_radius(radius)
            if samples is not None:
                row["samples"] = samples
            writer.write(**row)
            written += 1
            if on_row:
                on_row(row)
            if bar is not None:
                bar.update(1)

        try:
            stats = smooth.pipeline.scheduler(batch, window).run(image_works(dataset, mine, make_job), finished,
                                                                  stop=lambda: flag.stop)
        finally:
            if bar is not None:
                bar.close()
        return {"written": written, "skipped_done": len(indices) - len(todo), "interrupted": flag.stop,
                "path": str(out_path), "samples_computed": stats.samples_computed,
                "samples_counted": stats.samples_counted, "max_window": stats.max_window}

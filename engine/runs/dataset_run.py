"""Certify or predict a selection of dataset images and write one TSV row per finished image.

Resumable (finished indices are skipped), SIGINT-safe (stops after the current image), and
per-image seeded, so interrupted, resumed and sharded runs give the same rows.
"""

from __future__ import annotations

import signal
import threading
import time
from contextlib import contextmanager
from typing import Callable, Optional, Sequence

from diffsmooth.engine.runs.results import CERTIFY_COLUMNS, PREDICT_COLUMNS, ResultWriter, format_radius, format_time
from diffsmooth.engine.certify.core import Smooth
from diffsmooth.engine.certify.sequential import SequentialRule, certify_sequential


class StopFlag:
    """Set by the first Ctrl-C: the run ends after the image in progress."""

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


def run_dataset(smooth: Smooth, dataset, indices: Sequence[int], out_path, *, mode: str = "certify",
                n0: int = 100, n: int = 10000, alpha: float = 0.001, batch: int = 1000,
                progress: bool = True, on_row: Optional[Callable[[dict], None]] = None,
                sequential: Optional[SequentialRule] = None) -> dict:
    """Certify (or predict) dataset[i] for i in indices, appending rows to out_path.
    With `sequential`, certify stops early per image (engine/certify/sequential.py) and the
    rows get a trailing `samples` column."""
    columns = CERTIFY_COLUMNS if mode == "certify" else PREDICT_COLUMNS
    if sequential is not None:
        columns = CERTIFY_COLUMNS + ("samples",)
    written = 0
    with ResultWriter(out_path, columns) as writer, stop_after_current_image() as flag:
        todo = [i for i in indices if i not in writer.done]
        bar = None
        if progress:
            from tqdm import tqdm
            bar = tqdm(total=len(indices), initial=len(indices) - len(todo), unit="img",
                       desc=f"{mode} {smooth.pipeline.stages.method}", dynamic_ncols=True)
        try:
            for index in todo:
                x, label = dataset[index]
                start = time.perf_counter()
                samples = None
                if sequential is not None:
                    prediction, radius, samples = certify_sequential(
                        lambda first, num: smooth.pipeline.count(x, index, first, num, batch), n0, sequential)
                elif mode == "certify":
                    prediction, radius = smooth.certify(x, n0, n, alpha, batch, image_index=index)
                else:
                    prediction = smooth.predict(x, n, alpha, batch, image_index=index)
                elapsed = time.perf_counter() - start
                row = dict(idx=index, label=int(label), predict=prediction,
                           correct=int(prediction == int(label)), time=format_time(elapsed))
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
                if flag.stop:
                    break
        finally:
            if bar is not None:
                bar.close()
        return {"written": written, "skipped_done": len(indices) - len(todo),
                "interrupted": flag.stop, "path": str(out_path)}

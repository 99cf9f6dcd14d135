"""The job protocol: a certification algorithm is a plain generator that asks for vote counts of
sample ranges (`Request`) and is sent them, so one scheduler can pack many images' samples into
each batch. Counts arrive as int64 arrays [configurations, classes]: one row per configuration
voting on the same samples (one row for a single configuration, several for a sweep)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Generator

import numpy as np


@dataclass(frozen=True)
class Request:
    """Vote counts of samples first..first+num-1 of the job's image (noise keyed by sample index)."""

    first: int
    num: int


def count_job(first: int, num: int) -> Generator:
    """Just the counts [configurations, classes] of samples first..first+num-1."""
    return (yield Request(first, num))


def drive(job: Generator, count: Callable[[int, int], np.ndarray]):
    """Run a job one request at a time with count(first, num) -> counts [configurations, classes]
    (replays of recorded votes, tests)."""
    try:
        ask = next(job)
        while True:
            if isinstance(ask, Request):
                ask = job.send(count(ask.first, ask.num))
            else:
                ask = job.send(tuple(count(r.first, r.num) for r in ask))
    except StopIteration as done:
        return done.value

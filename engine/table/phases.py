"""A table's runs as phases: one line at one sigma, on some images, settling some radii (None: fixed-n);
what a phase gives back; where its rows live; how a table stops between and inside phases."""

from __future__ import annotations

import signal
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from diffsmooth.engine.certify.sequential import SequentialState
from diffsmooth.engine.table.spec import LineSpec


class TableInterrupted(Exception):
    """Ctrl-C or SIGTERM stopped the table (finished rows are kept; rerun the command to continue)."""

    def __init__(self, message: str, seconds: float = 0.0):
        super().__init__(message)
        self.seconds = seconds                  # compute seconds the interrupted run had spent


@dataclass
class Phase:
    """One run of the table: a line at a sigma, on some images, settling some radii (None: fixed-n)."""

    line: LineSpec
    sigma: float
    indices: Sequence[int]
    radii: Optional[Sequence[float]]
    path: Path
    kind: str                               # "pilot", "main", "first" or an extension's ("to0.5")
    starts: Optional[Dict[int, Dict[str, SequentialState]]] = None   # {image: {configuration: state}}: go on from there
    decides: bool = False                   # stop once the largest radius is decided (the race's extensions)

    @property
    def key(self) -> tuple:
        return self.line.name, self.sigma

    def describe(self) -> str:
        return f"{self.line.name} sigma {self.sigma:g} ({self.kind})"


@dataclass
class PhaseResult:
    rows: Dict[str, List[dict]]             # configuration name -> rows (every image of the phase)
    seconds: float                          # measured compute seconds this invocation (0 when already done)
    samples: int                            # samples drawn, from the rows (a sweep's pass: its slowest configuration)
    probe_rate: Optional[float] = None      # pilot: samples per second of full batches


def phase_path(out: Path, line: LineSpec, sigma: float, kind: str) -> Path:
    """Where a table folder keeps one run: DIR/runs/LINE_sSIGMA[_KIND].tsv (a folder for a sweep)."""
    suffix = "" if kind == "main" else f"_{kind}"
    name = f"{line.slug}_s{sigma:g}{suffix}"
    sweep = any(len(v.get(sigma, ())) > 1 for v in (line.classifier, line.local_sigma, line.m))
    return Path(out) / "runs" / (name if sweep else f"{name}.tsv")


def ordered_starts(phase: Phase, configurations: Sequence[str]) -> Dict[int, List[SequentialState]]:
    """The phase's starts as each image's states in the run's configuration order (`configurations`: the
    run's names, in order); an image lacking the state of any configuration starts afresh."""
    names = list(configurations)
    out = {}
    for image, named in (phase.starts or {}).items():
        if len(names) == 1 and len(named) == 1:
            out[image] = list(named.values())
        elif all(name in named for name in names):
            out[image] = [named[name] for name in names]
    return out


PROBE_BATCHES = 2


def probe_rate(voter, image, index: int, batch: int, batches: int = PROBE_BATCHES) -> float:
    """Samples per second of this machine's pipeline on full batches, as the main phase runs them:
    one untimed batch, then `batches` timed. Only for a resumed table whose pilot ran before (its
    batches were not timed); a pilot that runs is timed on its own batches (table/pilot_rate.py)."""
    voter.count(image, index, 0, batch, batch)
    start = time.perf_counter()
    voter.count(image, index, batch, batches * batch, batch)
    return batches * batch / max(time.perf_counter() - start, 1e-9)


class StopRequest:
    """Set by Ctrl-C or SIGTERM that arrives between two runs (inside a run, run_dataset's own
    handlers stop the run and the table stops with it)."""

    def __init__(self):
        self.signal: Optional[str] = None


@contextmanager
def stop_between_runs():
    """Ctrl-C and SIGTERM (what a scheduler sends before it kills) set a flag that the table checks
    before each run; run_dataset installs its own handlers for the length of a run and restores these."""
    stop = StopRequest()

    def note(signum, frame):
        stop.signal = signal.Signals(signum).name
    try:
        previous = {s: signal.signal(s, note) for s in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:                      # not the main thread
        yield stop
        return
    try:
        yield stop
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)

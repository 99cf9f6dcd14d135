"""Where each sequential row stopped, kept beside its result file so that a later run with more radii
can go on from there (engine/certify/sequential.py, `SequentialState`; the table's race extends
images this way instead of rerunning them from their first sample).

FILE.tsv.states.jsonl holds one JSON line per image, {"idx": i, "state": {...}}, appended (and
fsynced) just before the image's row, so that a run killed between the two leaves a state without its
row (the image runs again), never a row without its state. The result file stays the record; a state is
only a shortcut: one that is missing, torn or does not match its row makes the image run from its first
sample instead, which gives the same row.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Dict, Optional

from diffsmooth.engine.certify.sequential import SequentialState

SUFFIX = ".states.jsonl"


def states_path(result_file: Path) -> Path:
    """The states file of a result file (beside it; a sweep folder's `*.tsv` glob does not see it)."""
    result_file = Path(result_file)
    return result_file.with_name(result_file.name + SUFFIX)


def append_state(path: Path, index: int, state: SequentialState) -> None:
    """One image's state, as one line written at once."""
    line = json.dumps({"idx": int(index), "state": state.to_json()}, allow_nan=False) + "\n"
    with open(path, "a+b") as handle:
        if handle.tell() > 0:                   # a line torn by a kill stays alone: this one is read whole
            handle.seek(-1, os.SEEK_END)
            if handle.read(1) != b"\n":
                line = "\n" + line
        handle.write(line.encode("utf-8"))
        handle.flush()
        os.fsync(handle.fileno())


def read_states(path: Path) -> Dict[int, SequentialState]:
    """{image: state} of a states file (an image's last line wins; unreadable lines are skipped)."""
    out: Dict[int, SequentialState] = {}
    if not Path(path).is_file():
        return out
    for line in Path(path).read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            doc = json.loads(line)
            out[int(doc["idx"])] = SequentialState.from_json(doc["state"])
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
    return out


def state_of(row: dict, states: Dict[int, SequentialState], n0: int) -> Optional[SequentialState]:
    """The row's state when one was kept with the row's samples and votes, else None."""
    state = states.get(int(row["idx"]))
    if state is None or row.get("top_votes") in (None, "") or int(row["samples"]) != n0 + state.samples \
            or int(row["top_votes"]) != state.successes:
        return None
    return state


def drawn_samples(row: dict, states: Dict[int, SequentialState], n0: int) -> int:
    """The samples the row's run drew: all of them, or those after the look it went on from."""
    state = state_of(row, states, n0)
    return int(row["samples"]) - (n0 + state.started if state is not None and state.started > 0 else 0)

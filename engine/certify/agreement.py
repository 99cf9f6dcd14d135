"""What torchrun's ranks must agree on before their votes are summed, and the lines a rank prints when they do
not (certify/blocks.py holds the meeting that compares them).

A run's settings and the weights every stage computes with are compared at the run's first meeting. Every image
in flight has an identity: one 62-bit digest per field of FIELDS (its index, its bytes, the job asked of it). The
ranks compare each image's digests at
the first meeting after it joins, in the meeting's one all-reduce (the maximum of d and of -d gives both the
largest and the smallest digest, so the cost does not grow with the ranks); an image whose digests differ
anywhere stops every rank with the same line before any of its votes are summed."""

from __future__ import annotations

import hashlib
import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Dict, Iterator, Optional, Sequence

import numpy as np

from diffsmooth.engine.errors import UserError, first_line

FIELDS = ("index", "image", "request")       # per image; a run's settings and weights are agreed at its start
WHAT = {                        # how a line names each field, and what the user should check
    "image": ("the image's pixels", "every rank must read the same data (the same file, the same transforms)"),
    "index": ("the image's index", "every rank must certify the same images in the same order (the Python API: "
              "ranks='independent' lets each rank certify its own)"),
    "request": ("the request (n0, n, alpha, looks, radii, its start)", "every rank must ask the same"),
    "settings": ("the settings (method and its options, sigma, seed, precision, backend)",
                 "start every rank with the same options"),
    "weights": ("the model weights", "every rank must load the same checkpoints"),
    "window": ("the window of images in flight", "start every rank with the same --batch and --window"),
}
_MASK = (1 << 62) - 1          # digests are non-negative and their negatives fit in int64


def digest64(data) -> int:
    """A 62-bit digest of bytes, a string, or a numpy/torch array's contents (dtype and shape included)."""
    h = hashlib.blake2b(digest_size=8)
    if isinstance(data, str):
        data = data.encode()
    if not isinstance(data, (bytes, bytearray, memoryview)):
        array = np.ascontiguousarray(data.detach().cpu().numpy() if hasattr(data, "detach") else data)
        h.update(f"{array.dtype}{array.shape}".encode())
        data = array.view(np.uint8).reshape(-1)
    h.update(data)
    return int.from_bytes(h.digest(), "little") & _MASK


@dataclass(frozen=True)
class Identity:
    """One image's digests, a field each (FIELDS), and the readable values a mismatch line shows."""

    digests: Sequence[int]
    index: int

    @classmethod
    def of(cls, index: int, image, request: str) -> "Identity":
        return cls((int(index), digest64(image), digest64(request)), int(index))


class RanksDisagree(UserError):
    """The ranks hold different work for the same image: its votes are never summed."""


class RankFailed(UserError):
    """Another rank raised: every rank stops at the same meeting."""


class RanksLost(UserError):
    """A rank stopped answering (it died, hung or left) within the rank timeout."""


def mismatch_line(field: str, values: Sequence, indices: Optional[Sequence]) -> str:
    """The one line every rank prints when the ranks differ in `field` (FIELDS, or "window"): which ranks hold
    what. `values`: each rank's digest or value (None: that rank holds no such image); `indices`: each rank's
    image index there (None for the run's own fields)."""
    what, fix = WHAT[field]
    groups: Dict[object, list] = {}
    for rank, value in enumerate(values):
        groups.setdefault(value, []).append(rank)

    def ranks(members) -> str:
        return f"rank{'s' if len(members) > 1 else ''} {', '.join(map(str, members))}"
    if field in ("index", "window"):
        held = "; ".join(f"{ranks(r)}: {'no image' if v is None else v}" for v, r in groups.items())
    else:
        held = " vs ".join(ranks(r) for r in groups.values())
        if indices is not None:
            held = f"image {next(i for i in indices if i is not None)}: {held}"
    return f"the ranks differ in {what} ({held}): no votes were summed and no row written; {fix}"


# -- a rank that fails, dies or hangs --------------------------------------------------------------------------

RANK_TIMEOUT_S = 900.0      # the longest a rank waits for the others at a collective ($DIFFSMOOTH_RANK_TIMEOUT_S)


def rank_timeout_s() -> float:
    """$DIFFSMOOTH_RANK_TIMEOUT_S, else RANK_TIMEOUT_S: it must outlast one batch on the slowest rank, the first
    batch's compile and the eager check included, and bounds how long the others wait for a rank that died."""
    text = os.environ.get("DIFFSMOOTH_RANK_TIMEOUT_S", "")
    try:
        seconds = float(text) if text else RANK_TIMEOUT_S
    except ValueError:
        raise UserError(f"DIFFSMOOTH_RANK_TIMEOUT_S must be a number of seconds, got {text!r}") from None
    if not seconds > 0:
        raise UserError(f"DIFFSMOOTH_RANK_TIMEOUT_S must be > 0, got {text!r}")
    return seconds


class _Notes:
    """The process group's store, where a rank that fails leaves its line for the others (sharding.py sets it)."""

    store = None
    rank = 0
    ranks = 1


def use_store(store, rank: int, ranks: int) -> None:
    """Failure notes go to `store` (the process group's; None: none kept)."""
    _Notes.store, _Notes.rank, _Notes.ranks = store, int(rank), int(ranks)


def note_failure(line: str) -> None:
    """Leave this rank's one-line failure where the other ranks read it when their collective breaks."""
    if _Notes.store is None:
        return
    try:
        _Notes.store.set(f"failed/rank_{_Notes.rank}", line[:300])
    except Exception:           # noqa: BLE001 - the store's node may be gone: the others then say so themselves
        pass


def failure_noted() -> Optional[str]:
    """'rank r failed: <line>' for the first rank that left a note, else None."""
    if _Notes.store is None:
        return None
    for rank in range(_Notes.ranks):
        key = f"failed/rank_{rank}"
        try:
            if rank != _Notes.rank and _Notes.store.check([key]):
                return f"rank {rank} failed: {_Notes.store.get(key).decode(errors='replace')}"
        except Exception:       # noqa: BLE001 - the store itself is unreachable
            return None
    return None


@contextmanager
def answered() -> Iterator[None]:
    """A collective that breaks (a rank died, hung past the rank timeout or left) raises RanksLost: one line,
    naming the rank that failed where it left a note."""
    try:
        yield
    except RuntimeError as exc:         # gloo/nccl errors and timeouts (DistError is a RuntimeError)
        noted = failure_noted()
        cause = noted or (f"a rank did not answer within the rank timeout ({rank_timeout_s():g} s, "
                          f"DIFFSMOOTH_RANK_TIMEOUT_S) or its process ended ({first_line(exc, 120)})")
        raise RanksLost(f"{cause}; every rank stopped, finished rows are kept: run the same command again to "
                        f"continue") from None

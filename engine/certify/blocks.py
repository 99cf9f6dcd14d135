"""One image's samples over torchrun's ranks: every rank runs every image's job (the same decisions, from
the same counts) and computes its own samples of each request, and the ranks sum their counts before the
job reads them (an all-reduce on the counts' own device: gloo on the CPU, nccl on GPUs).

Which rank computes a sample is fixed by its index alone: sample s is rank (s mod ranks)'s. A request of
n samples thus gives every rank n / ranks of them (one more or less), and a rank's samples of an image
form one sequence in its own order (local index j is sample j * ranks + rank), whatever the requests. So
a rank can compute ahead of a look as one process does (the look-ahead of a static batch's free rows: its
next samples, counted when a later request covers them), and a look of an image in flight on 8 ranks
costs each rank an eighth of the rows, or none if its look-ahead already holds them.

The ranks meet once per batch, in one all-reduce (the maximum, on the CPU: `meeting_group`): which images in
flight every rank has completed (their counts are then summed: a second all-reduce), whether any rank still
works, asked to stop or failed, and the identity of every image that joined since the last meeting
(certify/agreement.py), so no image's votes are summed unless every rank holds the same image, request,
settings and weights. All ranks thus send the same counts to the same jobs in the same order and admit the
same images. Noise is keyed by (image, sample), so which rank computes a sample never changes a count: the
rows are one process's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

import numpy as np
import torch

from diffsmooth.engine.certify.agreement import FIELDS, Identity, answered, digest64

NO_STOP, STOP, TERMINATE = 0, 1, 2      # a rank's stop request: none, finish the images in flight, drop them


@dataclass(frozen=True)
class Meeting:
    """What the ranks agreed at one meeting: per window slot whether every rank completed its image; whether any
    rank still works; the strongest stop asked (NO_STOP, STOP, TERMINATE); whether a rank failed; the first field
    (agreement.FIELDS) in which the images that joined since the last meeting differ between ranks, or None."""

    ready: np.ndarray
    busy: bool
    stop: int
    failed: bool
    mismatch: Optional[str]


@dataclass(frozen=True)
class SampleBlocks:
    """This rank's place among `ranks` ranks that share every image's samples; `group`: the torch.distributed
    process group of the counts (None: the default one); `meeting_group`: a CPU (gloo) group of the same ranks
    for the per-batch meeting's flags when `group` is nccl (None: `group`)."""

    rank: int
    ranks: int
    group: object = None
    meeting_group: object = None

    def local(self, sample: int) -> int:
        """How many of this rank's samples lie below global sample index `sample` (its local index there)."""
        return (sample + self.ranks - 1 - self.rank) // self.ranks

    def global_samples(self, local: np.ndarray) -> np.ndarray:
        """The global sample indices of this rank's local indices."""
        return local * self.ranks + self.rank

    def start(self, window: int, run: Dict[str, int], failed: bool, device) -> Tuple[bool, Optional[str]]:
        """The ranks' first meeting of a run: whether a rank failed, and the first of "window", "settings" and
        "weights" that differs between ranks (None: they agree). The window's size fixes every later meeting's."""
        mine = np.asarray([window, run["settings"], run["weights"]], dtype=np.int64)
        top = self.reduce_max(np.concatenate([[int(failed)], mine, -mine]), device)
        differ = [name for k, name in enumerate(("window", "settings", "weights")) if top[1 + k] != -top[4 + k]]
        return bool(top[0]), differ[0] if differ else None

    def step(self, waiting: np.ndarray, busy: bool, stop: int, failed: bool, joined: Sequence[Identity],
             device) -> Meeting:
        """The ranks' one meeting per batch: `waiting` per window slot (1: this rank has not counted all the
        samples the image there asked for; the window's size on every rank), this rank's busy / stop / failed,
        and the identities of the images that joined since the last meeting, one digest per field over all of
        them. One MAX all-reduce of one int64 vector whose length never depends on what a rank holds: a flag's
        maximum is "any rank"; a digest's maximum and the maximum of its negation are the largest and smallest
        any rank holds."""
        joined_digests = np.asarray([digest64(repr([i.digests[f] for i in joined])) for f in range(len(FIELDS))],
                                    dtype=np.int64)
        flags = np.asarray([bool(busy), int(stop), bool(failed)], dtype=np.int64)
        top = self.reduce_max(np.concatenate([np.asarray(waiting, dtype=np.int64), flags, joined_digests,
                                              -joined_digests]), device)
        n, k = len(waiting), len(FIELDS)
        differ = [FIELDS[f] for f in range(k) if top[n + 3 + f] != -top[n + 3 + k + f]]
        return Meeting(top[:n] == 0, bool(top[n]), int(top[n + 1]), bool(top[n + 2]), differ[0] if differ else None)

    def reduce_max(self, values: np.ndarray, device) -> np.ndarray:
        """The element-wise maximum of every rank's `values` (int64), on the meeting's group: CPU tensors on a
        gloo group, `device` tensors otherwise."""
        import torch.distributed as dist
        group = self._meetings
        on = "cpu" if dist.get_backend(group) == "gloo" else device
        tensor = torch.from_numpy(values).to(on)
        with answered():
            dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=group)
        return tensor.cpu().numpy()

    def merge(self, counts: torch.Tensor, bad: torch.Tensor) -> Tuple[np.ndarray, np.ndarray]:
        """Every rank's counts [E, R, K] and non-finite flags [E, R] of the same requests, summed: one
        all-reduce of one int64 tensor on the counts' device, then one copy to the host (the read a single
        process makes there anyway)."""
        import torch.distributed as dist
        flat = torch.cat([counts.reshape(-1), bad.reshape(-1)])
        with answered():
            dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.group)
        host = flat.cpu().numpy()
        n = counts.numel()
        return host[:n].reshape(counts.shape), host[n:].reshape(bad.shape)

    def gather(self, value) -> list:
        """Every rank's `value` (picklable), in rank order, on every rank (a mismatch's or a failure's details)."""
        import torch.distributed as dist
        values = [None] * self.ranks
        with answered():
            dist.all_gather_object(values, value, group=self._meetings)
        return values

    def agree(self, value):
        """Rank 0's `value` on every rank (a picklable object: the images still to run, say)."""
        import torch.distributed as dist
        box = [value]
        group = self._meetings
        src = 0 if group is None else dist.get_global_rank(group, 0)
        with answered():
            dist.broadcast_object_list(box, src=src, group=group)
        return box[0]

    @property
    def _meetings(self):
        """The group of the meetings and of what travels with them (gathers, broadcasts)."""
        return self.meeting_group if self.meeting_group is not None else self.group

    @property
    def writes(self) -> bool:
        """The rank that writes the rows (each image's result is the same on every rank)."""
        return self.rank == 0

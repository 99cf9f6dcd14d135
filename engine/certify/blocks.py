"""One image's samples over torchrun's ranks: every rank runs every image's job (the same decisions, from
the same counts) and computes its own samples of each request, and the ranks sum their counts before the
job reads them (an all-reduce on the counts' own device: gloo on the CPU, nccl on GPUs).

Which rank computes a sample is fixed by its index alone: sample s is rank (s mod ranks)'s. A request of
n samples thus gives every rank n / ranks of them (one more or less), and a rank's samples of an image
form one sequence in its own order (local index j is sample j * ranks + rank), whatever the requests. So
a rank can compute ahead of a look as one process does (the look-ahead of a static batch's free rows: its
next samples, counted when a later request covers them), and a look of an image in flight on 8 ranks
costs each rank an eighth of the rows, or none if its look-ahead already holds them.

The ranks meet once per batch: one all-reduce says which images in flight every rank has completed (their
counts are then summed: a second all-reduce) and whether any rank asked to stop, so all ranks send the
same counts to the same jobs in the same order and admit the same images. Noise is keyed by (image,
sample), so which rank computes a sample never changes a count: the rows are one process's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Tuple

import numpy as np
import torch


@dataclass(frozen=True)
class SampleBlocks:
    """This rank's place among `ranks` ranks that share every image's samples; `group`: the
    torch.distributed process group (None: the default one)."""

    rank: int
    ranks: int
    group: object = None

    def local(self, sample: int) -> int:
        """How many of this rank's samples lie below global sample index `sample` (its local index there)."""
        return (sample + self.ranks - 1 - self.rank) // self.ranks

    def global_samples(self, local: np.ndarray) -> np.ndarray:
        """The global sample indices of this rank's local indices."""
        return local * self.ranks + self.rank

    def step(self, complete: Sequence[bool], busy: bool, stop: bool, device) -> Tuple[np.ndarray, bool, bool]:
        """The ranks' one meeting per batch: for each image in flight (the same list on every rank), whether
        every rank has its samples counted; whether any rank still has work in flight; whether any asked to
        stop. One all-reduce of one int64 tensor."""
        import torch.distributed as dist
        flags = np.asarray([not c for c in complete] + [bool(busy), bool(stop)], dtype=np.int64)
        tensor = torch.from_numpy(flags).to(device)
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.group)
        summed = tensor.cpu().numpy()
        return summed[:-2] == 0, bool(summed[-2]), bool(summed[-1])

    def merge(self, counts: torch.Tensor, bad: torch.Tensor) -> Tuple[np.ndarray, np.ndarray]:
        """Every rank's counts [E, R, K] and non-finite flags [E, R] of the same requests, summed: one
        all-reduce of one int64 tensor on the counts' device, then one copy to the host (the read a single
        process makes there anyway)."""
        import torch.distributed as dist
        flat = torch.cat([counts.reshape(-1), bad.reshape(-1)])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.group)
        host = flat.cpu().numpy()
        n = counts.numel()
        return host[:n].reshape(counts.shape), host[n:].reshape(bad.shape)

    def agree(self, value):
        """Rank 0's `value` on every rank (a picklable object: the images still to run, say)."""
        import torch.distributed as dist
        box = [value]
        src = 0 if self.group is None else dist.get_global_rank(self.group, 0)
        dist.broadcast_object_list(box, src=src, group=self.group)
        return box[0]

    @property
    def writes(self) -> bool:
        """The rank that writes the rows (each image's result is the same on every rank)."""
        return self.rank == 0

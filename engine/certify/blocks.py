"""One image's samples over torchrun's ranks: every rank runs every image's job (the same decisions,
from the same counts), computes one block of each request's samples, and the ranks sum their counts
(one all-reduce on the counts' own device: gloo on the CPU, nccl on GPUs) before the job reads them.

The block rule: a request of `num` samples is cut into one block of ceil(num / ranks) rows per rank
(the last blocks shorter, their rows made up with padding whose votes go nowhere). Every rank thus
plans the same rows for every request, fills the same batches and completes the same requests in the
same batch, so a look's merge is one collective that all ranks reach together: no rank waits on a
merge longer than the slowest rank's batch, and no message but the counts is ever sent. A rank's batch
still packs the blocks of many images (continuous batching). Noise is keyed by (image, sample), so
which rank computes a sample never changes a count: the rows are one process's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import numpy as np
import torch


@dataclass(frozen=True)
class Block:
    """This rank's part of one request: samples first..first+samples-1, planned as `rows` rows (the
    largest block's length: the rows past `samples` are padding)."""

    first: int
    samples: int
    rows: int


@dataclass(frozen=True)
class SampleBlocks:
    """This rank's place among `ranks` ranks that share every image's samples; `group`: the
    torch.distributed process group (None: the default one)."""

    rank: int
    ranks: int
    group: object = None

    def block(self, first: int, num: int) -> Block:
        """This rank's block of the request for samples first..first+num-1."""
        rows = -(-num // self.ranks)
        lo = min(num, self.rank * rows)
        return Block(first + lo, min(num, lo + rows) - lo, rows)

    def merge(self, counts: torch.Tensor, bad: torch.Tensor, stop: bool) -> Tuple[np.ndarray, np.ndarray, bool]:
        """Every rank's counts [E, R, K] and non-finite flags [E, R] of the same requests, summed, and
        whether any rank asked to stop: one all-reduce of one int64 tensor on the counts' device, then
        one copy to the host (the read a single process makes there anyway)."""
        import torch.distributed as dist
        flat = torch.cat([counts.reshape(-1), bad.reshape(-1),
                          torch.tensor([int(stop)], dtype=counts.dtype, device=counts.device)])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.group)
        host = flat.cpu().numpy()
        n, m = counts.numel(), bad.numel()
        return host[:n].reshape(counts.shape), host[n:n + m].reshape(bad.shape), bool(host[-1])

    def agree(self, value):
        """Rank 0's `value` on every rank (a picklable object: the images still to run, say)."""
        import torch.distributed as dist
        box = [value]
        dist.broadcast_object_list(box, src=self.global_rank(0), group=self.group)
        return box[0]

    def global_rank(self, rank: int) -> int:
        import torch.distributed as dist
        return rank if self.group is None else dist.get_global_rank(self.group, rank)

    @property
    def writes(self) -> bool:
        """The rank that writes the rows (each image's result is the same on every rank)."""
        return self.rank == 0

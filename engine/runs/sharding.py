"""Splitting a run over processes: `--shard i/k` (Slurm arrays, no communication: a static share of
the images, merged afterwards) or torchrun (torch.distributed: every rank runs every image and computes
its share of each image's samples, the ranks' counts summed before each look: certify/blocks.py; rank 0
writes the rows). Noise is keyed per (image, sample), so results never depend on the number of
processes or on who computed which sample."""

from __future__ import annotations

import datetime
import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, List, Optional, Sequence

from diffsmooth.engine.certify.blocks import SampleBlocks
from diffsmooth.engine.errors import UserError, first_line

STORE_CONNECT_S = 600.0     # how long a rank tries to reach torchrun's store before it says it cannot


@dataclass(frozen=True)
class ShardPlan:
    """This process's share: every num_shards-th selected image starting at position `shard`."""

    shard: int = 0
    num_shards: int = 1
    distributed: bool = False      # launched by torchrun: ranks meet at a barrier, rank 0 merges
    local_rank: int = 0

    def take(self, indices: Sequence[int]) -> List[int]:
        return list(indices)[self.shard::self.num_shards]

    @property
    def writes(self) -> bool:
        """This process writes result files: every process but torchrun's ranks above 0 (rank 0 writes for all)."""
        return not self.distributed or self.shard == 0

    def blocks(self) -> Optional[SampleBlocks]:
        """Under torchrun, this rank's share of every image's samples; None otherwise."""
        return SampleBlocks(self.shard, self.num_shards) if self.distributed and self.num_shards > 1 else None


def parse_shard(text: str) -> ShardPlan:
    """'i/k' with 0 <= i < k."""
    try:
        i, k = (int(p) for p in text.split("/"))
    except ValueError:
        raise UserError(f"`shard` must look like i/k (e.g. 0/4), got {text!r}") from None
    if not (k >= 1 and 0 <= i < k):
        raise UserError(f"`shard` i/k needs k >= 1 and 0 <= i < k, got {text!r}")
    return ShardPlan(i, k)


def plan_from(shard_option: Optional[str], device: str) -> ShardPlan:
    """--shard if given; else torchrun's WORLD_SIZE/RANK (initialising torch.distributed); else 1 shard."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if shard_option:
        if world > 1:
            raise UserError("use either `shard` or torchrun, not both")
        return parse_shard(shard_option)
    if world <= 1:
        return ShardPlan()
    import torch
    import torch.distributed as dist
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device.startswith("cuda"):
        # Each rank owns one GPU before NCCL starts, so collectives and allocations land on it.
        torch.cuda.set_device(rank_device(ShardPlan(0, world, True, local_rank), device))
    if not dist.is_initialized():
        if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" or os.environ.get("RANK", "0") != "0":
            reach_store()       # torchrun's agent holds the store; without torchrun (srun, spawn) rank 0 starts it
        join_process_group("nccl" if device.startswith("cuda") else "gloo")
    return ShardPlan(dist.get_rank(), dist.get_world_size(), True, local_rank)


def join_process_group(backend: str) -> None:
    """torchrun's process group, its keys under this attempt's own prefix: the rendezvous store outlives a
    restart (`--max-restarts`, with the static and the c10d rendezvous alike), and a restarted worker that
    read the killed attempt's gloo addresses there would connect to ports nobody listens on
    (`connectFullMesh ... Connection refused`). Its timeout must outlast a rank's longest wait: 7 days."""
    import torch.distributed as dist
    timeout = datetime.timedelta(days=7)
    store, rank, world = next(dist.rendezvous("env://", timeout=timeout))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    dist.init_process_group(backend, store=dist.PrefixStore(f"diffsmooth/attempt_{attempt}", store), rank=rank,
                            world_size=world, timeout=timeout)


def reach_store(seconds: Optional[float] = None) -> None:
    """A UserError (one line) unless this rank reaches torchrun's store at MASTER_ADDR:MASTER_PORT within
    `seconds` (default STORE_CONNECT_S, or $DIFFSMOOTH_STORE_CONNECT_S). init_process_group's own timeout,
    which must outlast a rank's longest wait for the others, also bounds its first connection: 7 days."""
    import torch.distributed as dist
    host, port = os.environ.get("MASTER_ADDR", "localhost"), os.environ.get("MASTER_PORT", "")
    seconds = float(os.environ.get("DIFFSMOOTH_STORE_CONNECT_S", STORE_CONNECT_S)) if seconds is None else seconds
    try:
        with _quiet_stderr():                       # c10d logs every failed try with a C++ stack trace
            probe = dist.TCPStore(host, int(port), is_master=False, timeout=datetime.timedelta(seconds=seconds),
                                  wait_for_workers=False)
    except (RuntimeError, ValueError) as exc:       # DistNetworkError and DistStoreError are RuntimeErrors
        rank = os.environ.get("RANK", "?")
        raise UserError(f"torchrun rank {rank} cannot reach the process group's store at {host}:{port or '(unset)'} "
                        f"within {seconds:g} s ({first_line(exc)}): check MASTER_ADDR / MASTER_PORT "
                        f"(--master_addr, --master_port) and that the node holding it runs") from None
    del probe


@contextmanager
def _quiet_stderr() -> Iterator[None]:
    """File descriptor 2 to /dev/null inside (C++ logging writes there, past Python's sys.stderr)."""
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def rank_device(plan: ShardPlan, device: str) -> str:
    """Under torchrun, `cuda` means this rank's own GPU (cuda:LOCAL_RANK); an explicit `cuda:N`
    is kept as given (one GPU per rank is then the user's choice)."""
    return f"cuda:{plan.local_rank}" if plan.distributed and device == "cuda" else device


def wait_for_all(plan: ShardPlan) -> None:
    if plan.distributed:
        import torch.distributed as dist
        dist.barrier()


def finish(plan: ShardPlan) -> None:
    if plan.distributed:
        import torch.distributed as dist
        dist.destroy_process_group()

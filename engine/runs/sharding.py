"""Splitting a run over processes: `--shard i/k` (Slurm arrays, no communication: a static share of
the images, merged afterwards) or torchrun (torch.distributed: every rank runs every image and computes
its share of each image's samples, the ranks' counts summed before each look: certify/blocks.py; rank 0
writes the rows). Noise is keyed per (image, sample), so results never depend on the number of
processes or on who computed which sample."""

from __future__ import annotations

import datetime
import os
import signal
import threading
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, List, Optional, Sequence

from diffsmooth.engine.certify.agreement import answered, rank_timeout_s, use_store
from diffsmooth.engine.certify.blocks import SampleBlocks
from diffsmooth.engine.errors import UserError, first_line

STORE_CONNECT_S = 600.0     # how long a rank tries to reach torchrun's store before it says it cannot


@dataclass(frozen=True)
class ProcessShare:
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
        """Under torchrun, this rank's share of every image's samples (its meetings on a CPU group when the counts
        go over nccl); None otherwise."""
        if not (self.distributed and self.num_shards > 1):
            return None
        return SampleBlocks(self.shard, self.num_shards, meeting_group=meeting_group())


def parse_shard(text: str) -> ProcessShare:
    """'i/k' with 0 <= i < k."""
    try:
        i, k = (int(p) for p in text.split("/"))
    except ValueError:
        raise UserError(f"`shard` must look like i/k (e.g. 0/4), got {text!r}") from None
    if not (k >= 1 and 0 <= i < k):
        raise UserError(f"`shard` i/k needs k >= 1 and 0 <= i < k, got {text!r}")
    return ProcessShare(i, k)


def share_from(shard_option: Optional[str], device: str) -> ProcessShare:
    """--shard if given; else torchrun's WORLD_SIZE/RANK (initialising torch.distributed); else 1 shard."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if shard_option:
        if world > 1:
            raise UserError("use either `shard` or torchrun, not both")
        return parse_shard(shard_option)
    if world <= 1:
        return ProcessShare()
    import torch
    import torch.distributed as dist
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device.startswith("cuda"):
        # Each rank owns one GPU before NCCL starts, so collectives and allocations land on it.
        torch.cuda.set_device(rank_device(ProcessShare(0, world, True, local_rank), device))
    if not dist.is_initialized():
        if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" or os.environ.get("RANK", "0") != "0":
            reach_store()       # torchrun's agent holds the store; without torchrun (srun, spawn) rank 0 starts it
        join_process_group("nccl" if device.startswith("cuda") else "gloo")
    return ProcessShare(dist.get_rank(), dist.get_world_size(), True, local_rank)


class _Groups:
    """The CPU (gloo) group of the per-batch meetings when the process group is nccl (None: the process group)."""

    meeting = None


def independent_share() -> ProcessShare:
    """This process's place among torchrun's ranks (RANK, WORLD_SIZE, LOCAL_RANK) without joining a process group:
    each rank works alone on its own share."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    return ProcessShare(rank, world, False, int(os.environ.get("LOCAL_RANK", "0"))) if world > 1 else ProcessShare()


def meeting_group():
    """The gloo group of the ranks' meetings when the process group is nccl (None: the process group itself)."""
    return _Groups.meeting


def join_process_group(backend: str) -> None:
    """torchrun's process group, its keys under this rendezvous round's own prefix (RoundPrefix). Its timeout,
    the rank timeout (agreement.rank_timeout_s), bounds how long a rank waits for the others at any collective.
    Under nccl the per-batch meetings go over a gloo group of the same ranks (their flags are CPU data)."""
    import torch.distributed as dist
    timeout = datetime.timedelta(seconds=rank_timeout_s())
    store, rank, world = next(dist.rendezvous("env://", timeout=datetime.timedelta(seconds=STORE_CONNECT_S)))
    with RoundPrefix(rank, world) as prefix:
        round_store = dist.PrefixStore(prefix, store)
        dist.init_process_group(backend, store=round_store, rank=rank, world_size=world, timeout=timeout)
    use_store(dist.PrefixStore("notes", round_store), rank, world)
    _Groups.meeting = dist.new_group(backend="gloo", timeout=timeout) if backend == "nccl" else None


class RoundPrefix:
    """A store prefix of this rendezvous round alone. The store outlives a restart (`--max-restarts`) and a
    membership change, and a worker that read an earlier round's gloo addresses there would connect to ports
    nobody listens on (`connectFullMesh ... Connection refused`); torchrun's restart count does not grow on a
    membership change. So rank 0 takes the next round number from a counter in the store and, until the process
    group stands, answers every ticket the other ranks leave: each asks under a key named by a fresh token of its
    own (`join/<token>`), which no earlier round can have written. Every rank reaches the store over its own
    connection (MASTER_ADDR:MASTER_PORT), so the keys never depend on torch's own prefixes."""

    def __init__(self, rank: int, world: int):
        self.rank, self.world = rank, world
        self._done = threading.Event()
        self._server: Optional[threading.Thread] = None

    def __enter__(self) -> str:
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        store = _store_client()
        if self.rank == 0:
            number = store.add("diffsmooth/rounds", 1)
            self._server = threading.Thread(target=self._answer, args=(number,), daemon=True)
            self._server.start()
        else:
            token = uuid.uuid4().hex
            store.set(f"diffsmooth/ticket/{store.add('diffsmooth/tickets', 1)}", token)
            store.wait([f"diffsmooth/join/{token}"], datetime.timedelta(seconds=STORE_CONNECT_S))
            number = int(store.get(f"diffsmooth/join/{token}").decode())
        return f"diffsmooth/attempt_{attempt}/round_{number}"

    def _answer(self, number: int) -> None:
        """Rank 0: answer every ticket in order (stale ones from a dead round too: harmless), until the group stands."""
        store = _store_client()
        position = int(store.get("diffsmooth/served").decode()) if store.check(["diffsmooth/served"]) else 0
        while not self._done.is_set():
            key = f"diffsmooth/ticket/{position + 1}"
            if not store.check([key]):
                self._done.wait(0.02)
                continue
            store.set(f"diffsmooth/join/{store.get(key).decode()}", str(number))
            position += 1
            store.set("diffsmooth/served", str(position))

    def __exit__(self, *exc) -> None:
        self._done.set()
        if self._server is not None:
            self._server.join()


def _store_client():
    """A connection of this process's own to the rendezvous store at MASTER_ADDR:MASTER_PORT."""
    import torch.distributed as dist
    return dist.TCPStore(os.environ.get("MASTER_ADDR", "localhost"), int(os.environ["MASTER_PORT"]), is_master=False,
                         timeout=datetime.timedelta(seconds=STORE_CONNECT_S), wait_for_workers=False)


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


def rank_device(share: ProcessShare, device: str) -> str:
    """Under torchrun, `cuda` means this rank's own GPU (cuda:LOCAL_RANK); an explicit `cuda:N`
    is kept as given (one GPU per rank is then the user's choice)."""
    own = share.distributed or share.local_rank > 0          # torchrun's ranks, shared or independent (independent_share)
    return f"cuda:{share.local_rank}" if own and device == "cuda" else device


def wait_for_all(share: ProcessShare) -> None:
    """Every rank here before any goes on (a rank that never comes: RanksLost within the rank timeout)."""
    if share.distributed:
        import torch.distributed as dist
        with answered():
            dist.barrier()


def keep_launcher_from_restarting() -> None:
    """A person stopped the run (SIGINT / SIGTERM, agreed by every rank): under torchrun with restarts left, ask the
    launcher (this worker's parent, torchrun's agent) to stop too, since it takes any non-zero exit for a failure
    and would start the run again. This process ignores the agent's SIGTERM to its workers and exits on its own."""
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        return
    left = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")) - int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if left <= 0:
        return
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:                    # every rank has printed its line and ignores the agent's SIGTERM before any rank asks
        import torch.distributed as dist
        if dist.is_initialized():
            dist.barrier()
    except Exception:       # noqa: BLE001 - a rank already gone: the launcher stops the rest anyway
        pass
    os.kill(os.getppid(), signal.SIGTERM)


def finish(share: ProcessShare) -> None:
    if share.distributed:
        import torch.distributed as dist
        dist.destroy_process_group()

"""A table under torchrun: every rank runs every phase, pulling images from the process group's store as
`certify` does (engine/runs/sharding.py), and every decision is taken from the merged rows, which every rank
reads after the same barrier, so all ranks decide alike without sending a decision. Rank 0 is the one
writer of the folder's own files (table.json, plan.json, cost.json, race.json, the outputs) and of each
merged result file; each rank writes only its rank files. Without torchrun: one rank, no store, no
barrier, and everything below is a no-op."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence, TypeVar

from diffsmooth.engine.errors import UserError
from diffsmooth.engine.runs.locks import lock_file
from diffsmooth.engine.runs.results import merge_results, settings_path, shard_path
from diffsmooth.engine.runs.row_states import append_state, read_states, states_path
from diffsmooth.engine.runs.sharding import ShardPlan, finish, plan_from, pull_from_store, wait_for_all

T = TypeVar("T")


@dataclass
class Ranks:
    """This process's place among a table's ranks (`plan`: torchrun's, or one process)."""

    plan: ShardPlan = ShardPlan()
    passes: int = 0                             # passes started so far: the same count on every rank

    @classmethod
    def join(cls, device: str) -> "Ranks":
        """torchrun's ranks (the process group started here), or one process."""
        return cls(plan_from(None, device))

    @property
    def distributed(self) -> bool:
        return self.plan.distributed

    @property
    def writer(self) -> bool:
        """The rank that writes the folder's own files and the merged result files."""
        return self.plan.shard == 0

    @property
    def count(self) -> int:
        return self.plan.num_shards

    def barrier(self) -> None:
        wait_for_all(self.plan)

    def agree(self, act: Callable[[], T]) -> T:
        """`act` on the writer only; its result, or its UserError, on every rank."""
        if not self.distributed:
            return act()
        import torch.distributed as dist
        box = [None]
        if self.writer:
            try:
                box = [("ok", act())]
            except UserError as exc:
                box = [("error", str(exc))]
        dist.broadcast_object_list(box, src=0)
        kind, value = box[0]
        if kind == "error":
            raise UserError(value)
        return value

    def same(self, what: str, value) -> None:
        """A UserError on every rank unless every rank holds the same `value` (`what` names it)."""
        if not self.distributed:
            return
        import torch.distributed as dist
        values = [None] * self.count
        dist.all_gather_object(values, value)
        others = sorted({str(v) for v in values if v != values[0]})
        if others:
            raise UserError(f"the ranks see different {what} (rank 0: {values[0]}; another: {others[0]}): start every "
                            f"rank with the same spec and options")

    def gather(self, value) -> list:
        """Every rank's `value`, in rank order, on every rank."""
        if not self.distributed:
            return [value]
        import torch.distributed as dist
        values = [None] * self.count
        dist.all_gather_object(values, value)
        return values

    def claim(self, name: str) -> Optional[Callable[[Sequence[int]], Iterable[int]]]:
        """For a pass about to run: how this rank takes its images (None: all of them). The store's counter is
        the pass's own, so a file run twice in one table (two extensions to one radius) counts afresh."""
        if not self.distributed:
            return None
        self.passes += 1
        return pull_from_store(f"table/{self.passes}/{name}")

    def rank_file(self, merged: Path) -> Path:
        """Where this rank writes the rows of `merged`."""
        return shard_path(merged, self.plan.shard, self.count) if self.distributed else Path(merged)

    def all_files(self, merged: Path) -> list:
        """Every rank's file of `merged`, and `merged` itself."""
        if not self.distributed:
            return [Path(merged)]
        return [shard_path(merged, k, self.count) for k in range(self.count)] + [Path(merged)]

    def merge(self, merged_files: Sequence[Path]) -> None:
        """After a pass: the writer merges every rank's rows (and row states) into each merged file and removes
        the rank files; every rank waits until it has, so all read the same rows next. A pass killed before
        this leaves the rank files, and the table started again reads them (finished rows are never lost)."""
        if not self.distributed or not merged_files:
            return
        self.barrier()
        if self.writer:
            for merged in merged_files:
                # the states before the rows, as a run writes them: a merge killed between the two leaves
                # no merged row without its state
                held = read_states(states_path(merged))
                for part in self.all_files(merged)[:-1]:
                    for index, state in read_states(states_path(part)).items():
                        if index not in held:
                            append_state(states_path(merged), index, state)
                            held[index] = state
                parts = [p for p in self.all_files(merged) if p.is_file() and p.stat().st_size]
                if parts:
                    merge_results(parts, merged)
                for part in self.all_files(merged)[:-1]:
                    # every row and state of the rank's file is in the merged one now: the folder holds what
                    # one process's table holds
                    for path in (part, settings_path(part), states_path(part), lock_file(part)):
                        path.unlink(missing_ok=True)
        self.barrier()

    def finish(self) -> None:
        finish(self.plan)

"""A table under torchrun: every rank runs every phase, every image of it, computing its share of each
image's samples as `certify` does (certify/blocks.py). What the folder decides travels as a message from rank 0
(`agree`: which runs are still to do, the race's recorded decisions) or is checked by digest before use (`same`:
the rows every rank reads after a pass, from which the race decides), and a stop on any rank stops every rank
before the next pass (`agreed_stop`). Rank 0 is the one writer of the folder's own files (table.json, plan.json,
cost.json, race.json, the outputs) and of every result file. Without torchrun: one rank, no barrier, and
everything below is a no-op."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence, TypeVar

from diffsmooth.engine.certify.agreement import answered, digest64
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.runs.locks import lock_file
from diffsmooth.engine.runs.results import merge_results, settings_path, shard_path
from diffsmooth.engine.runs.row_states import append_state, read_states, states_path
from diffsmooth.engine.runs.sharding import ProcessShare, finish, share_from, wait_for_all

T = TypeVar("T")


@dataclass
class Ranks:
    """This process's place among a table's ranks (`plan`: torchrun's, or one process)."""

    plan: ProcessShare = ProcessShare()

    @classmethod
    def join(cls, device: str) -> "Ranks":
        """torchrun's ranks (the process group started here), or one process."""
        return cls(share_from(None, device))

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
        with answered():
            dist.broadcast_object_list(box, src=0)
        kind, value = box[0]
        if kind == "error":
            raise UserError(value)
        return value

    def same(self, what: str, value) -> None:
        """A UserError on every rank unless every rank holds the same `value` (`what` names it)."""
        if not self.distributed:
            return
        values = self.gather(value)
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
        with answered():
            dist.all_gather_object(values, value)
        return values

    def same_rows(self, what: str, rows) -> None:
        """A UserError on every rank unless every rank read the same `rows` (a digest of them is compared)."""
        if self.distributed:
            self.same(what, digest64(repr(rows)))

    def agreed_stop(self, signal_name):
        """The first rank's stop signal name (None: no rank was asked to stop), the same on every rank."""
        if not self.distributed:
            return signal_name
        return next((name for name in self.gather(signal_name) if name), None)

    def all_files(self, merged: Path) -> list:
        """Every rank's file of `merged`, and `merged` itself."""
        if not self.distributed:
            return [Path(merged)]
        return [shard_path(merged, k, self.count) for k in range(self.count)] + [Path(merged)]

    def merge(self, merged_files: Sequence[Path]) -> None:
        """After a pass: every rank waits until rank 0 has written the pass's rows, so all read the same rows
        next. Rank files an earlier release's ranks wrote (images pulled per rank) are merged into each
        merged file (rows and row states) and removed: finished rows are never lost."""
        if not self.distributed or not merged_files:
            return
        self.barrier()
        if self.writer:
            for merged in merged_files:
                if not any(p.is_file() for p in self.all_files(merged)[:-1]):
                    continue
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

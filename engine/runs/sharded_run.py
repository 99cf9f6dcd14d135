"""Run this process's share of a prepared run: its shard file, the run, the barrier, and under
torchrun rank 0's merge of every rank's file into --out.

Under torchrun the ranks pull images from a shared counter (engine/runs/sharding.py), so a rank's
file holds whichever images it ran; a restart resumes from the union of every rank's file."""

from __future__ import annotations

from pathlib import Path

from diffsmooth.engine.runs.dataset_run import run_dataset
from diffsmooth.engine.runs.prepare import PreparedRun
from diffsmooth.engine.runs.results import (
    check_or_record_settings,
    merge_results,
    read_rows,
    shard_path,
)
from diffsmooth.engine.runs.sharding import finish, pull_from_store, wait_for_all


def report_line(summary: dict) -> str:
    """One line saying what a run wrote."""
    state = "interrupted after" if summary["interrupted"] else "wrote"
    return f"{state} {summary['written']} rows ({summary['skipped_done']} already done) to {summary['path']}"


def run_sharded(mode: str, run: PreparedRun, log) -> dict:
    """Certify (or predict) this process's images; `log` takes the progress lines. Returns the summary."""
    s, plan = run.settings, run.plan
    out = s.out if plan.num_shards == 1 else shard_path(s.out, plan.shard, plan.num_shards)
    check_or_record_settings(out, s.recorded(mode))
    indices, claim, skip = plan.take(run.indices), None, frozenset()
    if plan.distributed:
        indices, skip = run.indices, finished_in(rank_files(s.out, plan.num_shards) + [s.out])
        claim = pull_from_store(Path(s.out).name)
        wait_for_all(plan)              # every rank has read the files before any rank writes
    summary = run_dataset(run.smooth, run.dataset, indices, out, mode=mode, n0=s.n0, n=s.n,
                          alpha=s.alpha, batch=s.batch, progress=not s.quiet, sequential=s.sequential_rule(),
                          window=s.window, claim=claim, skip=skip)
    log(report_line(summary))
    wait_for_all(plan)
    if plan.is_merger and not summary["interrupted"]:
        shards = [f for f in rank_files(s.out, plan.num_shards) + [s.out] if _has_rows(f)]
        count = merge_results(shards, s.out)
        log(f"merged {count} rows from {plan.num_shards} ranks into {s.out}")
    elif plan.num_shards > 1 and not plan.distributed:
        log(f"shard {plan.shard}/{plan.num_shards} done; when all are, run "
            f"`diffsmooth merge {s.out} {shard_path(s.out, '*', plan.num_shards)}`")
    finish(plan)
    return summary


def rank_files(out, num_ranks: int) -> list:
    """The result file of every rank (or shard) of a run writing `out`."""
    return [shard_path(out, i, num_ranks) for i in range(num_ranks)]


def finished_in(files) -> frozenset:
    """Indices with a complete row in any of `files` (missing files hold none)."""
    return frozenset(int(row["idx"]) for f in files if _has_rows(f) for row in read_rows(f))


def _has_rows(path) -> bool:
    return Path(path).is_file() and Path(path).stat().st_size > 0

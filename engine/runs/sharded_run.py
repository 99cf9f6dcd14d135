"""Run this process's share of a prepared run: its shard file, the run, the barrier, and under
torchrun rank 0's merge of every rank's file into --out."""

from __future__ import annotations

from diffsmooth.engine.runs.dataset_run import run_dataset
from diffsmooth.engine.runs.prepare import PreparedRun
from diffsmooth.engine.runs.results import (
    check_or_record_settings,
    merge_results,
    shard_path,
)
from diffsmooth.engine.runs.sharding import finish, wait_for_all


def report_line(summary: dict) -> str:
    """One line saying what a run wrote."""
    state = "interrupted after" if summary["interrupted"] else "wrote"
    return f"{state} {summary['written']} rows ({summary['skipped_done']} already done) to {summary['path']}"


def run_sharded(mode: str, run: PreparedRun, log) -> dict:
    """Certify (or predict) this process's images; `log` takes the progress lines. Returns the summary."""
    s, plan = run.settings, run.plan
    out = s.out if plan.num_shards == 1 else shard_path(s.out, plan.shard, plan.num_shards)
    check_or_record_settings(out, s.recorded(mode))
    summary = run_dataset(run.smooth, run.dataset, plan.take(run.indices), out, mode=mode, n0=s.n0, n=s.n,
                          alpha=s.alpha, batch=s.batch, progress=not s.quiet, sequential=s.sequential_rule())
    log(report_line(summary))
    wait_for_all(plan)
    if plan.is_merger and not summary["interrupted"]:
        shards = [shard_path(s.out, i, plan.num_shards) for i in range(plan.num_shards)]
        count = merge_results(shards, s.out)
        log(f"merged {count} rows from {plan.num_shards} ranks into {s.out}")
    elif plan.num_shards > 1 and not plan.distributed:
        log(f"shard {plan.shard}/{plan.num_shards} done; when all are, run "
            f"`diffsmooth merge {s.out} {shard_path(s.out, '*', plan.num_shards)}`")
    finish(plan)
    return summary

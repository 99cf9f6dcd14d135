"""Run a resolved run (engine/runs/resolve.py): build its voter, check a fast path against eager fp32,
and certify the run's images (a `--shard`'s share).

Under torchrun every rank runs every image and computes its share of its samples (certify/blocks.py);
rank 0 writes `out`. Rank files left by an earlier release's torchrun run (images pulled per rank) are
read as finished rows and merged into `out` at the end."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable, Optional

from diffsmooth.engine.backends.registry import stage_backend
from diffsmooth.engine.certify.monte_carlo import MonteCarloPipeline
from diffsmooth.engine.runs.assemble import build_pipeline, check_against_eager, load_models, load_sweep_models
from diffsmooth.engine.runs.dataset_run import Jobs, RunSummary, run_dataset
from diffsmooth.engine.runs.fast_path import FastPath
from diffsmooth.engine.runs.model_set import ModelSet
from diffsmooth.engine.runs.resolve import ResolvedRun
from diffsmooth.engine.runs.results import merge_results, read_rows, shard_path
from diffsmooth.engine.runs.sharding import finish, wait_for_all
from diffsmooth.engine.runs.stage_build import build_stages, build_sweep_stages
from diffsmooth.engine.runs.vote_agreement import design_flip_rate


def build_voter(run: ResolvedRun, log: Callable[[str], None], model_set: Optional[ModelSet] = None) -> MonteCarloPipeline:
    """The run's voter: one configuration's stages or a sweep's, on the asked backend. A compiled or
    reduced-precision torch path is first checked against the same stages in eager fp32 on the first
    selected images (every configuration of a sweep included), a reused one too. Its weights are sealed:
    a run refuses counts read after they change (MonteCarloPipeline.seal_weights). `model_set`: stages
    built by earlier runs (a table's), reused where the architecture matches."""
    r = run.request
    first = run.shards.take(run.indices) or list(run.indices)
    check_images = [(i, run.dataset[i][0]) for i in first[:r.validate_images]]

    def stages(fast: FastPath, precision: str, models=None, model_set=None):
        common = dict(backend=r.backend, device=run.device, precision=precision, onnx_dir=r.onnx_dir, fast=fast,
                      models=models, log=log, batch=run.batch, model_set=model_set)
        if run.is_sweep:
            return build_sweep_stages(run.configurations, run.classifier_paths, run.sources, tuple(run.dataset.image_shape),
                                      run.dataset.num_classes, **common)
        return build_stages(run.configurations[0].config, run.sources, tuple(run.dataset.image_shape), run.dataset.num_classes,
                            **common)

    check = (stage_backend(r.backend).runs_modules and (run.fast.changes_arithmetic or r.precision != "fp32")
             and r.validate_samples > 0)
    models = loaded_models(run) if check else None
    configs = [c.config for c in run.configurations]
    voter = build_pipeline(stages(run.fast, r.precision, models, model_set), r.sigma, r.seed, run.fast, log, configs,
                           r.backend)
    voter.seal_weights()        # a row is written only from the weights built (and checked) here
    if check:
        reference = build_pipeline(stages(FastPath(), "fp32", models), r.sigma, r.seed, FastPath(), log)
        rate = r.expected_flip_rate or design_flip_rate(r.precision, [c.config.name for c in run.configurations])
        check_against_eager(voter, reference, check_images, run.batch, r.validate_samples, rate, log)
    return voter


def loaded_models(run: ResolvedRun):
    """The torch models of the run, loaded once for the run and its eager reference."""
    if run.is_sweep:
        return load_sweep_models(run.configurations, run.classifier_paths, run.sources)
    return load_models(run.configurations[0].config, run.sources)


def execute(run: ResolvedRun, voter: MonteCarloPipeline, log: Callable[[str], None], jobs: Optional[Jobs] = None) -> RunSummary:
    """Certify (or predict) this process's images; `log` takes the progress lines. Holds the run's
    locks (one writer per result file or sweep folder) from before its settings are recorded.
    `jobs`: what each image computes (default: what the run's request asks, from the first sample)."""
    with run.hold_locks():
        return _execute(run, voter, log, jobs or Jobs.of(run.request))


def _execute(run: ResolvedRun, voter: MonteCarloPipeline, log: Callable[[str], None], jobs: Jobs) -> RunSummary:
    r, share = run.request, run.shards
    run.check_resumable(record=True)
    files = list(run.result_files().values())
    indices, skip = share.take(run.indices), frozenset()
    leftovers = [f for f in rank_files(r.out, share.num_shards) if _has_rows(f)] if share.distributed and not run.is_sweep \
        else []
    if leftovers:
        skip = finished_in(leftovers)
    if share.distributed:
        indices = list(run.indices)
        wait_for_all(share)              # rank 0 has recorded the settings before any rank goes on
    summary = run_dataset(voter, dataclasses.replace(run, indices=tuple(indices)), files, jobs, blocks=share.blocks(),
                          skip=skip)
    if share.distributed:
        log(f"{summary.line() if share.writes else f'rank {share.shard}: wrote no rows (rank 0 writes them)'}; "
            f"the {share.num_shards} ranks shared every image's samples, this one counted {summary.samples_counted:,}")
    else:
        log(summary.line())
    wait_for_all(share)
    if share.writes and leftovers and not summary.interrupted:
        count = merge_results(leftovers + ([r.out] if _has_rows(r.out) else []), r.out)
        log(f"merged {count} rows (with an earlier run's rank files) into {r.out}")
    elif share.num_shards > 1 and not share.distributed:
        log(f"shard {share.shard}/{share.num_shards} done; when all are, run "
            f"`diffsmooth merge {r.out} {shard_path(r.out, '*', share.num_shards)}`")
    finish(share)
    return summary


def rank_files(out, num_ranks: int) -> list:
    """The result file of every rank (or shard) of a run writing `out`."""
    return [shard_path(out, i, num_ranks) for i in range(num_ranks)]


def finished_in(files) -> frozenset:
    """Indices with a complete row in any of `files` (missing files hold none). A torn last line is
    left out (its rank cuts it when it opens its file); any other damage is refused."""
    return frozenset(int(row["idx"]) for f in files if _has_rows(f) for row in read_rows(f, torn_tail="ignore"))


def _has_rows(path) -> bool:
    return Path(path).is_file() and Path(path).stat().st_size > 0

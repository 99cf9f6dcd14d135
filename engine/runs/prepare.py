"""From RunSettings to a ready single-configuration run: dataset and selected images, shard plan,
fast path, batch, and a checked Smooth. The result file's recorded settings are checked before
any model is built or compiled."""

from __future__ import annotations

from dataclasses import dataclass

from diffsmooth.engine.base_classifier.methods import MethodConfig
from diffsmooth.engine.certify.core import Smooth
from diffsmooth.engine.errors import UserError, check_alpha
from diffsmooth.engine.runs.assemble import build_checked_smooth
from diffsmooth.engine.runs.fast_path import FastPath, default_batch
from diffsmooth.engine.runs.results import check_or_record_settings, shard_path
from diffsmooth.engine.runs.settings import RunSettings
from diffsmooth.engine.runs.sharding import ShardPlan, plan_from, rank_device
from diffsmooth.engine.runs.sources import resolve_sources


@dataclass
class PreparedRun:
    """A single configuration ready to run; `settings` has the batch and fast path filled in."""

    settings: RunSettings
    dataset: object
    indices: list[int]
    config: MethodConfig
    smooth: Smooth
    plan: ShardPlan


def set_threads(threads) -> None:
    """torch's CPU threads when asked (on a shared machine use fewer)."""
    if threads:
        import torch
        torch.set_num_threads(threads)


def open_dataset(s: RunSettings) -> tuple[str, object, list[int]]:
    """(dataset kind, dataset, selected indices): Cohen's --skip/--max convention."""
    from diffsmooth.engine.data import load_dataset
    kind = s.dataset or ("embedded" if not s.data else None)
    if kind is None:
        raise UserError("`data` given without `dataset`: say which layout it is (cifar10, imagenet, npz, idx)")
    dataset = load_dataset(kind, s.data, split=s.split)
    check_alpha(s.alpha)
    return kind, dataset, dataset.indices_selected(s.skip, s.max_index)


def fast_path_for(s: RunSettings, device: str) -> FastPath:
    """The torch backend's compiled / CUDA-graph / streams choices on `device` (none elsewhere)."""
    if s.backend != "torch":
        return FastPath()
    return FastPath.resolve(device, s.compile, s.cuda_graphs, s.streams, s.fused_attention, s.fused_conv)


def sources_of(s: RunSettings, kind: str, classifier=None):
    """ModelSources of the settings' model options (`classifier` overrides the single one)."""
    return resolve_sources(denoiser=s.denoiser, classifier=classifier or s.classifier_path, preset=s.preset,
                           unet_config=s.unet_config, schedule=s.schedule, diffusion_steps=s.diffusion_steps,
                           arch=s.arch, normalization=s.normalization, stats=s.stats, dataset_kind=kind)


def prepare_single(s: RunSettings, mode: str = "certify", log=None) -> PreparedRun:
    """Dataset, selected indices, method config, Smooth and shard plan of one configuration."""
    set_threads(s.threads)
    kind, dataset, indices = open_dataset(s)
    if not indices:
        raise UserError("no images selected (check `skip` / `max`)")
    config = s.method_config()
    sources = sources_of(s, kind)
    plan = plan_from(s.shard, s.device)
    device = rank_device(plan, s.device)
    fast = fast_path_for(s, device)
    batch = s.batch or default_batch(device, tuple(dataset.image_shape))
    s = s.replace(batch=batch, fast_path=fast.as_dict())
    out = s.out if plan.num_shards == 1 else shard_path(s.out, plan.shard, plan.num_shards)
    check_or_record_settings(out, s.recorded(mode), record=False)
    mine = plan.take(indices)
    first = mine[0] if mine else indices[0]
    smooth = build_checked_smooth(config, sources, tuple(dataset.image_shape), dataset.num_classes,
                                  dataset[first][0], first, batch, backend=s.backend, device=device,
                                  precision=s.precision, seed=s.seed, onnx_dir=s.onnx_dir, fast=fast,
                                  validate_samples=s.validate_samples, expected_flip_rate=s.expected_flip_rate,
                                  check_images=[(i, dataset[i][0]) for i in (mine or indices)[:s.validate_images]],
                                  log=log)
    return PreparedRun(s, dataset, indices, config, smooth, plan)

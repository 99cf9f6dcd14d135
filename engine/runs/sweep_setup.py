"""From RunSettings with several classifiers / sigma' / m / methods at one sigma to a finished
sweep: models loaded once, the denoiser staged once, every configuration voted from its batch."""

from __future__ import annotations

from pathlib import Path

import torch

from diffsmooth.engine.backends.torch_backend import TorchBackend
from diffsmooth.engine.base_classifier.methods import MethodConfig
from diffsmooth.engine.errors import UserError, first_line
from diffsmooth.engine.models import shipped
from diffsmooth.engine.models.checkpoints import load_classifier
from diffsmooth.engine.runs.assemble import load_denoiser_from
from diffsmooth.engine.runs.fast_path import default_batch
from diffsmooth.engine.runs.prepare import (
    fast_path_for,
    open_dataset,
    set_threads,
    sources_of,
)
from diffsmooth.engine.runs.settings import RunSettings
from diffsmooth.engine.runs.sharded_run import report_line
from diffsmooth.engine.runs.sweep import SweepPipeline, plan_entries, run_sweep


def check_sweep_settings(s: RunSettings) -> None:
    """What a sweep cannot do, and every method x sigma' x m combination's parameters."""
    if s.backend != "torch" or s.shard:
        raise UserError("sweeps run on the torch backend in one process (no `backend` onnxruntime/tensorrt "
                        "or `shard` yet)")
    if s.fused_conv:
        raise UserError("`fused_conv` is for single configurations; sweeps run the classifiers unfolded")
    for method in s.method:
        for ls in s.local_sigma:
            for m in s.m:
                MethodConfig(method, s.sigma, m, ls, s.local_noise)


def probe_classes(backend, modules, shape, data_classes) -> int:
    """Classes scored by every classifier (they must agree and cover the data's labels)."""
    counts = set()
    for name, module in modules.items():
        try:
            stage = backend.stage(module, name)
            probe = getattr(stage, "eager", stage)          # no compile for a batch-1 probe
            counts.add(int(probe(torch.full((1, *shape), 0.5, device=backend.device)).shape[1]))
        except RuntimeError as exc:
            raise UserError(f"classifier {name} cannot take images of shape {shape}: "
                            f"{first_line(exc)}") from None
    if len(counts) != 1:
        raise UserError(f"the sweep's classifiers score different numbers of classes: {sorted(counts)}")
    k = counts.pop()
    if data_classes and data_classes > k:
        raise UserError(f"the data has labels up to {data_classes - 1} but the classifiers score only {k} classes")
    return k


def certify_sweep(s: RunSettings, log) -> dict:
    """Several classifiers / sigma' / m / methods at one sigma: denoise once, vote many times.
    --out is a directory with one TSV per configuration and index.json; `log` takes progress lines."""
    check_sweep_settings(s)
    set_threads(s.threads)
    kind, dataset, indices = open_dataset(s)
    sources = sources_of(s, kind)
    if s.classifier:
        paths = {Path(p).stem: p for p in s.classifier}
        if len(paths) != len(s.classifier):
            raise UserError("sweep classifiers need distinct file names (they name the result files)")
        classifiers_for = lambda method, ls: list(paths)
    else:
        paths = {}

        def classifiers_for(method, ls):
            path = shipped.demo_classifier_for(method, s.sigma, ls if ls is not None else 0.0)
            paths[path.stem] = str(path)
            return [path.stem]
    entries = plan_entries(s.method, classifiers_for, s.local_sigma, s.m)
    modules = {name: load_classifier(paths[name], arch=sources.arch, dataset=sources.stats,
                                     normalization=sources.normalization) for name in {e.classifier for e in entries}}
    fast = fast_path_for(s, s.device)
    batch = s.batch or default_batch(s.device, tuple(dataset.image_shape))
    s = s.replace(batch=batch, fast_path=fast.as_dict())
    backend = TorchBackend(s.device, s.precision, compile=fast.compile, cuda_graphs=fast.cuda_graphs)
    purify = None
    if any(e.method != "rs" for e in entries):
        purify = backend.stage(load_denoiser_from(sources).purifier(s.sigma, fast.fused_attention), "denoiser")
    shape = tuple(dataset.image_shape)
    num_classes = probe_classes(backend, modules, shape, dataset.num_classes)
    pipeline = SweepPipeline(entries, modules, purify, backend, s.sigma, shape, num_classes,
                             s.local_noise, seed=s.seed, static_batch=fast.static_batch,
                             compiled_noise=fast.compiled_noise)
    log(f"# sweep: {len(entries)} configurations at sigma={s.sigma}, images={len(indices)} -> {s.out}/")
    summary = run_sweep(pipeline, dataset, indices, s.out, n0=s.n0, n=s.n, alpha=s.alpha, batch=batch,
                        settings=s.recorded("certify"), progress=not s.quiet, sequential=s.sequential_rule(),
                        window=s.window)
    log(report_line(summary))
    return summary

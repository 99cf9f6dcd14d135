"""A preflight from certify's options (`diffsmooth preflight`, each line of `table SPEC --check`) or from a Python
model and data (`model.preflight(data)`): a seeded sample of the selected images, the measurements, the report.
It never writes a file."""

from __future__ import annotations

import dataclasses
import random
import time
from typing import Optional, Sequence, Tuple

import torch
from torch import nn

from diffsmooth.engine.base_classifier.methods import MethodConfig
from diffsmooth.engine.data.base import ImageDataset, load_arrays
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.models.resnet import DATASET_STATS
from diffsmooth.engine.preflight import judge
from diffsmooth.engine.preflight.data_stats import DataStats
from diffsmooth.engine.preflight.findings import PreflightReport
from diffsmooth.engine.preflight.labels import LabelOrder
from diffsmooth.engine.preflight.measure import (
    Sample,
    Sampling,
    classifier_variants,
    denoiser_error,
    input_mode,
    noise_votes,
    predictions,
)
from diffsmooth.engine.runs.assemble import load_models
from diffsmooth.engine.runs.fast_path import default_batch
from diffsmooth.engine.runs.plan import open_run_inputs
from diffsmooth.engine.runs.request import RunRequest

IMAGES = 100                    # images in the sample
SAMPLES = 5                     # noise samples per image


def sample_indices(selected: Sequence[int], images: int, seed: int) -> Tuple[int, ...]:
    """`images` of the selected indices, drawn with `seed` (all of them when there are fewer), in index order."""
    selected = [int(i) for i in selected]
    if len(selected) <= images:
        return tuple(selected)
    return tuple(sorted(random.Random(seed).sample(selected, images)))


def preflight_models(config: MethodConfig, classifier: nn.Module, denoiser, sample: Sample, how: Sampling, *,
                     stats: Optional[str] = None, title: str = "", published: Optional[float] = None) -> PreflightReport:
    """The report on loaded modules (which the stages may move to `how.device`: pass copies you keep nothing else
    in) and the sample (its images, labels and dataset indices, the noise keys)."""
    start = time.perf_counter()
    if how.samples < 1:
        raise UserError(f"`samples` must be >= 1, got {how.samples}")
    images, indices = sample.x, sample.indices
    if images.dim() != 4 or len(sample.labels) != images.shape[0] or len(indices) != images.shape[0]:
        raise UserError(f"preflight needs images [N,C,H,W] with one label and index each, got {tuple(images.shape)}")
    labels = torch.as_tensor(sample.labels, dtype=torch.int64).cpu()
    report = PreflightReport(title or f"{config.method} at {judge.noise_settings(config)}")
    data = DataStats.of(images, labels)
    data.report(report)
    x = images.detach().to(torch.float32).cpu()
    sample = Sample(x, labels, tuple(int(i) for i in indices))
    how = dataclasses.replace(how, batch=how.batch or default_batch(how.device, tuple(x.shape[1:])))
    classifier = classifier.eval()
    variants = classifier_variants(classifier, stats)
    given = input_mode(classifier)
    clean = {mode: predictions(module, x, how.device, how.batch)
             for mode, module in (variants or {"given": classifier}).items()}
    mine = clean.get(given) if given else clean["given"]
    if mine is None:
        raise UserError(f"the classifier cannot take images {list(x.shape[1:])}{layout_hint(x)}")
    noise = noise_votes(config, classifier, denoiser, sample, how, variants)
    report.measured.update(images=len(labels), classes=noise.classes, clean_accuracy=float((mine == labels).double().mean()))
    report.add("clean", f"the classifier's accuracy on the clean images: {100 * report.measured['clean_accuracy']:.1f}%"
                        f" ({noise.classes} classes)")
    if int(labels.max()) >= noise.classes:
        report.add("labels", f"the data's labels go up to {int(labels.max())} but the classifier scores {noise.classes} "
                             f"classes", warning=True, fix="the classifier trained on this data's classes")
    judge.report_noise(report, config, noise, labels)
    judge.report_normalization(report, clean, noise, given, labels, judged=data.pixel_range() == "[0, 1]")
    order = LabelOrder.of(labels.numpy(), mine.numpy(), max(noise.classes, int(labels.max()) + 1))
    report.measured["labels"] = {"identity": order.identity, "best": order.best,
                                 "moved": {str(a): b for a, b in order.moved.items()}}
    order.report(report)
    judge.report_scale(report, config, noise, given, labels)
    if config.uses_denoiser:
        judge.report_denoiser(report, denoiser_error(denoiser, sample, config.sigma, how), config.sigma)
    if published is not None:
        judge.report_published(report, published)
    report.seconds = time.perf_counter() - start
    return report


def preflight_request(request: RunRequest, images: int = IMAGES, samples: int = SAMPLES,
                      published: Optional[float] = None) -> PreflightReport:
    """The preflight of one certify run (its model, data and method options)."""
    start = time.perf_counter()
    if request.is_sweep:
        raise UserError("preflight checks one configuration: give `method`, `classifier`, `local_sigma` and `m` "
                        "once each")
    kind, dataset, selected, sources = open_run_inputs(request)
    config = request.method_config()
    denoiser, classifier = load_models(config, sources)
    indices = sample_indices(selected, images, request.seed)
    x, y = load_arrays(dataset, indices)
    title = (f"{config.method} at {judge.noise_settings(config)} on {kind} ({len(indices)} of {len(selected)} selected "
             f"images, drawn with seed {request.seed}; {request.device})")
    how = Sampling(samples, request.seed, request.device, request.batch or 0)
    report = preflight_models(config, classifier, denoiser, Sample(x, y, indices), how, stats=sources.stats,
                              title=title, published=published)
    report.seconds = time.perf_counter() - start
    return report


def guess_stats(classifier: nn.Module, shape: Tuple[int, ...]) -> str:
    """The statistics table of a loaded classifier's own input layer, else the usual one for images of `shape`."""
    layer = getattr(classifier, "normalization", None)
    mean = getattr(layer, "mean", None)
    if mean is not None:
        for name, (table_mean, _) in DATASET_STATS.items():
            if len(table_mean) == mean.numel() and torch.allclose(mean.flatten().cpu(), torch.tensor(table_mean)):
                return name
    if shape[0] == 1:
        return "fashion-mnist"
    return "cifar10" if shape[-1] <= 64 else "imagenet"


def layout_hint(x: torch.Tensor) -> str:
    """A hint when images [N, A, B, C] look channels-last (C of 1 or 3 last, A not): the engine takes [N,C,H,W]."""
    if x.dim() == 4 and x.shape[-1] in (1, 3) and x.shape[1] not in (1, 3):
        return (": they look channels-last [N,H,W,C]; give them as [N,C,H,W] (for a tensor x: "
                "x.permute(0, 3, 1, 2))")
    return ""


def sample_of(data, images: int, seed: int, skip: int = 1, max_index: Optional[int] = None):
    """(images [N,C,H,W], labels [N], indices) of a seeded sample of `data`: a dataset of the engine
    (diffsmooth.load_dataset), a pair (images, labels) of tensors or arrays, or any sequence of (image, label)."""
    if isinstance(data, ImageDataset):
        selected = data.indices_selected(skip, max_index)
    elif isinstance(data, (tuple, list)) and len(data) == 2 and not isinstance(data[0], (tuple, list)):
        tensor, labels = torch.as_tensor(data[0]), torch.as_tensor(data[1])
        if tensor.dim() != 4 or labels.dim() != 1 or len(labels) != tensor.shape[0]:
            raise UserError(f"data: images [N,C,H,W] and labels [N], got {tuple(tensor.shape)} and {tuple(labels.shape)}")
        if layout_hint(tensor):
            raise UserError(f"data: images [N,C,H,W], got {tuple(tensor.shape)}{layout_hint(tensor)}")
        stop = len(labels) if max_index is None else min(max_index, len(labels))
        indices = sample_indices(range(0, stop, skip), images, seed)
        pick = torch.as_tensor(indices, dtype=torch.int64)
        return tensor[pick], labels[pick].to(torch.int64), indices
    else:
        stop = len(data) if max_index is None else min(max_index, len(data))
        selected = list(range(0, stop, skip))
    if not selected:
        raise UserError("no images selected (check `skip` / `max_index`)")
    indices = sample_indices(selected, images, seed)
    if isinstance(data, ImageDataset):
        x, y = load_arrays(data, indices)
    else:
        pairs = [data[i] for i in indices]
        x = torch.stack([torch.as_tensor(p[0]) for p in pairs])
        y = torch.as_tensor([int(p[1]) for p in pairs], dtype=torch.int64)
    return x, y, indices

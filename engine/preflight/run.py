"""A preflight from certify's options (`diffsmooth preflight`, each line of `table SPEC --check`) or from a Python
model and data (`model.preflight(data)`): a seeded sample of the selected images, the measurements, the report.
It never writes a file."""

from __future__ import annotations

import dataclasses
import random
import time
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn

from diffsmooth.engine.base_classifier.methods import MethodConfig
from diffsmooth.engine.data.base import ImageDataset, load_arrays
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.models.resnet import DATASET_STATS
from diffsmooth.engine.preflight import judge
from diffsmooth.engine.preflight.data_stats import DataStats
from diffsmooth.engine.preflight.findings import PreflightReport
from diffsmooth.engine.preflight.labels import MIN_PER_LABEL, LabelOrder
from diffsmooth.engine.preflight.measure import (
    ChannelsSwapped,
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
from diffsmooth.engine.runs.request import RunRequest
from diffsmooth.engine.runs.resolve import RunInputs, open_run_inputs

IMAGES = 100                    # images in the noise sample
SAMPLES = 5                     # noise samples per image


def sample_indices(selected: Sequence[int], images: int, seed: int,
                   labels: Optional[Sequence[int]] = None) -> Tuple[int, ...]:
    """`images` of the selected indices drawn with `seed` (all of them when there are fewer), in index order; with
    their `labels`, stratified: the labels take turns (in a seeded order), each giving a random image of its own."""
    selected = [int(i) for i in selected]
    if len(selected) <= images:
        return tuple(selected)
    rng = random.Random(seed)
    if labels is None:
        return tuple(sorted(rng.sample(selected, images)))
    by_label: Dict[int, List[int]] = {}
    for index, label in zip(selected, labels):
        by_label.setdefault(int(label), []).append(index)
    for pool in by_label.values():
        rng.shuffle(pool)
    turns = sorted(by_label)
    rng.shuffle(turns)
    picked: List[int] = []
    for depth in range(max(len(pool) for pool in by_label.values())):
        picked += [by_label[label][depth] for label in turns if depth < len(by_label[label])][:images - len(picked)]
        if len(picked) >= images:
            break
    return tuple(sorted(picked))


def clean_indices(labels: np.ndarray, images: int, seed: int) -> Tuple[int, ...]:
    """The clean checks' images over the whole data (not the table's selection): MIN_PER_LABEL per label or more,
    so that there are at least `images` of them, stratified by label."""
    present = len(np.unique(labels))
    per_label = max(MIN_PER_LABEL, -(-images // max(present, 1)))
    return sample_indices(range(len(labels)), per_label * present, seed + 1, labels.tolist())


_CLEAN_CACHE: Dict[tuple, Tuple[torch.Tensor, torch.Tensor]] = {}


def clean_sample(dataset: ImageDataset, images: int, seed: int) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
    """(images, labels) of the clean checks, None where the data's labels cannot be read without decoding; the last
    one is kept, since a table's preflight asks for the same images once per line and sigma (decoding ImageNet)."""
    labels = dataset.labels()
    if labels is None:
        return None
    indices = clean_indices(labels, images, seed)
    key = (type(dataset).__name__, getattr(dataset, "root", None), dataset.name, dataset.image_shape, len(dataset),
           indices)
    if key not in _CLEAN_CACHE:
        _CLEAN_CACHE.clear()
        _CLEAN_CACHE[key] = load_arrays(dataset, indices)
    return _CLEAN_CACHE[key]


def _clean_checks(report: PreflightReport, classifier: nn.Module, sample: Sample, how: Sampling,
                  stats: Optional[str]) -> Tuple[Dict[str, Optional[torch.Tensor]], torch.Tensor, Optional[str]]:
    """The classifier's clean predictions under each normalisation (and the channels reversed) on the clean
    sample: ({mode: predictions}, the labels, the given mode)."""
    x, labels = sample.clean if sample.clean is not None else (sample.x, sample.labels)
    x, labels = x.detach().to(torch.float32).cpu(), torch.as_tensor(labels, dtype=torch.int64).cpu()
    variants = classifier_variants(classifier, stats)
    given = input_mode(classifier)
    clean = {mode: predictions(module, x, how.device, how.batch)
             for mode, module in (variants or {"given": classifier}).items()}
    mine = clean.get(given) if given else clean["given"]
    if mine is None:
        raise UserError(f"the classifier cannot take images {list(x.shape[1:])}{layout_hint(x)}")
    report.measured.update(clean_images=len(labels), clean_accuracy=float((mine == labels).double().mean()))
    if x.shape[1] == 3:
        swapped = predictions(ChannelsSwapped(classifier), x, how.device, how.batch)
        if swapped is not None:
            judge.report_channels(report, mine, swapped, labels)
    return clean, labels, given


def preflight_models(config: MethodConfig, classifier: nn.Module, denoiser, sample: Sample, how: Sampling, *,
                     stats: Optional[str] = None, title: str = "", published: Optional[float] = None) -> PreflightReport:
    """The report on loaded modules (which the stages may move to `how.device`: pass copies you keep nothing else
    in) and the sample (its images, labels and dataset indices, the noise keys; its clean images)."""
    start = time.perf_counter()
    if how.samples < 1:
        raise UserError(f"`samples` must be >= 1, got {how.samples}")
    images, indices = sample.x, sample.indices
    if images.dim() != 4 or len(sample.labels) != images.shape[0] or len(indices) != images.shape[0]:
        raise UserError(f"preflight needs images [N,C,H,W] with one label and index each, got {tuple(images.shape)}")
    labels = torch.as_tensor(sample.labels, dtype=torch.int64).cpu()
    report = PreflightReport(title or f"{config.name} at {judge.noise_settings(config)}")
    data = DataStats.of(images, labels)
    data.report(report)
    if judge.report_units(report, config):
        report.seconds = time.perf_counter() - start
        return report
    sample = dataclasses.replace(sample, x=images.detach().to(torch.float32).cpu(), labels=labels,
                                 indices=tuple(int(i) for i in indices))
    how = dataclasses.replace(how, batch=how.batch or default_batch(how.device, tuple(images.shape[1:])))
    classifier = classifier.eval()
    clean, clean_labels, given = _clean_checks(report, classifier, sample, how, stats)
    noise = noise_votes(config, classifier, denoiser, sample, how, classifier_variants(classifier, stats))
    report.measured.update(images=len(labels), classes=noise.classes)
    report.add("clean", f"the classifier's accuracy on {len(clean_labels)} clean images: "
                        f"{100 * report.measured['clean_accuracy']:.1f}% ({noise.classes} classes)")
    if int(labels.max()) >= noise.classes:
        report.add("labels", f"the data's labels go up to {int(labels.max())} but the classifier scores {noise.classes} "
                             f"classes", warning=True, fix="the classifier trained on this data's classes")
    judge.report_noise(report, config, noise, labels)
    judge.report_normalization(report, clean, clean_labels, noise, labels, given, judged=data.pixel_range() == "[0, 1]")
    _report_labels(report, clean_labels, clean.get(given) if given else clean["given"], noise.classes, how.seed)
    judge.report_training_noise(report, config, noise, given, labels)
    if config.purifier.denoises:
        judge.report_denoiser(report, denoiser_error(denoiser, sample, config.sigma, how), config.sigma)
    if published is not None:
        half = None
        if published / 100 > report.measured["r0_upper"]:       # a gap: would half the sigma reach the paper?
            votes = noise_votes(config.replace(sigma=config.sigma / 2), classifier, denoiser, sample, how, {})
            half = judge.r0_upper_bound((votes.votes == labels.unsqueeze(1)).sum(1).numpy(), how.samples)
        judge.report_published(report, published, half)
    judge.report_chance(report, (clean[given] if given else clean["given"]).eq(clean_labels).double().numpy(),
                        noise.classes)
    report.seconds = time.perf_counter() - start
    return report


def _report_labels(report: PreflightReport, labels: torch.Tensor, mine: torch.Tensor, classes: int, seed: int) -> None:
    classes = max(classes, int(labels.max()) + 1)
    order = LabelOrder.of(labels.numpy(), mine.numpy(), classes)
    report.measured["labels"] = {"identity": order.identity, "best": order.best, "per_label": order.per_label,
                                 "moved": {str(a): b for a, b in order.moved.items()}}
    order.report(report, LabelOrder.crossfit(labels.numpy(), mine.numpy(), classes, seed))


def preflight_request(request: RunRequest, images: int = IMAGES, samples: int = SAMPLES,
                      published: Optional[float] = None, inputs: Optional[RunInputs] = None) -> PreflightReport:
    """The preflight of one certify run (its model, data and method options); `inputs`: what it reads, opened
    already (a table's; None: opened here)."""
    start = time.perf_counter()
    if request.is_sweep:
        raise UserError("preflight checks one configuration: give `method`, `classifier`, `local_sigma` and `m` "
                        "once each")
    kind, dataset, selected, sources = inputs if inputs is not None else open_run_inputs(request)
    config = request.method_config()
    denoiser, classifier = load_models(config, sources)
    labels = dataset.labels()
    indices = sample_indices(selected, images, request.seed, None if labels is None else labels[selected].tolist())
    x, y = load_arrays(dataset, indices)
    clean = clean_sample(dataset, images, request.seed)
    title = (f"{config.name} at {judge.noise_settings(config)} on {kind} ({len(indices)} of {len(selected)} selected "
             f"images, drawn with seed {request.seed}; {request.device})")
    how = Sampling(samples, request.seed, request.device, request.batch or 0)
    report = preflight_models(config, classifier, denoiser, Sample(x, y, indices, clean), how, stats=sources.stats,
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


def sample_of(data, images: int, seed: int, skip: int = 1, max_index: Optional[int] = None) -> Sample:
    """A seeded sample of `data`, stratified by label where the labels can be read without decoding: a dataset of
    the engine (diffsmooth.load_dataset), a pair (images, labels) of tensors or arrays, or any sequence of
    (image, label) (its noise sample serves the clean checks)."""
    if isinstance(data, ImageDataset):
        selected, labels = data.indices_selected(skip, max_index), data.labels()
    elif isinstance(data, (tuple, list)) and len(data) == 2 and not isinstance(data[0], (tuple, list)):
        tensor, labels = torch.as_tensor(data[0]), torch.as_tensor(data[1])
        if tensor.dim() != 4 or labels.dim() != 1 or len(labels) != tensor.shape[0]:
            raise UserError(f"data: images [N,C,H,W] and labels [N], got {tuple(tensor.shape)} and {tuple(labels.shape)}")
        if layout_hint(tensor):
            raise UserError(f"data: images [N,C,H,W], got {tuple(tensor.shape)}{layout_hint(tensor)}")
        stop = len(labels) if max_index is None else min(max_index, len(labels))
        every = labels.to(torch.int64).numpy()
        indices = sample_indices(range(0, stop, skip), images, seed, every[0:stop:skip].tolist())
        pick = torch.as_tensor(indices, dtype=torch.int64)
        both = torch.as_tensor(clean_indices(every, images, seed), dtype=torch.int64)
        return Sample(tensor[pick], labels[pick].to(torch.int64), indices, (tensor[both], labels[both].to(torch.int64)))
    else:
        stop = len(data) if max_index is None else min(max_index, len(data))
        selected, labels = list(range(0, stop, skip)), None
    if not selected:
        raise UserError("no images selected (check `skip` / `max_index`)")
    indices = sample_indices(selected, images, seed, None if labels is None else labels[selected].tolist())
    if isinstance(data, ImageDataset):
        x, y = load_arrays(data, indices)
        return Sample(x, y, indices, clean_sample(data, images, seed))
    pairs = [data[i] for i in indices]
    x = torch.stack([torch.as_tensor(p[0]) for p in pairs])
    y = torch.as_tensor([int(p[1]) for p in pairs], dtype=torch.int64)
    return Sample(x, y, indices)

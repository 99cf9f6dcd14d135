"""The Python API: smoothed classifiers built from modules, in the style of Cohen et al.'s `Smooth`
and of diffusers' pipelines.

    model = DiffSmooth(denoiser=..., classifier=..., sigma=0.5, local_sigma=0.25, m=5)
    certificate = model.certify(x, n0=100, n=10_000, alpha=0.001, image_index=i)
    model.certify_dataset(dataset, "results.tsv", n0=100, n=10_000, alpha=0.001)

`RandomizedSmoothing` (Cohen et al.: no denoiser), `DenoisedSmoothing` (DDS: one-shot denoise, plain
classifier) and `DiffSmooth` (denoise, then local smoothing over m noises of std sigma') run on the
same engine as the command line: noise keyed by (seed, image index, sample index), continuous
batching, and on a compiled or reduced-precision path the agreement check against eager fp32. Each
object runs its own copy of the modules it is given (SmoothedClassifier says what that means).
"""

from __future__ import annotations

import copy
from contextlib import nullcontext
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch
from torch import nn

from diffsmooth.engine.base_classifier.denoise import DiffusionDenoiser, load_denoiser
from diffsmooth.engine.base_classifier.methods import MethodConfig, method_named, method_names
from diffsmooth.engine.base_classifier.methods.config import OPTION_ALIASES
from diffsmooth.engine.base_classifier.methods.head import Head
from diffsmooth.engine.base_classifier.methods.purifier import Purifier
from diffsmooth.engine.certify.cohen import Certificate, check_certify_parameters
from diffsmooth.engine.certify.monte_carlo import MonteCarloPipeline
from diffsmooth.engine.certify.smooth import Smooth, require_image_index
from diffsmooth.engine.choices import (
    DEFAULT_ALPHA,
    DEFAULT_N,
    DEFAULT_N0,
    DEFAULT_SEED,
)
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.models import shipped
from diffsmooth.engine.models.checkpoints import load_classifier
from diffsmooth.engine.preflight.findings import PreflightReport
from diffsmooth.engine.preflight.measure import Sampling
from diffsmooth.engine.preflight.run import IMAGES, SAMPLES, guess_stats, preflight_models, sample_of
from diffsmooth.engine.runs.assemble import build_pipeline, check_against_eager
from diffsmooth.engine.runs.dataset_run import Images, Jobs, RunSummary, run_dataset
from diffsmooth.engine.runs.fast_path import VALIDATE_IMAGES, FastPath, default_batch
from diffsmooth.engine.runs.locks import hold_lock
from diffsmooth.engine.runs.results import RADIUS_FORMAT, RADIUS_FORMAT_KEY, check_or_record_settings, shard_path
from diffsmooth.engine.runs.sharding import independent_share, rank_device, share_from, wait_for_all
from diffsmooth.engine.runs.stage_build import build_stages
from diffsmooth.engine.runs.vote_agreement import design_flip_rate
from diffsmooth.engine.stages.weights import OwnedModule

RANK_MODES = ("shared", "independent")      # under torchrun: each image's samples over all ranks, or each rank alone


class SmoothedClassifier:
    """g(x) = the most probable vote of a base classifier under N(x, sigma^2 I), on the engine.

    `device`, `precision` and `compile` choose the torch execution (compile defaults to on for CUDA;
    a compiled or fp16/bf16 path is checked against eager fp32 on the first VALIDATE_IMAGES images it
    certifies); `seed` keys the noise; `batch` is the number of noisy samples per batch (default: the
    device's).

    The object certifies its own eval-mode copy of `classifier` and `denoiser`, taken when it is built:
    building and running it never move, convert or switch the modules passed in, so one module can back
    several objects on different devices or precisions. Once the modules passed in hold other weights
    than the copy (trained further, loaded, cast), every call refuses with one line: build a new object
    to certify them. Moving them to another device changes nothing and is allowed.

    The method's settings are keywords (`DiffSmooth(..., m=5, local_sigma=0.25)`), or its parts come configured:
    `SmoothedClassifier(purifier=OneShotPurifier(), head=LocalSmoothingHead(m=5, local_sigma=0.25), classifier=...,
    denoiser=..., sigma=0.5)` is the registered method that pairs them (here DiffSmooth), with their settings.

    Under torchrun (WORLD_SIZE > 1), `ranks` says how the ranks share the work; `device="cuda"` is each rank's
    own GPU either way.
    - "shared" (the default): every rank computes its share of each image's samples and every call returns the
      same result on every rank (the ranks' counts are summed before each look: certify/blocks.py), so every rank
      must make the same calls in the same order. Before any image's votes are summed the ranks compare its
      pixels, index, request, settings and weights; a rank holding other work stops every rank with one line.
      `certify_dataset`'s file is written by rank 0.
    - "independent": each rank certifies the calls it makes alone (no process group is joined), each certificate
      one process's for that image; `certify_dataset` certifies this rank's share of the images (every
      WORLD_SIZE-th, from RANK) into its own file OUT.shard-RANK-of-WORLD_SIZE.tsv (`diffsmooth merge` joins
      them)."""

    method = ""

    def __init__(self, *, classifier: nn.Module, sigma: float, denoiser: Optional[DiffusionDenoiser] = None,
                 device: str = "cpu", precision: str = "fp32", compile: Optional[bool] = None, seed: int = DEFAULT_SEED,
                 batch: Optional[int] = None, **settings):
        if not isinstance(classifier, nn.Module):
            raise UserError("`classifier` must be a torch module (see diffsmooth.load_classifier)")
        ranks = settings.pop("ranks", "shared")         # an execution keyword beside the method's own settings
        parts = {name: settings.pop(name) for name in PART_KEYWORDS if name in settings}
        self.config = composed_config(self.method, sigma, parts, settings) if parts else \
            method_config(self.method, sigma, settings)                 # an unknown method: one line
        self.method = self.config.name
        denoises = self.config.purifier.denoises
        if denoises and not isinstance(denoiser, DiffusionDenoiser):
            raise UserError(f"{type(self).__name__} needs `denoiser` (see diffsmooth.load_denoiser)")
        given = {"classifier": classifier, "denoiser": denoiser if denoises else None}
        self._given = {name: OwnedModule(name, module) for name, module in given.items() if module is not None}
        self.classifier = self._given["classifier"].copy
        self.denoiser = self._given["denoiser"].copy if "denoiser" in self._given else None
        if ranks not in RANK_MODES:
            raise UserError(f"`ranks` must be one of {', '.join(RANK_MODES)}, got {ranks!r}")
        self.ranks = ranks
        self.shards = share_from(None, device) if ranks == "shared" else independent_share()
        device = rank_device(self.shards, device)
        self.device, self.precision, self.seed = device, precision, int(seed)
        self.fast = FastPath.resolve(device, compile)
        self.batch = batch
        self._smooth: Dict[Tuple[int, ...], Smooth] = {}
        self._reference: Dict[Tuple[int, ...], MonteCarloPipeline] = {}
        self._checked: Dict[Tuple[int, ...], List[int]] = {}

    @property
    def sigma(self) -> float:
        return self.config.sigma

    def smooth_for(self, image_shape: Tuple[int, ...], first: Optional[Tuple[int, torch.Tensor]] = None) -> Smooth:
        """The Smooth of one image shape, built once; on a fast path, `first` (index, image) is checked
        against eager fp32 until VALIDATE_IMAGES images of this shape have been."""
        for owned in self._given.values():
            owned.refuse_if_changed(type(self).__name__)
        shape = tuple(int(d) for d in image_shape)
        if shape not in self._smooth:
            pipeline = self._pipeline(shape, self.fast, self.precision)
            pipeline.seal_weights()         # no certificate from weights other than those built (and checked)
            self._smooth[shape] = Smooth(pipeline, self.shards.blocks())
            self._checked[shape] = []
        checked = self._checked[shape]
        if self.checks_against_eager and first is not None and len(checked) < VALIDATE_IMAGES and first[0] not in checked:
            if shape not in self._reference:
                self._reference[shape] = self._pipeline(shape, FastPath(), "fp32")
            check_against_eager(self._smooth[shape].pipeline, self._reference[shape], [first], self.batch_for(shape),
                                expected_flip_rate=design_flip_rate(self.precision, [self.config.name]))
            checked.append(first[0])
            if len(checked) == VALIDATE_IMAGES:
                del self._reference[shape]          # its memory back; the weights stay sealed
        return self._smooth[shape]

    @property
    def checks_against_eager(self) -> bool:
        """Whether its path (compiled, other kernels, fp16 / bf16) is checked against eager fp32 before it certifies."""
        return self.fast.changes_arithmetic or self.precision != "fp32"

    def _pipeline(self, shape: Tuple[int, ...], fast: FastPath, precision: str) -> MonteCarloPipeline:
        """The torch pipeline of one image shape, built as the command line builds it (every fast-path setting)."""
        stages = build_stages(self.config, None, shape, device=self.device, precision=precision, fast=fast,
                              models=(self.denoiser, self.classifier), batch=self.batch_for(shape))
        return build_pipeline(stages, self.sigma, self.seed, fast, configs=[self.config])

    def batch_for(self, image_shape: Tuple[int, ...]) -> int:
        return self.batch or default_batch(self.device, tuple(image_shape))

    def certify(self, x: torch.Tensor, *, n0: int = DEFAULT_N0, n: int = DEFAULT_N, alpha: float = DEFAULT_ALPHA,
                image_index: Optional[int] = None) -> Certificate:
        """CERTIFY x ([C,H,W] in [0,1]): the prediction and a radius valid with probability >= 1 - alpha
        (prediction -1 and radius 0.0 when it abstains). `image_index` keys the noise: give each image
        its own (its dataset index)."""
        index = require_image_index(image_index)
        check_certify_parameters(n0, n, alpha)
        x = _image(x)
        return self.smooth_for(x.shape, (index, x)).certify(x, n0, n, alpha, self.batch_for(x.shape), image_index=index)

    def predict(self, x: torch.Tensor, *, n: int = 1000, alpha: float = DEFAULT_ALPHA, image_index: Optional[int] = None) -> int:
        """PREDICT x: the class, or -1 (abstain); wrong with probability at most alpha otherwise."""
        index = require_image_index(image_index)
        x = _image(x)
        return self.smooth_for(x.shape, (index, x)).predict(x, n, alpha, self.batch_for(x.shape), image_index=index)

    def certify_dataset(self, dataset, out, *, n0: int = DEFAULT_N0, n: int = DEFAULT_N, alpha: float = DEFAULT_ALPHA,
                        skip: int = 1,
                        max_index: Optional[int] = None, progress: bool = False) -> RunSummary:
        """CERTIFY every `skip`-th image of a dataset (diffsmooth.load_dataset) below `max_index` into
        the reference TSV `out` (idx label predict radius correct time), one row per finished image;
        a rerun with the same settings resumes after the rows already there."""
        check_certify_parameters(n0, n, alpha)
        indices = dataset.indices_selected(skip, max_index)
        if not indices:
            raise UserError("no images selected (check `skip` / `max_index`)")
        shape = tuple(dataset.image_shape)
        settings = dict(self.config.as_dict(), api=type(self).__name__, mode="certify", n0=n0, n=n, alpha=alpha,
                        seed=self.seed, batch=self.batch_for(shape), precision=self.precision,
                        fast_path=self.fast.as_dict(), device_type=torch.device(self.device).type,
                        dataset=getattr(dataset, "name", type(dataset).__name__))
        settings[RADIUS_FORMAT_KEY] = RADIUS_FORMAT
        if self.ranks == "independent" and self.shards.num_shards > 1:      # this rank's images, into its own file
            indices = self.shards.take(indices)
            out = shard_path(out, self.shards.shard, self.shards.num_shards)
            if not indices:
                raise UserError(f"rank {self.shards.shard} of {self.shards.num_shards} has no image of the selection")
        writes = self.shards.writes
        with hold_lock(out) if writes else nullcontext():       # one writer per result file (engine/runs/locks.py)
            check_or_record_settings(out, settings, record=False)
            for index in indices[:VALIDATE_IMAGES]:     # the check's images: the first selected, as the CLI's
                smooth = self.smooth_for(shape, (index, dataset[index][0]))
            check_or_record_settings(out, settings, record=writes)
            summary = run_dataset(smooth.pipeline, Images(dataset, indices, self.batch_for(shape), progress=progress),
                                  [Path(out)], Jobs("certify", n0, n, alpha, self.sigma), blocks=smooth.blocks)
        wait_for_all(self.shards)               # every row written before any rank returns
        return summary

    def preflight(self, data, *, images: int = IMAGES, samples: int = SAMPLES, skip: int = 1,
                  max_index: Optional[int] = None, stats: Optional[str] = None,
                  published: Optional[float] = None) -> PreflightReport:
        """Before certifying: do the models and `data` behave as a table needs? On `images` images of the selection
        (`skip`, `max_index`; drawn with the model's seed), `samples` noise samples each: the data's pixel range
        and labels, clean accuracy, accuracy under the method's noise (an upper bound of certified accuracy at
        r = 0), the other normalisations (`stats`: their mean/std table; default: the classifier's own), the best
        label permutation, the classifier at half its noise, the denoiser's error and t*, and `published` (the
        paper's r = 0 cell, percent) beside the bound. `data`: a dataset (diffsmooth.load_dataset), a pair
        (images [N,C,H,W], labels [N]) or a sequence of (image, label). Returns a PreflightReport (`.warnings`,
        `.measured`, `.lines()`); runs on copies of the models, writes nothing."""
        for owned in self._given.values():
            owned.refuse_if_changed(type(self).__name__)
        sample = sample_of(data, images, self.seed, skip, max_index)
        classifier = copy.deepcopy(self.classifier)
        denoiser = copy.deepcopy(self.denoiser) if self.denoiser is not None else None
        return preflight_models(self.config, classifier, denoiser, sample,
                                Sampling(samples, self.seed, self.device, self.batch or 0),
                                stats=stats or guess_stats(classifier, tuple(sample.x.shape[1:])),
                                title=f"{type(self).__name__}: {self.config.name} on {len(sample.indices)} images",
                                published=published)


PART_KEYWORDS = ("purifier", "head")       # configured parts handed to the API instead of a method's settings
PART_TYPES = {"purifier": Purifier, "head": Head}


def composed_config(method: str, sigma: float, parts: dict, settings: dict) -> MethodConfig:
    """The MethodConfig of configured parts (`purifier=OneShotPurifier(), head=LocalSmoothingHead(m=5)`): the registered
    method that pairs their classes (the object's own, where it has one; a part not given: that method's, at its
    defaults) and their settings; a part no registered method pairs is refused in one line."""
    if settings:
        raise UserError(f"give the settings in the parts, not beside them: {', '.join(sorted(settings))}")
    for name, part in parts.items():
        if not isinstance(part, PART_TYPES[name]):
            raise UserError(f"`{name}` must be a configured {PART_TYPES[name].__name__} (e.g. "
                            f"{'OneShotPurifier()' if name == 'purifier' else 'LocalSmoothingHead(m=5)'}), got {part!r}")
    names = [method] if method else [n for n in method_names() if len(parts) == len(PART_KEYWORDS)]
    found = [n for n in names if all(type(part) is getattr(method_named(n), k) for k, part in parts.items())]
    if not found:
        given = " and ".join(f"{k} {type(p).__name__}" for k, p in parts.items())
        where = f"{method} pairs {' and '.join(getattr(method_named(method), k).__name__ for k in parts)}" if method \
            else "no registered method pairs them (register a Method naming both: docs/extending.md)"
        raise UserError(f"{given}: {where}")
    options = {key: value for part in parts.values() for key, value in part.settings.items()}
    return MethodConfig(found[0], float(sigma), options=tuple(options.items()))


def method_config(method: str, sigma: float, settings: dict) -> MethodConfig:
    """The MethodConfig of an API object: `settings` are the method's own (its purifier's and head's options), and
    the aliases of OPTION_ALIASES (local_sigma, m, local_noise: any method takes them, as the command line does, and
    one without such a setting ignores them); a name the method does not have is refused in one line."""
    own = dict(settings)
    aliased = {name: own.pop(name) for name in OPTION_ALIASES if name in own}
    return MethodConfig(method, float(sigma), **aliased, options=tuple(own.items()))


def smoothed_classifier(method: str, **arguments) -> SmoothedClassifier:
    """The smoothed classifier of any registered method (a plug-in's, or `densepure`), with its settings as keywords:
    `smoothed_classifier("densepure", denoiser=..., classifier=..., sigma=0.5, reverse_runs=10, steps=2)`."""
    method_named(method)                                    # an unknown method: one line
    cls = type(f"Smoothed_{method}", (SmoothedClassifier,), {"method": method, "__doc__": SmoothedClassifier.__doc__})
    return cls(**arguments)


class RandomizedSmoothing(SmoothedClassifier):
    """Cohen et al. (2019): the classifier votes on x + sigma * eps directly."""

    method = "rs"

    def __init__(self, *, classifier: nn.Module, sigma: float, **execution):
        super().__init__(classifier=classifier, sigma=sigma, **execution)


class DenoisedSmoothing(SmoothedClassifier):
    """DDS (Carlini et al. 2023): one-shot diffusion denoising, then the classifier votes."""

    method = "dds"

    def __init__(self, *, denoiser: DiffusionDenoiser, classifier: nn.Module, sigma: float, **execution):
        super().__init__(classifier=classifier, sigma=sigma, denoiser=denoiser, **execution)


class DiffSmooth(SmoothedClassifier):
    """DiffSmooth (Zhang et al., USENIX Security 2023): one-shot denoising, then the mean softmax of a
    smoothed classifier over m local noises of std sigma' votes. Its settings are its head's (LocalSmoothingHead: `m`,
    `local_sigma`, `local_noise`, `local_noise_seed`, declared there with their defaults), as keywords or as
    `head=LocalSmoothingHead(...)`."""

    method = "diffsmooth"

    def __init__(self, *, denoiser: DiffusionDenoiser, classifier: nn.Module, sigma: float, **settings):
        super().__init__(classifier=classifier, sigma=sigma, denoiser=denoiser, **settings)


def load_demo_denoiser() -> DiffusionDenoiser:
    """The embedded demo UNet (Fashion-MNIST, 32x32) as a one-shot denoiser."""
    shipped.require_demo_assets()
    return load_denoiser(shipped.DEMO_UNET, shipped.DEMO_PRESET)


def load_demo_classifier(noise_sigma: float) -> nn.Module:
    """The embedded demo classifier trained with Gaussian noise of std `noise_sigma`, one of
    `diffsmooth.engine.models.shipped.DEMO_TRAINING_SIGMAS`."""
    return load_classifier(shipped.demo_classifier_at(noise_sigma), dataset=shipped.DEMO_STATS)


def _image(x) -> torch.Tensor:
    """One image [C,H,W] as fp32 (a clear error for a batch or a wrong rank)."""
    if not isinstance(x, torch.Tensor):
        raise UserError(f"x must be a torch tensor [C,H,W], got {type(x).__name__}")
    if x.dim() != 3:
        raise UserError(f"x must be one image [C,H,W], got shape {tuple(x.shape)}")
    return x.detach().to(torch.float32).cpu()

"""Model sets for benchmarking: the embedded demo models, or full-size CIFAR-10 / ImageNet
architectures with random weights (timing does not depend on the weights, only on the shapes)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Optional, Tuple

import torch
from torch import nn

from diffsmooth.engine.base_classifier.denoise import DiffusionDenoiser, load_denoiser, schedule_for
from diffsmooth.engine.base_classifier.methods import MethodConfig, method_named
from diffsmooth.engine.data import load_embedded
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.models import shipped as demo_assets
from diffsmooth.engine.models.checkpoints import load_classifier
from diffsmooth.engine.models.diffusers_folder import read_diffusers_folder
from diffsmooth.engine.models.resnet import NormalizedClassifier, NormalizeLayer, build_classifier_net, normalization_layer
from diffsmooth.engine.models.timm_models import create_timm_net, is_timm_arch, timm_input_stats
from diffsmooth.engine.models.unet import UNetModel, unet_config

MODEL_SETS = ("demo", "cifar10", "imagenet")

# Per set: UNet preset, classifier arch, classes, image shape, stats, and sane defaults. CPU batches
# are small (the demo sweep on 2 cores: batch 25-50 beat 200-400); CUDA batches are large.
SET_SPECS = {
    "demo": dict(preset="demo", arch="cifar_resnet20", classes=10, shape=(1, 32, 32),
                 stats="fashion-mnist", n=100_000, batch=50, batch_cuda=2000, measure_n=1000, measure_n_cuda=20000,
                 dataset="CIFAR-10"),
    "cifar10": dict(preset="cifar10", arch="cifar_resnet110", classes=10, shape=(3, 32, 32),
                    stats="cifar10", n=100_000, batch=50, batch_cuda=2000, measure_n=100, measure_n_cuda=20000,
                    dataset="CIFAR-10"),
    "imagenet": dict(preset="imagenet", arch="resnet50", classes=1000, shape=(3, 224, 224),
                     stats="imagenet", n=10_000, batch=4, batch_cuda=32, measure_n=4, measure_n_cuda=640, dataset="ImageNet"),
}


@dataclass
class ModelSet:
    """The models of one set (denoiser may be None for rs), with where they came from."""

    name: str
    denoiser: Optional[nn.Module]          # a DiffusionDenoiser
    classifier: nn.Module                  # NormalizedClassifier: [0,1] images -> logits
    image_shape: Tuple[int, ...]
    num_classes: int
    weights: str                           # "embedded demo" | "random"
    description: dict = field(default_factory=dict)
    build_s: float = 0.0


def randomize_(module: nn.Module, seed: int = 0) -> nn.Module:
    """Fill every parameter in place: weights ~ N(0, 1/fan_in), biases 0, norm scales 1.

    Fast (one normal_ per tensor) and unlike the official init never zero, so the UNet's
    output convolutions do real work and the denoised images depend on the input.
    """
    gen = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.dim() >= 2:
                fan_in = p[0].numel()
                p.normal_(0.0, 1.0 / math.sqrt(fan_in), generator=gen)
            elif name.endswith("bias"):
                p.zero_()
            else:
                p.fill_(1.0)
    return module


def random_unet(preset: str, seed: int = 0, **overrides):
    """A preset UNet built on the meta device, materialised and randomised (skips the slow init)."""
    with torch.device("meta"):
        unet = UNetModel(unet_config(preset, **overrides))
    unet = unet.to_empty(device="cpu")
    return randomize_(unet, seed).eval()


def calibrate_batchnorm_(net: nn.Module, image_shape, seed: int = 0, batch: int = 4) -> nn.Module:
    """Set BatchNorm running statistics from one random batch, so a random deep ResNet keeps finite
    activations in eval mode (identity BN would double the variance per residual block)."""
    bns = [m for m in net.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not bns:
        return net
    gen = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.rand((batch, *image_shape), generator=gen)
    for m in bns:
        m.reset_running_stats()
        m.momentum = None                  # cumulative average: one batch sets the stats exactly
    net.train()
    with torch.no_grad():
        net(x)
    return net.eval()


def random_classifier(arch: str, num_classes: int, image_shape, stats: str, seed: int = 0):
    """Sequential(normalisation, arch) with random weights and calibrated BatchNorm (timm: timm's init)."""
    torch.manual_seed(seed)
    if is_timm_arch(arch):
        kwargs = {} if tuple(image_shape[1:]) == (224, 224) else {"img_size": tuple(int(s) for s in image_shape[1:])}
        net = create_timm_net(arch, num_classes, int(image_shape[0]), kwargs)
        return NormalizedClassifier(NormalizeLayer(*timm_input_stats(arch, net)), net).eval()
    net = build_classifier_net(arch, num_classes, int(image_shape[0]))
    model = NormalizedClassifier(normalization_layer("normalize", stats), net)
    return calibrate_batchnorm_(model, image_shape, seed)


def _demo_checkpoints(method: str, sigma: float, local_sigma: float):
    """(unet path, classifier path) of the embedded demo models, or None when not trained yet."""
    if not demo_assets.DEMO_UNET.exists():
        return None
    try:
        clf = method_named(method).demo_classifier(MethodConfig(method, sigma, local_sigma=local_sigma))
    except UserError:
        return None
    return demo_assets.DEMO_UNET, clf


def build_model_set(name: str, method: str = "diffsmooth", sigma: float = 0.5, local_sigma: float = 0.25,
                    seed: int = 0, unet_overrides: Optional[dict] = None, arch: Optional[str] = None,
                    denoiser_folder: Optional[str] = None, scheduler: Optional[str] = None) -> ModelSet:
    """The models of set `name` on the CPU in eval mode; the denoiser is skipped for rs.

    `unet_overrides`/`arch` shrink the models (the tests use tiny ones); random weights then.
    `denoiser_folder` (a diffusers folder, with `scheduler` for a UNet folder) replaces the set's UNet.
    """
    if name not in SET_SPECS:
        raise UserError(f"unknown model set {name!r}: choose one of {', '.join(MODEL_SETS)}")
    spec = SET_SPECS[name]
    start = time.perf_counter()
    if denoiser_folder is not None:
        if unet_overrides:
            raise UserError("a diffusers denoiser folder brings its own UNet config: leave out the UNet overrides")
        return _folder_model_set(name, spec, method, seed, arch, denoiser_folder, scheduler, start)
    shape = tuple(spec["shape"])
    if unet_overrides and "image_size" in unet_overrides:
        shape = (shape[0], int(unet_overrides["image_size"]), int(unet_overrides["image_size"]))
    needs_unet = method_named(method).purifier.denoises
    found = _demo_checkpoints(method, sigma, local_sigma) if name == "demo" and not unet_overrides and not arch else None
    if found is not None:
        denoiser = load_denoiser(found[0], "demo") if needs_unet else None
        classifier = load_classifier(found[1], dataset=spec["stats"])
        weights = "embedded demo"
        desc = {"denoiser": found[0].name if needs_unet else None, "classifier": found[1].name}
    else:
        denoiser = None
        if needs_unet:
            unet = random_unet(spec["preset"], seed, **(unet_overrides or {}))
            denoiser = DiffusionDenoiser(unet, schedule_for(spec["preset"]))
        classifier = random_classifier(arch or spec["arch"], spec["classes"], shape, spec["stats"], seed + 1)
        weights = "random"
        desc = {"denoiser": f"UNet preset {spec['preset']}" + (f" {unet_overrides}" if unet_overrides else "")
                if needs_unet else None,
                "classifier": arch or spec["arch"]}
    desc["weights"] = weights
    if denoiser is not None:
        desc["denoiser_parameters"] = sum(p.numel() for p in denoiser.parameters())
    desc["classifier_parameters"] = sum(p.numel() for p in classifier.parameters())
    return ModelSet(name, denoiser, classifier, shape, spec["classes"], weights, desc,
                    time.perf_counter() - start)


# The normalisation table of a classifier put behind a diffusers denoiser with this many channels.
_STATS_BY_CHANNELS = {1: "fashion-mnist", 3: "cifar10"}


def _folder_model_set(name: str, spec: dict, method: str, seed: int, arch: Optional[str], folder: str,
                      scheduler: Optional[str], start: float) -> ModelSet:
    """A diffusers folder's denoiser (its own weights) and a random classifier of the set's kind at its image shape."""
    shape = read_diffusers_folder(folder, scheduler).image_shape
    stats = spec["stats"] if spec["shape"][0] == shape[0] else _STATS_BY_CHANNELS.get(shape[0])
    if stats is None:
        raise UserError(f"{folder}: bench pairs a diffusers denoiser with a random classifier of 1 or 3 channels, "
                        f"not {shape[0]}")
    denoiser = load_denoiser(folder, None, scheduler=scheduler) if method_named(method).purifier.denoises else None
    classifier = random_classifier(arch or spec["arch"], spec["classes"], shape, stats, seed + 1)
    desc = {"denoiser": f"{denoiser.format} ({folder})" if denoiser is not None else None,
            "classifier": arch or spec["arch"], "weights": "denoiser from its folder, random classifier"}
    if denoiser is not None:
        desc["denoiser_parameters"] = sum(p.numel() for p in denoiser.parameters())
    desc["classifier_parameters"] = sum(p.numel() for p in classifier.parameters())
    return ModelSet(name, denoiser, classifier, shape, spec["classes"], "diffusers folder", desc,
                    time.perf_counter() - start)


def bench_images(name: str, count: int, image_shape, seed: int = 0):
    """`count` (image, label) pairs: embedded Fashion-MNIST for the demo set, seeded uniform noise
    images otherwise (timing does not depend on the content)."""
    if name == "demo" and tuple(image_shape) == (1, 32, 32):
        try:
            data = load_embedded()
            return [(data[i][0], int(data[i][1])) for i in range(min(count, len(data)))]
        except (UserError, OSError, KeyError):
            pass
    gen = torch.Generator(device="cpu").manual_seed(seed)
    return [(torch.rand(tuple(image_shape), generator=gen), 0) for _ in range(count)]

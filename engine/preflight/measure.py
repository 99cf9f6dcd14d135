"""The preflight's measurements on the sample: the classifier's clean predictions under each normalisation,
the base classifier's votes under the method's noise (the production stages and keyed noise, so sample j of
image i is the noise `certify` draws first), the same samples scored by the other normalisations and at half
the noise the classifier sees, and the one-shot denoiser's error against the clean images with the schedule
given and the others. Nothing is written."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

import torch
from torch import nn

from diffsmooth.engine.backends.torch.backend import TorchBackend
from diffsmooth.engine.base_classifier.diffusion_denoiser import DiffusionDenoiser
from diffsmooth.engine.base_classifier.methods import MethodConfig
from diffsmooth.engine.base_classifier.schedule import DiffusionSchedule
from diffsmooth.engine.certify.monte_carlo import MonteCarloPipeline
from diffsmooth.engine.certify.noise import STREAM_SMOOTHING, NoiseKeys, gaussian_rows
from diffsmooth.engine.certify.scheduler import BatchRows
from diffsmooth.engine.choices import NORMALIZATIONS, SCHEDULES
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.models.resnet import InputCenterLayer, NormalizedClassifier, NormalizeLayer, normalization_layer
from diffsmooth.engine.runs.fast_path import FastPath
from diffsmooth.engine.runs.stage_build import StageBuild

HALF = "half"                               # the variant at half the noise the classifier sees
HIGHER = "higher"                           # ... at twice it (a method that feeds it no noise: at the run's sigma)
VARIANT_SAMPLES = 2                         # samples per image the variants score (their gaps are tens of points)
# The schedules tried beside the one given: the presets' (improved-diffusion's cosine/4000, guided-diffusion's
# linear/1000), then the other pairings of SCHEDULES with their step counts.
SCHEDULE_CHOICES = (("cosine", 4000), ("linear", 1000), ("cosine", 1000), ("linear", 4000))


def input_mode(classifier: nn.Module) -> Optional[str]:
    """The normalisation in front of a loaded classifier (None: not a Sequential(normalisation, net))."""
    if not isinstance(classifier, NormalizedClassifier):
        return None
    layer = classifier.normalization
    if isinstance(layer, NormalizeLayer):
        return "normalize"
    if isinstance(layer, InputCenterLayer):
        return "center"
    return "none" if isinstance(layer, nn.Identity) else None


def classifier_variants(classifier: nn.Module, stats: Optional[str]) -> Dict[str, nn.Module]:
    """The classifier behind each normalisation (its own first; the others share its network): the given layer's
    mean and std where it has them, else the `stats` table's. Empty when the input layer is not one of them."""
    given = input_mode(classifier)
    if given is None:
        return {}
    layer = classifier.normalization
    mean = layer.mean.flatten().tolist() if hasattr(layer, "mean") else None
    std = layer.std.flatten().tolist() if hasattr(layer, "std") else None
    variants = {given: classifier}
    for mode in NORMALIZATIONS:
        if mode == given:
            continue
        try:
            if mode == "none":
                other = nn.Identity()
            elif mode == "center" and mean is not None:
                other = InputCenterLayer(mean)
            elif mode == "normalize" and mean is not None and std is None and stats is not None:
                other = NormalizeLayer(mean, normalization_layer("normalize", stats).std.flatten().tolist())
            else:
                other = normalization_layer(mode, stats)
        except UserError:                   # no statistics for this mode
            continue
        variants[mode] = NormalizedClassifier(other, classifier.net).eval()
    return variants


class ChannelsSwapped(nn.Module):
    """A classifier fed its images with the channels in reverse order (RGB <-> BGR)."""

    def __init__(self, classifier: nn.Module):
        super().__init__()
        self.classifier = classifier

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(x.flip(1))


class AddedNoise(nn.Module):
    """A head fed its input plus Gaussian noise of std `std` (seeded, so a preflight repeats): a classifier that
    is fed denoised images, scored at a noise level."""

    def __init__(self, head: nn.Module, std: float, seed: int):
        super().__init__()
        self.head, self.std, self.seed = head, float(std), int(seed)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        generator = torch.Generator(device=x.device).manual_seed(self.seed + self.calls)
        self.calls += 1
        noise = torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
        return self.head(x + self.std * noise)


@dataclass(frozen=True)
class Sample:
    """The images a preflight looks at: `x` [N,C,H,W] (CPU float32), `labels` [N] and their dataset `indices` (the
    noise keys, as certify's); `clean`: the images and labels the clean checks score (stratified by label over the
    whole data where it can be read; None: these)."""

    x: torch.Tensor
    labels: torch.Tensor
    indices: Tuple[int, ...]
    clean: Optional[Tuple[torch.Tensor, torch.Tensor]] = None


@dataclass(frozen=True)
class Sampling:
    """How the sample is run: noise samples per image, the noise seed, the device and the batch."""

    samples: int = 5
    seed: int = 0
    device: str = "cpu"
    batch: int = 1000


@torch.inference_mode()
def predictions(classifier: nn.Module, x: torch.Tensor, device, batch: int) -> Optional[torch.Tensor]:
    """The classifier's class per image (CPU int64), or None when it cannot take them (statistics of another
    channel count)."""
    out = []
    try:
        for start in range(0, x.shape[0], batch):
            out.append(classifier(x[start:start + batch].to(device)).argmax(-1).cpu())
    except RuntimeError as exc:         # torch.OutOfMemoryError is one: memory, not the images' layout
        if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower():
            raise UserError(f"out of memory classifying {min(batch, x.shape[0])} images of {list(x.shape[1:])} on "
                            f"{device}: lower `batch` or use a larger device") from None
        return None
    return torch.cat(out)


@dataclass
class NoiseVotes:
    """Votes [images, samples] of the base classifier as configured (`votes`) and of each variant on the first
    VARIANT_SAMPLES of the same samples: the normalisations (one local noise for DiffSmooth, so they compare with
    the given one at m = 1, `light`), `half` and `higher`: the classifier at half and at twice the noise it is fed
    (RS: sigma, DiffSmooth: sigma'; a method that feeds it denoised images: `higher` adds noise of std sigma)."""

    votes: torch.Tensor
    variants: Dict[str, torch.Tensor]
    classes: int
    light: bool                             # the variants score one local noise (DiffSmooth) instead of m


def fed_noise(config: MethodConfig) -> Tuple[Optional[str], float]:
    """(the setting, its value) of the noise the method feeds its classifier: ("sigma", sigma) for a method that
    classifies the noisy input, (sigma' or the head's option, its value), or (None, 0.0): purified images."""
    method = config.method
    local = method.head.noise_option
    if local:
        option = next((o for o in method.options if o.name == local), None)
        return (option.shown if option else local), float(config.option(local))
    return (None, 0.0) if method.purifier.purifies else ("sigma", float(config.sigma))


def _variant_heads(config: MethodConfig, variants: Dict[str, nn.Module], given: Optional[str],
                   shape: Tuple[int, ...], device, seed: int) -> Dict[str, Tuple[nn.Module, float]]:
    """{variant: (score head, the factor on the noise in its input)}: the input a head reads is x + factor * (h - x)
    for a method that classifies the noisy input, else h itself (factor 1)."""
    method = config.method
    light = preview(config)
    heads = {mode: (method.score_head(light, clf, shape), 1.0) for mode, clf in variants.items()}
    classifier = variants.get(given) if given else None
    local, value = fed_noise(config)
    if classifier is not None and method.head.noise_option and value > 0:
        for name, factor in ((HALF, 0.5), (HIGHER, 2.0)):
            heads[name] = (method.score_head(light.replace(**{method.head.noise_option: value * factor}), classifier,
                                           shape), 1.0)
    elif classifier is not None and not method.purifier.purifies:
        heads[HALF], heads[HIGHER] = (method.score_head(light, classifier, shape), 0.5), \
            (method.score_head(light, classifier, shape), 2.0)
    elif classifier is not None:
        heads[HIGHER] = (AddedNoise(method.score_head(light, classifier, shape), config.sigma, seed), 1.0)
    return {name: (head.to(device).eval(), factor) for name, (head, factor) in heads.items()}


def noise_votes(config: MethodConfig, classifier: nn.Module, denoiser, sample: Sample, how: Sampling,
                variants: Dict[str, nn.Module]) -> NoiseVotes:
    """Sample j of image i (dataset index indices[i]) for j < `how.samples`, through the run's own stages (eager
    fp32)."""
    x, indices, samples, seed, device, batch = sample.x, sample.indices, how.samples, how.seed, how.device, how.batch
    shape = tuple(int(d) for d in x.shape[1:])
    build = StageBuild(device=str(device), precision="fp32", fast=FastPath(), batch=batch)
    stages = TorchBackend().from_models(config, classifier, denoiser, shape, None, build)
    pipeline = MonteCarloPipeline(stages, config.sigma, seed)
    heads = _variant_heads(config, variants, input_mode(classifier), shape, pipeline.device, seed)
    noisy_input = not config.method.purifier.purifies
    dev = pipeline.device
    n = x.shape[0]
    position = torch.arange(n).repeat_interleave(samples)
    sample = torch.arange(samples).repeat(n)
    keys = torch.as_tensor(list(indices), dtype=torch.int64)
    votes, out = [], {name: [] for name in heads}
    for start in range(0, n * samples, batch):
        p, s = position[start:start + batch], sample[start:start + batch]
        rows = BatchRows(p.to(dev), keys[p].to(dev), s.to(dev), p.to(dev), len(p), [])
        x_rows = x[p].to(dev)
        h = pipeline.produce(x_rows, rows)
        votes.append(pipeline.scores_of(h, rows)[:, 0].argmax(-1).cpu())
        first = (s < VARIANT_SAMPLES).to(dev)
        if bool(first.any()):
            h, x_rows = h[first], x_rows[first]
            with torch.inference_mode():
                for name, (head, factor) in heads.items():
                    seen = x_rows + factor * (h - x_rows) if noisy_input and factor != 1.0 else h
                    out[name].append(head(seen).argmax(-1).cpu())
    shaped = {name: torch.cat(v).view(n, min(samples, VARIANT_SAMPLES)) for name, v in out.items()}
    return NoiseVotes(torch.cat(votes).view(n, samples), shaped, pipeline.num_classes, preview(config) != config)


def preview(config: MethodConfig) -> MethodConfig:
    """The config the variants score: each setting at its cheaper preview value, where it has one (DiffSmooth: one
    local noise, fixed)."""
    return config.replace(**{o.name: o.preview for o in config.method.options if o.preview is not None})


@dataclass
class DenoiserError:
    """The one-shot denoiser at sigma on the sample's first noisy sample: t*, the RMS error of the denoised
    image against the clean one and of the noisy input ([0, 1] pixel units), and the errors with the other
    schedules (`alternatives`: "SCHEDULE/STEPS" -> error; only for an improved-/guided-diffusion UNet); `per_image`:
    each image's RMS error with the schedule given and with each alternative (the paired test's data)."""

    t_star: Optional[int]
    schedule: Optional[str]
    error: float
    noise: float
    alternatives: Dict[str, float]
    per_image: Dict[str, torch.Tensor] = field(default_factory=dict)


def _rms(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).pow(2).mean().sqrt())


def _rms_each(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.double() - b.double()).pow(2).flatten(1).mean(1).sqrt().cpu()


@torch.inference_mode()
def _denoised(purifier: nn.Module, noisy: torch.Tensor, batch: int) -> torch.Tensor:
    return torch.cat([purifier(noisy[s:s + batch]) for s in range(0, noisy.shape[0], batch)])


def schedule_name(schedule: DiffusionSchedule) -> str:
    return f"{schedule.name}/{schedule.num_steps}"


GIVEN = "given"                             # DenoiserError.per_image's key of the schedule given


def denoiser_error(denoiser: DiffusionDenoiser, sample: Sample, sigma: float, how: Sampling) -> DenoiserError:
    """The one-shot denoiser on each image's first noise sample (certify's), with its schedule and the others."""
    x, batch, dev = sample.x, how.batch, torch.device(how.device)
    keys = NoiseKeys(how.seed, STREAM_SMOOTHING, dev)
    images = torch.as_tensor(list(sample.indices), dtype=torch.int64, device=dev)
    clean = x.to(dev)
    noisy = clean + sigma * gaussian_rows(keys, images, torch.zeros_like(images), tuple(x.shape[1:]))
    denoised = _denoised(denoiser.purifier(sigma).to(dev).eval(), noisy, batch)
    per_image = {GIVEN: _rms_each(denoised, clean)}
    schedule = getattr(denoiser, "schedule", None)
    alternatives: Dict[str, float] = {}
    plain = type(denoiser) is DiffusionDenoiser and isinstance(schedule, DiffusionSchedule)
    if plain:
        for name, steps in SCHEDULE_CHOICES:
            other = DiffusionSchedule(name, steps, schedule.rescale_timesteps)
            if (name, steps) == (schedule.name, schedule.num_steps) or name not in SCHEDULES:
                continue
            try:
                purifier = DiffusionDenoiser(denoiser.unet, other, denoiser.channels).purifier(sigma)
            except UserError:               # sigma beyond that schedule
                continue
            theirs = _denoised(purifier.to(dev).eval(), noisy, batch)
            alternatives[schedule_name(other)] = _rms(theirs, clean)
            per_image[schedule_name(other)] = _rms_each(theirs, clean)
    try:
        t_star = int(denoiser.timestep(sigma))
    except (UserError, AttributeError, TypeError):
        t_star = None
    return DenoiserError(t_star, schedule_name(schedule) if plain else None, _rms(denoised, clean), _rms(noisy, clean),
                         alternatives, per_image)

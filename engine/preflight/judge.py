"""From the preflight's measurements to its report lines, and which of them predict a wrong table (warnings, each
with the option that fixes it). The thresholds are set wide of what a correct set-up shows on the demo models
(docs/cli.md#preflight lists the measured values)."""

from __future__ import annotations

from typing import Dict, Optional

import torch

from diffsmooth.engine.base_classifier.methods import MethodConfig
from diffsmooth.engine.base_classifier.methods.config import OPTION_ALIASES
from diffsmooth.engine.preflight.findings import PreflightReport
from diffsmooth.engine.preflight.measure import HALF, DenoiserError, NoiseVotes
from diffsmooth.engine.runs.analyze import clopper_pearson

NORMALIZATION_GAIN = 0.10       # another normalisation beats the given one by 10 points, clean and under the noise
CLEAR_OF_CHANCE = 3            # ... and scores at least 3 x chance clean
SCALE_GAIN = 0.15               # half the noise scores 15 points more per sample: the classifier's noise is not this
SCHEDULE_GAIN = 0.05            # another schedule denoises with a 5% smaller error than the one given


def label_wins(votes: torch.Tensor, labels: torch.Tensor, classes: int) -> torch.Tensor:
    """Per image: the label has at least as many of the image's votes as any class (ties count: an upper bound)."""
    top = max(classes, int(labels.max()) + 1, int(votes.max()) + 1)
    counts = torch.nn.functional.one_hot(votes, top).sum(dim=1)
    return counts[torch.arange(len(labels)), labels] >= counts.max(dim=1).values


def per_sample(votes: torch.Tensor, labels: torch.Tensor) -> float:
    return float((votes == labels.unsqueeze(1)).double().mean())


def _pct(value: float) -> str:
    return f"{100 * value:.1f}%"


def noise_settings(config: MethodConfig) -> str:
    shown = [(o.shown, config.option(o.name)) for o in config.kind.options if o.recorded]
    return ", ".join([f"sigma {config.sigma:g}"] + [f"{name} {value:g}" if isinstance(value, float) else f"{name} {value}"
                                                    for name, value in shown])


def report_noise(report: PreflightReport, config: MethodConfig, noise: NoiseVotes, labels: torch.Tensor) -> None:
    """The smoothed classifier's accuracy on the sample: an upper bound of certified accuracy at r = 0."""
    wins = label_wins(noise.votes, labels, noise.classes)
    won, n, samples = int(wins.sum()), len(labels), noise.votes.shape[1]
    low, high = clopper_pearson(won, n)
    report.measured.update(noise_accuracy=won / n, noise_ci95=[low, high], noise_per_sample=per_sample(noise.votes, labels),
                           samples=samples)
    each = f"{samples} sample{'s' if samples > 1 else ''} each"
    report.add("noise", f"{_pct(won / n)} of the images won by their label under {config.method}'s noise "
                        f"({noise_settings(config)}; {each}, {_pct(report.measured['noise_per_sample'])} "
                        f"of the samples): certified accuracy at r = 0 can be at most about this "
                        f"(95% CI over the images {_pct(low)}-{_pct(high)})")


def report_normalization(report: PreflightReport, clean: Dict[str, Optional[torch.Tensor]], noise: NoiseVotes,
                         given: Optional[str], labels: torch.Tensor, judged: bool = True) -> None:
    """Each normalisation's accuracy; another one is named when it beats the given one by NORMALIZATION_GAIN
    clean and under the noise and scores at least CLEAR_OF_CHANCE x chance clean (with the labels in another
    order every choice is near chance, and the gaps are noise). `judged` False: the pixels are not in [0, 1],
    which is the fix to make first."""
    if given is None:
        report.add("normalization", "the classifier is not a Sequential(normalisation, net): its input layer is its own")
        return
    scores = {}
    for mode, preds in clean.items():
        votes = noise.variants.get(mode)
        if preds is None or votes is None:
            continue
        scores[mode] = (per_sample(votes, labels), float((preds == labels).double().mean()))
    report.measured["normalization"] = {mode: {"noise_per_sample": a, "clean": b} for mode, (a, b) in scores.items()}
    shown = noise.variants[given].shape[1]
    how = ("one local noise, " if noise.light else "") + f"{shown} sample{'s' if shown > 1 else ''} of each image"
    parts = [f"{mode}{' (given)' if mode == given else ''} {_pct(a)} / {_pct(b)}" for mode, (a, b) in scores.items()]
    report.add("normalization", f"{'; '.join(parts)} (under the noise, {how} / clean)")
    if given not in scores:
        return
    best = max(scores, key=lambda mode: sum(scores[mode]))
    (a, b), (a0, b0) = scores[best], scores[given]
    clear = b >= CLEAR_OF_CHANCE / max(noise.classes, 1)
    if judged and clear and best != given and a - a0 >= NORMALIZATION_GAIN and b - b0 >= NORMALIZATION_GAIN:
        report.add("normalization", f"normalization {given!r} scores {_pct(a0)} under the noise and {_pct(b0)} clean, "
                                    f"{best!r} {_pct(a)} and {_pct(b)}: the classifier was trained behind {best!r}",
                   warning=True, fix=f"--normalization {best}")


def report_scale(report: PreflightReport, config: MethodConfig, noise: NoiseVotes, given: Optional[str],
                 labels: torch.Tensor) -> None:
    """The classifier at the noise it sees against half of it: a sigma read in [-1, 1] pixel units is twice the
    engine's ([0, 1] units), and a classifier trained at the [0, 1] value loses most of its accuracy at twice it."""
    if HALF not in noise.variants or given not in noise.variants:
        return
    at, half = per_sample(noise.variants[given], labels), per_sample(noise.variants[HALF], labels)
    local = config.kind.head.noise_option
    option = next((o for o in config.kind.options if o.name == local), None)
    name, value = (option.shown, config.option(local)) if option else ("sigma", config.sigma)
    report.measured["scale"] = {"at": at, "half": half}
    report.add("sigma", f"the classifier scores {_pct(at)} of the samples at {name} {value:g} and {_pct(half)} at "
                        f"{value / 2:g}")
    if half - at >= SCALE_GAIN:
        option = (f"--{local.replace('_', '-')}" if local in OPTION_ALIASES else f"--option {local}=") if local \
            else "--sigma"
        report.add("sigma", f"the classifier scores {_pct(half)} at {name} {value / 2:g} but {_pct(at)} at {value:g}: "
                            f"was {name} given for [-1, 1] pixels? The engine's sigma is in [0, 1] pixel units, half the "
                            f"[-1, 1] value", warning=True,
                   fix=f"{option} {value / 2:g}" + (" (and --sigma half of a [-1, 1] value too)" if local else "")
                   + f", or a classifier trained at {name} {value:g}")


def report_denoiser(report: PreflightReport, error: DenoiserError, sigma: float) -> None:
    others = ", ".join(f"{name} {value:.4f}" for name, value in error.alternatives.items())
    where = f" ({error.schedule})" if error.schedule else ""
    report.measured["denoiser"] = {"t_star": error.t_star, "schedule": error.schedule, "error": error.error,
                                   "noise": error.noise, "alternatives": error.alternatives}
    report.add("denoiser", f"t* {error.t_star}{where} at sigma {sigma:g}; the denoised image is {error.error:.4f} RMS "
                           f"from the clean one, the noisy input {error.noise:.4f}"
               + (f"; with the other schedules: {others}" if others else ""))
    if error.error >= error.noise:
        report.add("denoiser", f"the denoised images are further from the clean ones ({error.error:.4f} RMS) than the "
                               f"noisy input ({error.noise:.4f}): the UNet is not read as it was trained", warning=True,
                   fix="--preset / --unet-config / --schedule / --diffusion-steps of the UNet's training")
    if error.alternatives:           # the first (in measure.SCHEDULE_CHOICES' order) within 0.5% of the smallest
        least = min(error.alternatives.values())
        name, value = next(item for item in error.alternatives.items() if item[1] <= least * 1.005)
        if value <= (1 - SCHEDULE_GAIN) * error.error:
            schedule, steps = name.split("/")
            report.add("denoiser", f"the {name} schedule denoises with {value:.4f} RMS error against {error.error:.4f} "
                                   f"with {error.schedule}: the UNet was trained with another schedule", warning=True,
                       fix=f"--schedule {schedule} --diffusion-steps {steps} (or the --preset of the UNet's family)")


def report_published(report: PreflightReport, published: float) -> None:
    """The paper's r = 0 cell (percent) beside the measured upper bound; a gap no run can close is a warning."""
    upper, high = report.measured["noise_accuracy"], report.measured["noise_ci95"][1]
    report.measured["published_r0"] = published / 100
    report.add("published", f"r = 0: the paper's {published:.1f}% beside at most about {_pct(upper)} here "
                            f"(95% CI up to {_pct(high)})")
    if published / 100 > high:
        report.add("published", f"the paper's r = 0 cell ({published:.1f}%) is above what this set-up reaches on the "
                                f"sample (at most about {_pct(upper)}, 95% CI up to {_pct(high)}): the table cannot "
                                f"reproduce it", warning=True,
                   fix="check the checkpoint, --normalization and the data against docs/paper-tables.md")

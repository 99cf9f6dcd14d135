"""From the preflight's measurements to its report lines, and which of them predict a wrong table (warnings, each
with the option that fixes it). Every comparison of a variant with the set-up given is a paired test on the same
images (paired.py: level LEVEL, power POWER for the effect below); an effect is the gain that matters, set wide of
what a correct set-up shows on the demo models (docs/cli.md#preflight lists the measured values)."""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import numpy as np
import torch
from scipy import stats

from diffsmooth.engine.base_classifier.methods import MethodConfig
from diffsmooth.engine.base_classifier.methods.config import OPTION_ALIASES
from diffsmooth.engine.preflight.findings import PreflightReport
from diffsmooth.engine.preflight.measure import GIVEN, HALF, HIGHER, DenoiserError, NoiseVotes, fed_noise
from diffsmooth.engine.preflight.paired import DIFFERS, INCONCLUSIVE, PairedResult, mean_test, sign_test
from diffsmooth.engine.runs.analyze import clopper_pearson

NORMALIZATION_GAIN = 0.10       # another normalisation (or the channels reversed) right on 10 more images in 100, clean
CLEAR_OF_CHANCE = 3             # accuracy below 3 x chance (its 95% upper bound) is a broken set-up by itself
SCALE_GAIN = 0.15               # half the noise right on 15 more samples in 100: trained at a lower noise
KEEP_LOSS = 0.15                # a classifier loses at least 15 points at twice the noise it was trained at
SCHEDULE_GAIN = 0.05            # another schedule denoises with a 5% smaller error than the one given
COVER = 0.95                    # the confidence of the r = 0 upper bound
UNITS_LIMIT = 2.0               # a sigma above this (in [0, 1] pixel units) drowns every image: 0-255 units?


def _pct(value: float) -> str:
    return f"{100 * value:.1f}%"


def noise_settings(config: MethodConfig) -> str:
    shown = [(o.shown, config.option(o.name)) for o in config.method.options if o.recorded]
    return ", ".join([f"sigma {config.sigma:g}"] + [f"{name} {value:g}" if isinstance(value, float) else f"{name} {value}"
                                                    for name, value in shown])


def chance_limit(classes: int) -> float:
    """Accuracy whose upper bound lies below this is near chance: CLEAR_OF_CHANCE x chance (at most halfway from
    chance to 1 for few classes)."""
    return min(CLEAR_OF_CHANCE / max(classes, 1), 0.5 + 0.5 / max(classes, 1))


def add_test(report: PreflightReport, check: str, result: PairedResult) -> None:
    """A paired test's line: its p-value and power; inconclusive (with the images it needs) when it could not tell."""
    report.measured.setdefault("tests", {})[result.name] = result.as_dict()
    report.add(check, result.text(), inconclusive=result.verdict == INCONCLUSIVE)


def r0_upper_bound(label_votes: np.ndarray, samples: int) -> float:
    """An upper COVER confidence bound on the fraction of the selection whose label wins more than half of the noise
    (no other image certifies at r = 0), from `samples` votes of each image of a random sample. An image with p > 1/2
    gets >= k label votes with probability at least c_k = P(Bin(samples, 1/2) >= k), so the share W/N of images with
    >= k votes bounds c_k x the fraction; each k's one-sided Clopper-Pearson bound at (1 - COVER) / (samples + 1) (a
    union bound over the choices of k), the smallest one wins."""
    n = len(label_votes)
    level = (1 - COVER) / (samples + 1)
    best = 1.0
    for k in range(1, samples + 1):
        c = float(stats.binom.sf(k - 1, samples, 0.5))
        w = int(np.sum(label_votes >= k))
        high = 1.0 if w >= n else float(stats.beta.ppf(1 - level, w + 1, n - w))
        best = min(best, high / c)
    return min(best, 1.0)


def report_noise(report: PreflightReport, config: MethodConfig, noise: NoiseVotes, labels: torch.Tensor) -> None:
    """The images the label wins under the method's noise, and the upper bound of certified accuracy at r = 0."""
    samples = noise.votes.shape[1]
    label_votes = (noise.votes == labels.unsqueeze(1)).sum(dim=1).numpy()
    won = float(np.mean(label_votes > samples / 2))
    upper = r0_upper_bound(label_votes, samples)
    per_sample = float(np.mean(label_votes) / samples)
    report.measured.update(noise_accuracy=won, r0_upper=upper, noise_per_sample=per_sample, samples=samples)
    report.add("noise", f"{_pct(won)} of the images won by their label (more than half of {samples} sample"
                        f"{'s' if samples > 1 else ''}) under {config.name}'s noise ({noise_settings(config)}; "
                        f"{_pct(per_sample)} of the samples): certified accuracy at r = 0 is at most {_pct(upper)} "
                        f"({100 * COVER:.0f}% upper confidence bound over the selection)")


def _best_variant(tests: Dict[str, PairedResult]) -> Optional[str]:
    found = [name for name, t in tests.items() if t.verdict == DIFFERS]
    return max(found, key=lambda name: tests[name].gain) if found else None


def report_normalization(report: PreflightReport, clean: Dict[str, Optional[torch.Tensor]], labels: torch.Tensor,
                         noise: NoiseVotes, noise_labels: torch.Tensor, given: Optional[str], judged: bool = True) -> None:
    """Each normalisation's accuracy, clean (`clean`: predictions of the images of `labels`) and under the noise
    (the noise sample's `noise_labels`); another one is named when it is right on significantly more clean images
    (the paired sign test, effect NORMALIZATION_GAIN) and clear of chance. `judged` False: the pixels are not in
    [0, 1], which is the fix to make first."""
    if given is None:
        report.add("normalization", "the classifier is not a Sequential(normalisation, net): its input layer is its own")
        return
    right = {mode: (preds == labels).double().numpy() for mode, preds in clean.items() if preds is not None}
    noisy = {mode: float((v == noise_labels.unsqueeze(1)).double().mean()) for mode, v in noise.variants.items()
             if mode in right}
    report.measured["normalization"] = {mode: {"noise_per_sample": noisy.get(mode), "clean": float(r.mean())}
                                        for mode, r in right.items()}
    shown = noise.variants[given].shape[1] if given in noise.variants else 0
    how = ("one local noise, " if noise.light else "") + f"{shown} sample{'s' if shown > 1 else ''} of each image"
    parts = [f"{mode}{' (given)' if mode == given else ''} "
             f"{_pct(noisy[mode]) if mode in noisy else '-'} / {_pct(float(r.mean()))}" for mode, r in right.items()]
    report.add("normalization", f"{'; '.join(parts)} (under the noise, {how} / clean)")
    if given not in right:
        return
    tests = {mode: sign_test(f"normalization {mode} against {given}", right[given], r, NORMALIZATION_GAIN)
             for mode, r in right.items() if mode != given}
    for result in tests.values():
        add_test(report, "normalization", result)
    best = _best_variant(tests)
    if judged and best and right[best].mean() >= chance_limit(noise.classes):
        report.add("normalization", f"normalization {given!r} is right on {_pct(right[given].mean())} of the clean "
                                    f"images, {best!r} on {_pct(right[best].mean())} (p = {tests[best].p_value:.2g}): "
                                    f"the classifier was trained behind {best!r}", warning=True,
                   fix=f"--normalization {best}")


def report_channels(report: PreflightReport, given: torch.Tensor, swapped: torch.Tensor, labels: torch.Tensor) -> None:
    """RGB against BGR: the classifier on the images with their channels reversed, a paired sign test on the
    clean images."""
    a, b = (given == labels).double().numpy(), (swapped == labels).double().numpy()
    result = sign_test("channels reversed (BGR) against as given", a, b, NORMALIZATION_GAIN)
    add_test(report, "channels", result)
    report.measured["channels"] = {"given": float(a.mean()), "reversed": float(b.mean())}
    if result.verdict == DIFFERS:
        report.add("channels", f"the classifier is right on {_pct(b.mean())} of the clean images with their channels "
                               f"reversed, {_pct(a.mean())} as given (p = {result.p_value:.2g}): the images are BGR, "
                               f"the classifier RGB (or the other way round)", warning=True,
                   fix="give the images in the classifier's channel order (for a tensor x: x.flip(1))")


def _scores(votes: torch.Tensor, labels: torch.Tensor) -> np.ndarray:
    """Per image: the fraction of its samples the label wins."""
    return (votes == labels.unsqueeze(1)).double().mean(dim=1).numpy()


def _noise_fix(config: MethodConfig, name: str, value: float) -> str:
    local = config.method.head.noise_option
    option = (f"--{local.replace('_', '-')}" if local in OPTION_ALIASES else f"--option {local}=") if local else "--sigma"
    return (f"{option} {value / 2:g}" + (" (and --sigma half of a [-1, 1] value too)" if local else "")
            + f", or a classifier trained at {name} {value:g}")


def report_training_noise(report: PreflightReport, config: MethodConfig, noise: NoiseVotes, given: Optional[str],
                          labels: torch.Tensor) -> None:
    """Was the classifier trained at the noise it is fed? Half of it scoring significantly better says lower (or a
    sigma given for [-1, 1] pixels, twice the engine's); twice it (a method that feeds it denoised images: noise of
    std sigma) losing significantly less than KEEP_LOSS says higher."""
    if given not in noise.variants:
        return
    name, value = fed_noise(config)
    at = _scores(noise.variants[given], labels)
    measured = report.measured.setdefault("scale", {"at": float(at.mean())})
    fed = f"{name} {value:g}" if name else "the denoised images"
    if HALF in noise.variants:
        half = _scores(noise.variants[HALF], labels)
        measured["half"] = float(half.mean())
        result = sign_test(f"{name} {value / 2:g} against {value:g}", at, half, SCALE_GAIN)
        report.add("sigma", f"the classifier scores {_pct(at.mean())} of the samples at {fed} and {_pct(half.mean())} at "
                            f"{value / 2:g}")
        add_test(report, "sigma", result)
        if result.verdict == DIFFERS:
            report.add("sigma", f"the classifier scores {_pct(half.mean())} at {name} {value / 2:g} but {_pct(at.mean())} "
                                f"at {value:g} (p = {result.p_value:.2g}): it was trained at a lower noise than it is "
                                f"fed, or {name} was given for [-1, 1] pixels (the engine's is in [0, 1] pixel units, "
                                f"half the [-1, 1] value)", warning=True, fix=_noise_fix(config, name, value))
    if HIGHER not in noise.variants:
        return
    more = _scores(noise.variants[HIGHER], labels)
    level = value * 2 if name else config.sigma
    measured["higher"] = float(more.mean())
    report.add("sigma", f"at {'twice ' + fed if name else f'{fed} plus noise of std {level:g}'}: "
                        f"{_pct(more.mean())} (at {fed}: {_pct(at.mean())})")
    if at.mean() < chance_limit(noise.classes):
        return                                  # near chance: nothing to lose (report_chance says so)
    result = mean_test(f"noise {level:g} against {fed}, plus the {100 * KEEP_LOSS:.0f} points a classifier trained "
                       f"at it loses", more - at, KEEP_LOSS, null=-KEEP_LOSS)
    add_test(report, "sigma", result)
    if result.verdict == DIFFERS:
        want = f"{name} {value:g}" if name else "clean images (DDS's off-the-shelf classifier) or below sigma"
        trained = f"one trained at {fed}" if name else "one trained without noise"
        report.add("sigma", f"the classifier keeps {_pct(more.mean())} at noise {level:g}, {_pct(at.mean())} at {fed} "
                            f"(p = {result.p_value:.2g}; {trained} loses {100 * KEEP_LOSS:.0f} points or more): it was "
                            f"trained at a higher noise than it is fed", warning=True,
                   fix=f"a classifier trained at {want}")


def report_units(report: PreflightReport, config: MethodConfig) -> bool:
    """A sigma (or the noise the classifier is fed) above UNITS_LIMIT in [0, 1] pixel units drowns every image: it
    was given in 0-255 units. True when the rest of the preflight would measure nothing."""
    name, value = fed_noise(config)
    found = [("sigma", config.sigma)] + ([(name, value)] if name and name != "sigma" else [])
    drowned = [(n, v) for n, v in found if v > UNITS_LIMIT]
    for n, v in drowned:
        report.add("sigma", f"{n} {v:g} is {v:g} times the whole [0, 1] pixel range: every image drowns in the noise. "
                            f"Was it given in 0-255 units?", warning=True, fix=f"{n} {v / 255:.4g} (the [0, 1] value)")
    return bool(drowned)


def report_chance(report: PreflightReport, clean_right: np.ndarray, classes: int) -> None:
    """Clean accuracy or the r = 0 bound near chance warns by itself, where no other warning explains it."""
    if report.warnings:
        return
    limit = chance_limit(classes)
    _, clean_high = clopper_pearson(int(clean_right.sum()), len(clean_right))
    upper = report.measured.get("r0_upper", 1.0)
    for what, value in (("clean accuracy", clean_high), ("certified accuracy at r = 0", upper)):
        if value < limit:
            report.add("chance", f"{what} is at most {_pct(value)} (95% upper bound) with {classes} classes, below "
                                 f"{CLEAR_OF_CHANCE} x chance: this set-up cannot give a table", warning=True,
                       fix="check the classifier file, its --normalization and the data's labels and pixel range")
            return


def _schedule_test(error: DenoiserError) -> Optional[Tuple[str, PairedResult]]:
    """The paired test of the best other schedule: per image, log(error given) - log(error other) above 0."""
    if not error.alternatives:
        return None
    least = min(error.alternatives.values())      # the first (in SCHEDULE_CHOICES' order) within 0.5% of the smallest
    name = next(n for n, value in error.alternatives.items() if value <= least * 1.005)
    given, other = error.per_image[GIVEN].numpy(), error.per_image[name].numpy()
    tiny = 1e-12
    gain = -float(np.log(1 - SCHEDULE_GAIN))
    return name, mean_test(f"schedule {name} against {error.schedule}", np.log(given + tiny) - np.log(other + tiny), gain)


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
    found = _schedule_test(error)
    if found is None:
        return
    name, result = found
    add_test(report, "denoiser", result)
    if result.verdict == DIFFERS:
        schedule, steps = name.split("/")
        report.add("denoiser", f"the {name} schedule denoises with {error.alternatives[name]:.4f} RMS error against "
                               f"{error.error:.4f} with {error.schedule} (p = {result.p_value:.2g}): the UNet was "
                               f"trained with another schedule", warning=True,
                   fix=f"--schedule {schedule} --diffusion-steps {steps} (or the --preset of the UNet's family)")


def report_published(report: PreflightReport, published: float, half_upper: Optional[float] = None) -> None:
    """The paper's r = 0 cell (percent) beside the measured upper bound; a gap no run can close is a warning.
    `half_upper`: the bound at half the sigma, measured where there is a gap (a sigma given for [-1, 1] pixels)."""
    upper = report.measured["r0_upper"]
    report.measured["published_r0"] = published / 100
    report.add("published", f"r = 0: the paper's {published:.1f}% beside at most {_pct(upper)} here "
                            f"({100 * COVER:.0f}% upper bound)")
    if published / 100 <= upper:
        return
    scale = half_upper is not None and published / 100 <= half_upper
    if half_upper is not None:
        report.measured["r0_upper_at_half_sigma"] = half_upper
    report.add("published", f"the paper's r = 0 cell ({published:.1f}%) is above what this set-up reaches on the "
                            f"selection (at most {_pct(upper)}): the table cannot reproduce it"
               + (f"; at half the sigma it reaches up to {_pct(half_upper)}: was sigma given for [-1, 1] pixels?"
                  if scale else ""), warning=True,
               fix="--sigma half the value (the engine's sigma is in [0, 1] pixel units)" if scale else
               "check the checkpoint, --normalization and the data against docs/paper-tables.md")

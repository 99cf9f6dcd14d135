"""Option groups shared by the commands, their choices taken from the engine's own constants
(engine/choices.py), so a name is spelled once. Each group is a decorator adding its options; the number
types they use are param_types.py's."""

from __future__ import annotations

import click

from diffsmooth.cli.fast_path_options import fast_path_options
from diffsmooth.cli.param_types import (
    ALPHA,
    BATCH,
    DIFFUSION_STEPS,
    LOCAL_NOISES,
    LOCAL_SIGMA,
    METHOD,
    SAMPLES,
    SEED,
    SIGMA,
    THREADS,
    Count,
)
from diffsmooth.engine.choices import (
    BACKENDS,
    DATASET_KINDS,
    DEFAULT_ALPHA,
    DEFAULT_LOCAL_NOISE,
    DEFAULT_LOCAL_SIGMA,
    DEFAULT_M,
    DEFAULT_METHOD,
    DEFAULT_N,
    DEFAULT_N0,
    DEFAULT_SEED,
    DEFAULT_SIGMA,
    DEFAULT_SKIP,
    DEFAULT_SPLIT,
    FIXED_LOCAL_NOISE_SEED,
    LOCAL_NOISE_MODES,
    MAX_WINDOW,
    NORMALIZATIONS,
    PRESETS,
    RUN_PRECISIONS,
    SCHEDULES,
    SEQUENTIAL_BOUNDS,
    STATS,
)

__all__ = ["dataset_option", "distinct", "echo_err", "group", "method_options", "model_options", "precision_option",
           "run_options", "sequential_options", "validation_options"]


def echo_err(line: str) -> None:
    """One line on stderr: a command's notes and progress (stdout holds its results)."""
    click.echo(line, err=True)


def distinct(ctx, param, values):
    """A click callback refusing a repeatable option given the same value twice (`--m 5 --m 5`)."""
    if values is None:
        return values
    seen = set()
    for value in values:
        if value in seen:
            raise click.BadParameter(f"{value!r} is given twice; name each value once")
        seen.add(value)
    return values


def name_values(ctx, param, values):
    """A click callback turning repeated `NAME=VALUE` texts into (name, value) pairs, each name once (a method's
    own settings: the method checks names and values)."""
    pairs = []
    for text in values or ():
        name, sep, value = text.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise click.BadParameter(f"{text!r} is not NAME=VALUE")
        pairs.append((name.strip().replace("-", "_"), value.strip()))
    if len({name for name, _ in pairs}) != len(pairs):
        raise click.BadParameter("a setting is given twice; name each once")
    return tuple(pairs)


def group(*options):
    """One decorator applying `options` in the order listed (top to bottom in --help)."""
    def apply(f):
        for option in reversed(options):
            f = option(f)
        return f
    return apply


def dataset_option(help_text="Dataset layout [default: embedded demo subset]."):
    return click.option("--dataset", type=click.Choice(DATASET_KINDS), help=help_text)


def precision_option(choices=RUN_PRECISIONS):
    return click.option("--precision", type=click.Choice(choices), default="fp32", show_default=True)


def model_options(sweep: bool = True):
    """The models; with neither checkpoint the embedded demo models are used."""
    return group(
        click.option("--denoiser", type=click.Path(), help="UNet checkpoint (improved-/guided-diffusion) or a "
                     "diffusers folder (a pipeline, or a UNet folder with --scheduler)."),
        click.option("--scheduler", type=click.Path(), help="Scheduler folder of a diffusers UNet folder given as --denoiser."),
        click.option("--preset", type=click.Choice(PRESETS),
                     help="UNet architecture + schedule [default: cifar10, or demo for the embedded models]."),
        click.option("--unet-config", default=None, help="JSON of UNet config fields overriding the preset."),
        click.option("--schedule", type=click.Choice(SCHEDULES), help="Override the preset's schedule."),
        click.option("--diffusion-steps", type=DIFFUSION_STEPS, help="Override the preset's number of diffusion steps."),
        click.option("--classifier", type=click.Path(), multiple=sweep, callback=distinct if sweep else None,
                     help="Classifier checkpoint (Cohen/SmoothAdv dict or state dict)"
                          + ("; repeat for a sweep." if sweep else ".")),
        click.option("--arch", help="Classifier architecture when the checkpoint does not say."),
        click.option("--normalization", type=click.Choice(NORMALIZATIONS),
                     help="Input layer in front of the classifier [default: per --stats]."),
        click.option("--stats", type=click.Choice(STATS),
                     help="Mean/std for normalisation [default: the preset's dataset; a classifier without "
                          "preset: from --dataset]."),
    )


def method_options(sweep: bool = True):
    """The base classifier: method, sigma and DiffSmooth's local noises (repeatable for a sweep)."""
    repeat = {"multiple": True} if sweep else {}
    again = "; repeat for a sweep." if sweep else "."
    return group(
        click.option("--method", type=METHOD, default=[DEFAULT_METHOD] if sweep else DEFAULT_METHOD,
                     show_default=True, callback=distinct if sweep else None, **repeat,
                     help="Repeat for a sweep." if sweep else None),
        click.option("--sigma", type=SIGMA, default=DEFAULT_SIGMA, show_default=True,
                     help="Smoothing noise std (input in [0,1])."),
        click.option("--local-sigma", type=LOCAL_SIGMA, default=[DEFAULT_LOCAL_SIGMA] if sweep else DEFAULT_LOCAL_SIGMA,
                     show_default=True, callback=distinct if sweep else None, **repeat,
                     help="sigma' of the local noises" + again),
        click.option("--m", "--num-local", "m", type=LOCAL_NOISES, default=[DEFAULT_M] if sweep else DEFAULT_M,
                     show_default=True, callback=distinct if sweep else None, **repeat,
                     help="Number of local noises" + ("; repeat for a sweep (nested: m=21 serves 1,3,5,11)."
                                                      if sweep else ".")),
        click.option("--local-noise", type=click.Choice(LOCAL_NOISE_MODES), default=DEFAULT_LOCAL_NOISE,
                     show_default=True,
                     help=f"fixed: drawn once (seed {FIXED_LOCAL_NOISE_SEED}), as the reference; fresh: new per sample "
                          "(Algorithm 3)." if sweep else
                     f"fixed: m noises baked into the graph (seed {FIXED_LOCAL_NOISE_SEED}); fresh: the graph takes "
                     "them as input."),
        click.option("--option", "method_options", multiple=True, metavar="NAME=VALUE", callback=name_values,
                     help="A setting of the method's own "
                          "(docs/methods.md); repeat for several."),
    )


def run_options(f):
    """Data selection, Monte Carlo, backend, fast path and output of certify / predict."""
    return group(
        dataset_option(),
        click.option("--data", type=click.Path(), help="Dataset directory or file."),
        click.option("--split", default=DEFAULT_SPLIT, show_default=True),
        click.option("--n0", type=SAMPLES, default=DEFAULT_N0, show_default=True),
        click.option("--n", "--num-samples", "n", type=SAMPLES, default=DEFAULT_N, show_default=True,
                     help="Monte Carlo samples for estimation (--num-samples: the same, for torchrun)."),
        click.option("--alpha", type=ALPHA, default=DEFAULT_ALPHA, show_default=True),
        click.option("--batch", type=BATCH, default=None,
                     help="Noisy samples per Monte Carlo batch [default: 1000 on CPU; on CUDA 2000 for images "
                          "up to 64x64, else 32]. Counts do not depend on it on CPU fp32 (docs/performance.md)."),
        click.option("--skip", type=Count(1), default=DEFAULT_SKIP, show_default=True,
                     help="Use every skip-th image."),
        click.option("--max", "--max-index", "max_index", type=Count(1), default=None,
                     help="Stop before this dataset index (--max-index: the same, for torchrun)."),
        click.option("--seed", type=SEED, default=DEFAULT_SEED, show_default=True, help="Noise seed (per image, per sample)."),
        click.option("--backend", type=click.Choice(BACKENDS), default="torch", show_default=True),
        click.option("--onnx-dir", type=click.Path(),
                     help="Exported graphs for --backend onnxruntime (and their built engine files for tensorrt)."),
        click.option("--device", default="cpu", show_default=True, help="cpu, cuda or cuda:N."),
        precision_option(),
        *fast_path_options(),
        click.option("--out", type=click.Path(), required=True, help="Result TSV (resumed if it exists)."),
        click.option("--shard", default=None, metavar="I/K",
                     help="Certify only a static shard I of K of the selected images (e.g. Slurm arrays); "
                          "merge with `diffsmooth merge`. Under torchrun every rank computes its share of every "
                          "image's samples instead (one image's latency divides by the ranks) and rank 0 writes."),
        click.option("--window", type=Count(1, MAX_WINDOW), default=None,
                     help="Most images in flight, packed into shared batches [default: from the batch; "
                          "1: one image at a time]. Rows do not depend on it."),
        click.option("--threads", type=THREADS, default=None,
                     help="CPU threads for torch (default: torch's choice; on a shared machine use fewer)."),
        click.option("--quiet", is_flag=True, help="No progress bar."),
    )(f)


def sequential_options(f):
    """Early stopping with an anytime-valid bound (engine/certify/sequential.py)."""
    return group(
        click.option("--sequential", is_flag=True,
                     help="Stop each image once every --radii answer is settled (anytime-valid bound); "
                          "adds a `samples` column."),
        click.option("--radii", default=None, help="With --sequential: the radii to settle, e.g. 0.25,0.5,0.75,1.0."),
        click.option("--n-max", type=SAMPLES, default=None,
                     help="With --sequential: most estimation samples per image [default: --n]."),
        click.option("--futility", default=None, metavar="M|off|RULE:M",
                     help="With --sequential: stop an image once its votes trail the pace to certify the next radius at "
                          "n-max by M (1 + 4 t/n-max) final standard deviations and by 2 votes [default M: 0.21 at "
                          "n-max 10,000, 0.13 at 100,000]; off; pace:M (no 2-vote floor); projection:K. Spends no alpha."),
        click.option("--bound", default=None, type=click.Choice(SEQUENTIAL_BOUNDS),
                     help="With --sequential: reach-cp (split Clopper-Pearson, a unanimity bound and its looks: the fewest "
                          "samples), split-cp (without them), mixture (valid at any sample count) [default: reach-cp]."),
    )(f)


def validation_options(f):
    """--samples/--dataset/--data/--seed: the noisy real samples whose votes a validation compares."""
    return group(
        click.option("--samples", type=SAMPLES, default=1000, show_default=True,
                     help="Noisy samples for vote agreement (>= 1000 for TensorRT engine files)."),
        dataset_option("Validation images [default: embedded subset]."),
        click.option("--data", type=click.Path(), help="Dataset directory or file for --dataset."),
        click.option("--seed", type=SEED, default=0, show_default=True, help="Noise seed for validation."),
    )(f)

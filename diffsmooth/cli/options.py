"""Option groups shared by the commands, their choices taken from the engine's own constants
(engine/choices.py), so a name is spelled once. Each group is a decorator adding its options."""

from __future__ import annotations

import click

from diffsmooth.engine.choices import (
    BACKENDS,
    DATASET_KINDS,
    GRAPH_PRECISIONS,
    LOCAL_NOISE_MODES,
    METHODS,
    NORMALIZATIONS,
    PRECISIONS,
    PRESETS,
    SCHEDULES,
    SEQUENTIAL_BOUNDS,
    STATS,
)

__all__ = ["GRAPH_PRECISIONS", "dataset_option", "group", "method_options", "model_options", "positive",
           "precision_option", "run_options", "sequential_options", "validation_options"]


def group(*options):
    """One decorator applying `options` in the order listed (top to bottom in --help)."""
    def apply(f):
        for option in reversed(options):
            f = option(f)
        return f
    return apply


def positive(name):
    """A click callback refusing values below 1."""
    def check(ctx, param, value):
        if value is not None and value < 1:
            raise click.BadParameter(f"must be >= 1, got {value}")
        return value
    return check


def dataset_option(help_text="Dataset layout [default: embedded demo subset]."):
    return click.option("--dataset", type=click.Choice(DATASET_KINDS), help=help_text)


def precision_option(choices=PRECISIONS):
    return click.option("--precision", type=click.Choice(choices), default="fp32", show_default=True)


def model_options(sweep: bool = True):
    """The models; with neither checkpoint the embedded demo models are used."""
    return group(
        click.option("--denoiser", type=click.Path(), help="UNet checkpoint (improved-/guided-diffusion state dict)."),
        click.option("--preset", type=click.Choice(PRESETS),
                     help="UNet architecture + schedule [default: cifar10, or demo for the embedded models]."),
        click.option("--unet-config", default=None, help="JSON of UNet config fields overriding the preset."),
        click.option("--schedule", type=click.Choice(SCHEDULES), help="Override the preset's schedule."),
        click.option("--diffusion-steps", type=int, help="Override the preset's number of diffusion steps."),
        click.option("--classifier", type=click.Path(), multiple=sweep,
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
        click.option("--method", type=click.Choice(METHODS), default=["diffsmooth"] if sweep else "diffsmooth",
                     show_default=True, **repeat, help="Repeat for a sweep." if sweep else None),
        click.option("--sigma", type=float, default=0.5, show_default=True, help="Smoothing noise std (input in [0,1])."),
        click.option("--local-sigma", type=float, default=[0.25] if sweep else 0.25, show_default=True, **repeat,
                     help="sigma' of the local noises" + again),
        click.option("--m", "--num-local", "m", type=int, default=[5] if sweep else 5, show_default=True, **repeat,
                     help="Number of local noises" + ("; repeat for a sweep (nested: m=21 serves 1,3,5,11)."
                                                      if sweep else ".")),
        click.option("--local-noise", type=click.Choice(LOCAL_NOISE_MODES), default="fixed", show_default=True,
                     help="fixed: drawn once (seed 42), as the reference; fresh: new per sample (Algorithm 3)."
                     if sweep else "fixed: m noises baked into the graph (seed 42); fresh: the graph takes them "
                                   "as input."),
    )


def run_options(f):
    """Data selection, Monte Carlo, backend, fast path and output of certify / predict."""
    return group(
        dataset_option(),
        click.option("--data", type=click.Path(), help="Dataset directory or file."),
        click.option("--split", default="test", show_default=True),
        click.option("--n0", type=int, default=100, show_default=True, callback=positive("n0")),
        click.option("--n", "--num-samples", "n", type=int, default=10000, show_default=True, callback=positive("n"),
                     help="Monte Carlo samples for estimation (--num-samples: the same, for torchrun)."),
        click.option("--alpha", type=float, default=0.001, show_default=True),
        click.option("--batch", type=int, default=None, callback=positive("batch"),
                     help="Noisy samples per Monte Carlo batch [default: 1000 on CPU; on CUDA 2000 for images "
                          "up to 64x64, else 32]. Counts do not depend on it on CPU fp32 (docs/performance.md)."),
        click.option("--skip", type=int, default=1, show_default=True, callback=positive("skip"),
                     help="Use every skip-th image."),
        click.option("--max", "--max-index", "max_index", type=int, default=None,
                     help="Stop before this dataset index (--max-index: the same, for torchrun)."),
        click.option("--seed", type=int, default=0, show_default=True, help="Noise seed (per image, per sample)."),
        click.option("--backend", type=click.Choice(BACKENDS), default="torch", show_default=True),
        click.option("--onnx-dir", type=click.Path(),
                     help="Exported graphs for --backend onnxruntime (and their built plans for tensorrt)."),
        click.option("--device", default="cpu", show_default=True, help="cpu, cuda or cuda:N."),
        precision_option(),
        click.option("--compile/--no-compile", "compile", default=None,
                     help="torch.compile the stages at one static batch shape [default: on for CUDA]."),
        click.option("--cuda-graphs/--no-cuda-graphs", "cuda_graphs", default=None,
                     help="Replay each compiled stage from a CUDA graph [default: on with --compile on CUDA]."),
        click.option("--streams", type=click.IntRange(1, 2), default=None,
                     help="2: denoise batch k+1 while classifying batch k on two CUDA streams [default: 2 on CUDA]."),
        click.option("--fused-attention/--no-fused-attention", "fused_attention", default=None,
                     help="Run the UNet's attention through scaled_dot_product_attention (flash kernels) "
                          "[default: on with --compile on CUDA]."),
        click.option("--fused-conv/--no-fused-conv", "fused_conv", default=False,
                     help="ResNet classifiers with BatchNorm folded into the convolutions and conv + add + ReLU "
                          "as one cuDNN call on CUDA [default: off; see docs/status.md]."),
        click.option("--validate-samples", type=click.IntRange(0), default=500, show_default=True,
                     help="Samples per image on which a compiled / fp16 / bf16 path's production counts are "
                          "checked against eager fp32 (TF32 off) once per run (0: skip)."),
        click.option("--validate-images", type=click.IntRange(1), default=4, show_default=True,
                     help="How many of the first selected images that check uses."),
        click.option("--expected-flip-rate", type=click.FloatRange(0, 1, min_open=True), default=1.3e-4,
                     show_default=True,
                     help="Per-sample vote flip rate a correct fast path shows (fp16 1.3e-4, bf16 1.7e-3 measured); "
                          "the check refuses a run that exceeds it with 1-in-10,000 odds."),
        click.option("--out", type=click.Path(), required=True, help="Result TSV (resumed if it exists)."),
        click.option("--shard", default=None, metavar="I/K",
                     help="Certify only a static shard I of K of the selected images (e.g. Slurm arrays); "
                          "merge with `diffsmooth merge`. Under torchrun ranks pull images from a shared "
                          "counter instead, which balances uneven images (sequential runs) better."),
        click.option("--window", type=click.IntRange(1), default=None,
                     help="Most images in flight, packed into shared batches [default: from the batch; "
                          "1: one image at a time]. Rows do not depend on it."),
        click.option("--threads", type=int, default=None, callback=positive("threads"),
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
        click.option("--n-max", type=int, default=None, callback=positive("n-max"),
                     help="With --sequential: most estimation samples per image [default: --n]."),
        click.option("--futility", default=None, metavar="M|off|RULE:M",
                     help="With --sequential: stop an image once its votes trail the pace needed to certify "
                          "the next radius at n-max by more than M (1 + 4 t/n-max) final standard deviations "
                          "[default: M = 0.21 at n-max 10,000, 0.13 at 100,000]; 'off' runs such images to "
                          "n-max; 'projection:K' is the earlier rule (rate + K standard errors held to n-max). "
                          "Validity does not depend on it."),
        click.option("--bound", default=None, type=click.Choice(SEQUENTIAL_BOUNDS),
                     help="With --sequential: split-cp (Clopper-Pearson split over the looks fixed by n-max; "
                          "the fewest samples) or mixture (valid at every sample, so a budget can be extended "
                          "later) [default: split-cp]."),
    )(f)


def validation_options(f):
    """--samples/--dataset/--data/--seed: the noisy real samples whose votes a validation compares."""
    return group(
        click.option("--samples", type=int, default=1000, show_default=True,
                     help="Noisy samples for vote agreement (>= 1000 for TensorRT plans)."),
        dataset_option("Validation images [default: embedded subset]."),
        click.option("--data", type=click.Path(), help="Dataset directory or file for --dataset."),
        click.option("--seed", type=int, default=0, show_default=True, help="Noise seed for validation."),
    )(f)

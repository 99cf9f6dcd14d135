"""`diffsmooth train-demo`: retrain the embedded demo models and their MODELS.json manifest."""

from __future__ import annotations

import dataclasses
import shlex
import sys
from pathlib import Path

import click

from diffsmooth.cli.param_types import BATCH, THREADS, Count, Number
from diffsmooth.engine.choices import MAX_THREADS
from diffsmooth.engine.demo.training import DEFAULT_DATA_DIR, QUICK_BUDGET, DemoBudget, DemoTraining
from diffsmooth.engine.demo.training import train_demo as run
from diffsmooth.engine.models.shipped import ASSETS, DEMO_TRAINING_SIGMAS, demo_sigmas_text

_NOISY = demo_sigmas_text(s for s in DEMO_TRAINING_SIGMAS if s > 0)


STEPS = Count(1, 2 ** 31 - 1)
EPOCHS = Number(0.001, 1e6)


@click.command("train-demo")
@click.option("--data", default=DEFAULT_DATA_DIR, show_default=True, type=click.Path(),
              help="Folder with the Fashion-MNIST IDX files (train-* and t10k-*).")
@click.option("--out", default=str(ASSETS), show_default=True, type=click.Path(),
              help="Where to write demo_unet.pt, demo_classifier_s*.pt and MODELS.json.")
@click.option("--seed", default=0, show_default=True, type=Count(0, 2 ** 32 - 1), help="Base seed of all training runs.")
@click.option("--unet-steps", type=STEPS, help="Denoiser optimisation steps [default: 300].")
@click.option("--unet-batch-size", type=BATCH, help="Denoiser batch size [default: 128].")
@click.option("--classifier-epochs", type=EPOCHS,
              help=f"Epochs of each noisy (sigma {_NOISY}) classifier [default: 1].")
@click.option("--clean-classifier-epochs", type=EPOCHS,
              help="Epochs of the clean (sigma 0) classifier [default: 2].")
@click.option("--classifier-steps", type=STEPS,
              help="Steps per classifier (overrides both epoch options).")
@click.option("--classifier-batch-size", type=BATCH, help="Classifier batch size [default: 128].")
@click.option("--train-limit", type=Count(1), help="Train on only the first N images.")
@click.option("--test-limit", type=Count(1), help="Evaluate on only the first N test images (and of the embedded subset).")
@click.option("--workers", type=Count(1, MAX_THREADS),
              help="Processes training models in parallel [default: usable cores, at most 2].")
@click.option("--threads", type=THREADS, help="Torch threads per worker [default: cores // workers].")
@click.option("--quick", is_flag=True, help="Tiny budget for smoke tests (a few steps on 256 images).")
@click.option("--only-missing", is_flag=True,
              help="Train only the models absent from --out (classifiers at sigma "
                   f"{demo_sigmas_text()} and the UNet); the present files stay unchanged and must be "
                   "those its MODELS.json records (same seed, budget and data); the new entries are merged "
                   "into it.")
@click.option("--no-progress", is_flag=True, help="Hide the tqdm progress bars.")
def train_demo(data, out, seed, unet_steps, unet_batch_size, classifier_epochs,
               clean_classifier_epochs, classifier_steps, classifier_batch_size, train_limit, test_limit, workers, threads,
               quick, only_missing, no_progress):
    """Train the embedded demo denoiser and classifiers on Fashion-MNIST (CPU, fixed seeds)."""
    budget = QUICK_BUDGET if quick else DemoBudget()
    overrides = dict(unet_steps=unet_steps, unet_batch_size=unet_batch_size,
                     classifier_epochs=classifier_epochs, clean_classifier_epochs=clean_classifier_epochs,
                     classifier_steps=classifier_steps,
                     classifier_batch_size=classifier_batch_size, train_limit=train_limit,
                     test_limit=test_limit)
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if (classifier_epochs, clean_classifier_epochs) != (None, None) and classifier_steps is None:
        overrides["classifier_steps"] = None       # explicit epochs beat the quick budget's steps
    budget = dataclasses.replace(budget, **overrides)
    training = DemoTraining(data_dir=data, seed=seed, budget=budget, workers=workers, threads=threads,
                            only_missing=only_missing)
    manifest = run(out, training, command=_command_line(), progress=not no_progress)
    for name, entry in manifest["models"].items():
        click.echo(f"{name}: {entry['file_bytes']} bytes, {entry['training']['wall_time_s']} s")
    click.echo(f"wrote {Path(out) / 'MODELS.json'}")


def _command_line() -> str:
    """How this process was started, as a shell command (python -m form for direct module runs)."""
    prog = Path(sys.argv[0]).name
    if prog in ("train_demo.py", "-c"):
        prog = "python -m diffsmooth.cli.train_demo"
    return " ".join([prog] + [shlex.quote(a) for a in sys.argv[1:]])


if __name__ == "__main__":
    train_demo()

"""`diffsmooth train-demo`: retrain the embedded demo models and their MODELS.json manifest."""

from __future__ import annotations

import dataclasses
import shlex
import sys
from pathlib import Path

import click

from diffsmooth.engine.demo.training import DEFAULT_DATA_DIR, QUICK_BUDGET, DemoBudget
from diffsmooth.engine.demo.training import train_demo as run
from diffsmooth.engine.models.shipped import ASSETS


def _at_least(lo):
    """A click callback refusing values below `lo`."""
    def check(ctx, param, value):
        if value is not None and value < lo:
            raise click.BadParameter(f"must be >= {lo}, got {value}")
        return value
    return check


@click.command("train-demo")
@click.option("--data", default=DEFAULT_DATA_DIR, show_default=True, type=click.Path(),
              help="Folder with the Fashion-MNIST IDX files (train-* and t10k-*).")
@click.option("--out", default=str(ASSETS), show_default=True, type=click.Path(),
              help="Where to write demo_unet.pt, demo_classifier_s*.pt and MODELS.json.")
@click.option("--seed", default=0, show_default=True, type=int, help="Base seed of all training runs.")
@click.option("--unet-steps", type=int, callback=_at_least(1), help="Denoiser optimisation steps [default: 300].")
@click.option("--unet-batch-size", type=int, callback=_at_least(1), help="Denoiser batch size [default: 128].")
@click.option("--classifier-epochs", type=float, callback=_at_least(0.001),
              help="Epochs of each noisy (sigma 0.25, 0.5) classifier [default: 1].")
@click.option("--clean-classifier-epochs", type=float, callback=_at_least(0.001),
              help="Epochs of the clean (sigma 0) classifier [default: 2].")
@click.option("--classifier-steps", type=int, callback=_at_least(1),
              help="Steps per classifier (overrides both epoch options).")
@click.option("--classifier-batch-size", type=int, callback=_at_least(1), help="Classifier batch size [default: 128].")
@click.option("--train-limit", type=int, callback=_at_least(1), help="Train on only the first N images.")
@click.option("--test-limit", type=int, callback=_at_least(1), help="Evaluate on only the first N test images.")
@click.option("--workers", type=int, callback=_at_least(1),
              help="Processes training models in parallel [default: usable cores, at most 2].")
@click.option("--threads", type=int, callback=_at_least(1),
              help="Torch threads per worker [default: cores // workers].")
@click.option("--quick", is_flag=True, help="Tiny budget for smoke tests (a few steps on 256 images).")
@click.option("--no-progress", is_flag=True, help="Hide the tqdm progress bars.")
def train_demo(data, out, seed, unet_steps, unet_batch_size, classifier_epochs,
               clean_classifier_epochs, classifier_steps, classifier_batch_size, train_limit, test_limit, workers, threads,
               quick, no_progress):
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
    manifest = run(out, data, seed=seed, budget=budget, workers=workers, threads=threads,
                   command=_command_line(), progress=not no_progress)
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

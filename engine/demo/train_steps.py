"""The training steps the demo's denoisers and classifiers share: the result record, the LR schedule,
batches, flips, the focused timestep draw, the optimiser step with EMA weights and the denoisers' loop around
it (train_with_ema); and the settings of the engine UNet's and the classifiers' recipes (DenoiserTraining,
ClassifierTraining: training.py's trainers).

engine/demo/training.py (the engine's UNet and the classifiers) and engine/demo/diffusers_training.py
(diffusers' UNet2DModel) both build on this module; neither imports the other's internals.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
import torch
from tqdm.auto import tqdm

from diffsmooth.engine.errors import UserError

# Timesteps the one-shot denoiser is used at: t* for sigma 0.12 .. 1.0 is 573 .. 2809 (docs/compatibility.md).
# Training draws t uniformly from FOCUS_RANGE with probability FOCUS_PROB, else uniformly from
# the whole schedule, so the small budget goes where inference happens while the model stays a
# DDPM over all of [0, T).
FOCUS_RANGE = (500, 2900)
FOCUS_PROB = 0.8


@dataclass
class TrainResult:
    """A trained model with its per-step losses and bookkeeping for the manifest."""

    model: torch.nn.Module
    losses: list[float]
    steps: int
    batch_size: int
    wall_time_s: float
    settings: dict = field(default_factory=dict)

    @property
    def final_loss(self) -> float:
        """Mean training loss over the last 10% of steps (at least the last one)."""
        k = max(1, len(self.losses) // 10)
        return float(np.mean(self.losses[-k:]))


@dataclass(frozen=True)
class DenoiserTraining:
    """The UNet's DDPM recipe (training.train_denoiser): AdamW, warmup + cosine LR, EMA, focused timesteps, seed."""

    steps: int = 1000
    batch_size: int = 128
    lr: float = 2e-3
    weight_decay: float = 0.0
    warmup: int = 50                    # LR warmup steps (at most steps // 5)
    ema_decay: float = 0.995
    grad_clip: float = 1.0
    focus: tuple[int, int] = FOCUS_RANGE
    focus_prob: float = FOCUS_PROB
    flip: bool = True                   # random horizontal flips
    seed: int = 0


@dataclass(frozen=True)
class ClassifierTraining:
    """A Gaussian-augmented classifier's recipe (training.train_classifier): SGD, warmup + cosine LR, seed."""

    epochs: float = 3
    steps: Optional[int] = None         # overrides `epochs` when given
    batch_size: int = 128
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 5e-4
    warmup_fraction: float = 0.1        # LR warmup, as a share of the steps
    flip: bool = True                   # random horizontal flips
    seed: int = 0


def warmup_cosine(step: int, total: int, warmup: int, floor: float = 0.0) -> float:
    """LR multiplier: linear warmup over `warmup` steps, then cosine decay from 1 to `floor`."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def random_flip(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Horizontally flip each image with probability 1/2 (drawn from `gen`)."""
    flip = torch.rand(x.shape[0], generator=gen) < 0.5
    return torch.where(flip[:, None, None, None], x.flip(-1), x)


def batches(n: int, batch_size: int, steps: int, gen: torch.Generator):
    """Yield `steps` index batches: successive random permutations of range(n), no short batches."""
    batch_size = min(batch_size, n)
    perm, pos = torch.randperm(n, generator=gen), 0
    for _ in range(steps):
        if pos + batch_size > n:
            perm, pos = torch.randperm(n, generator=gen), 0
        yield perm[pos:pos + batch_size]
        pos += batch_size


def check_images(images: torch.Tensor, what: str) -> None:
    if images.dim() != 4 or images.dtype != torch.float32:
        raise UserError(f"{what}: expected float32 images [N,C,H,W] in [0,1], got "
                        f"{images.dtype} {tuple(images.shape)}")
    if images.shape[0] < 1:
        raise UserError(f"{what}: no training images")


def sample_timesteps(batch: int, num_steps: int, gen: torch.Generator,
                     focus: tuple[int, int] = FOCUS_RANGE, focus_prob: float = FOCUS_PROB) -> torch.Tensor:
    """Integer timesteps: uniform in `focus` (clipped to the schedule) w.p. focus_prob, else uniform in [0, T)."""
    lo, hi = max(0, min(focus[0], num_steps - 1)), max(1, min(focus[1], num_steps))
    if hi <= lo:
        lo, hi = 0, num_steps
    in_focus = torch.randint(lo, hi, (batch,), generator=gen)
    anywhere = torch.randint(0, num_steps, (batch,), generator=gen)
    pick = torch.rand(batch, generator=gen) < focus_prob
    return torch.where(pick, in_focus, anywhere)


def step_with_ema(model, ema, opt, sched, loss: torch.Tensor, n: int, grad_clip: float, ema_decay: float) -> None:
    """One optimiser step on `loss` (gradients clipped to `grad_clip` when set, the LR schedule
    advanced), then the EMA weights (decay min(ema_decay, (1+n)/(10+n)) at step n; buffers copied)."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if grad_clip:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    opt.step()
    sched.step()
    decay = min(ema_decay, (1.0 + n) / (10.0 + n))
    with torch.no_grad():
        for pe, pm in zip(ema.parameters(), model.parameters()):
            pe.lerp_(pm, 1.0 - decay)
        for be, bm in zip(ema.buffers(), model.buffers()):
            be.copy_(bm)


def train_with_ema(model, ema, images: torch.Tensor, recipe, gen: torch.Generator,
                   loss_of: Callable[[torch.Tensor], torch.Tensor], desc: str, progress: bool) -> list[float]:
    """The denoisers' shared loop: `ema` starts as `model`'s copy; AdamW (the recipe's weight decay, else none),
    linear warmup (at most steps // 5) then cosine to 5%; each step's batch flipped when the recipe says, mapped
    to x0 = 2x - 1 and given to `loss_of` (which draws its t and eps from `gen`), then step_with_ema. The losses."""
    ema.load_state_dict(model.state_dict())
    ema.requires_grad_(False)
    steps, warm = recipe.steps, min(recipe.warmup, max(1, recipe.steps // 5))
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=getattr(recipe, "weight_decay", 0.0))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: warmup_cosine(s, steps, warm, floor=0.05))
    losses: list[float] = []
    bar = tqdm(batches(images.shape[0], recipe.batch_size, steps, gen), total=steps, disable=not progress,
               desc=desc, unit="step", mininterval=5.0, dynamic_ncols=True)
    for n, idx in enumerate(bar):
        x = random_flip(images[idx], gen) if recipe.flip else images[idx]
        loss = loss_of(2.0 * x - 1.0)
        step_with_ema(model, ema, opt, sched, loss, n, recipe.grad_clip, recipe.ema_decay)
        losses.append(loss.item())
        if n % 10 == 0:
            bar.set_postfix(loss=f"{np.mean(losses[-50:]):.4f}")
    bar.close()
    return losses

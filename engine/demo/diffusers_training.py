"""The demo's diffusers-format denoiser: diffusers' own `UNet2DModel` and `DDPMScheduler` trained as a
DDPM on the demo's Fashion-MNIST training images and saved with `save_pretrained` (safetensors), so
the demo can put DDS with a diffusers denoiser beside DDS with the engine's UNet.

The recipe is the demo UNet's (training.train_denoiser, from train_steps.py): MSE on eps, AdamW with warmup and cosine
decay, EMA weights, random flips, and timesteps drawn mostly where one-shot denoising uses them; only
the model, the noise schedule (diffusers' cosine, 1000 steps) and the noising call are diffusers'.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from diffsmooth.engine.base_classifier.one_step import DiscreteSchedule
from diffsmooth.engine.demo.train_steps import (
    FOCUS_PROB,
    TrainResult,
    check_images,
    sample_timesteps,
    train_with_ema,
)
from diffsmooth.engine.errors import UserError

DDPM_SEED_OFFSET = 100                # its seed: train-demo's --seed + 100 (the classifiers take seed + 1 + i)
FOCUS_SIGMAS = (0.12, 1.0)            # the smoothing noise levels whose t* bound the focused timesteps

# diffusers' UNet2DModel at the demo UNet's size (about 0.8 M parameters): three levels, one res block
# each, attention at the lowest resolution.
UNET_CONFIG = dict(sample_size=32, in_channels=1, out_channels=1, layers_per_block=1,
                   block_out_channels=(32, 32, 64), down_block_types=("DownBlock2D", "DownBlock2D", "AttnDownBlock2D"),
                   up_block_types=("AttnUpBlock2D", "UpBlock2D", "UpBlock2D"), norm_num_groups=8,
                   attention_head_dim=16)
SCHEDULER_CONFIG = dict(num_train_timesteps=1000, beta_schedule="squaredcos_cap_v2", prediction_type="epsilon",
                        clip_sample=True)


def _diffusers():
    try:
        import diffusers
    except ImportError:
        raise UserError("the demo's diffusers denoiser needs diffusers and safetensors: "
                        "pip install 'diffsmooth-engine[diffusers]'") from None
    return diffusers


def focus_range(alphas_cumprod: np.ndarray, sigmas: Sequence[float] = FOCUS_SIGMAS) -> Tuple[int, int]:
    """[t*(lowest sigma), t*(highest sigma) + 1): where one-shot denoising queries the model (t* by the
    rule the engine's diffusers denoiser uses)."""
    schedule = DiscreteSchedule("DDPMScheduler", "epsilon", len(alphas_cumprod), tuple(float(a) for a in alphas_cumprod))
    return schedule.timestep(min(sigmas)), schedule.timestep(max(sigmas)) + 1


@dataclass(frozen=True)
class DdpmTraining:
    """The diffusers DDPM's recipe: AdamW (no weight decay), warmup + cosine LR, EMA, flips, its seed."""

    steps: int = 300
    batch_size: int = 128
    lr: float = 2e-3
    warmup: int = 50                    # LR warmup steps (at most steps // 5)
    ema_decay: float = 0.995
    grad_clip: float = 1.0
    flip: bool = True                   # random horizontal flips
    seed: int = DDPM_SEED_OFFSET


def train_diffusers_ddpm(images: torch.Tensor, settings: DdpmTraining = DdpmTraining(), *,
                         progress: bool = True) -> Tuple[TrainResult, object]:
    """Train diffusers' UNet2DModel on [0, 1] images (x0 = 2x - 1) to predict eps under diffusers'
    DDPMScheduler (`settings`: the recipe); returns (the EMA model's TrainResult, the scheduler)."""
    steps, batch_size, lr, warmup = settings.steps, settings.batch_size, settings.lr, settings.warmup
    ema_decay, grad_clip, flip, seed = settings.ema_decay, settings.grad_clip, settings.flip, settings.seed
    diffusers = _diffusers()
    check_images(images, "train_diffusers_ddpm")
    if images.shape[1] != UNET_CONFIG["in_channels"]:
        raise UserError(f"train_diffusers_ddpm: images have {images.shape[1]} channels, the UNet takes "
                        f"{UNET_CONFIG['in_channels']}")
    scheduler = diffusers.DDPMScheduler(**SCHEDULER_CONFIG)
    torch.manual_seed(seed)                       # weight init
    gen = torch.Generator().manual_seed(seed)     # data order, flips, t and eps
    model = diffusers.UNet2DModel(**UNET_CONFIG).train()
    ema = diffusers.UNet2DModel(**UNET_CONFIG).eval()
    focus = focus_range(scheduler.alphas_cumprod.numpy())
    warm = min(warmup, max(1, steps // 5))

    def loss_of(x0):
        t = sample_timesteps(x0.shape[0], scheduler.config.num_train_timesteps, gen, focus, FOCUS_PROB)
        eps = torch.randn(x0.shape, generator=gen)
        return F.mse_loss(model(scheduler.add_noise(x0, eps, t), t).sample, eps)
    start = time.perf_counter()
    losses = train_with_ema(model, ema, images, settings, gen, loss_of, "diffusers ddpm", progress)
    settings = dict(library=f"diffusers {diffusers.__version__}", model="UNet2DModel", unet_config=UNET_CONFIG,
                    scheduler="DDPMScheduler", scheduler_config=SCHEDULER_CONFIG, optimizer="AdamW", lr=lr,
                    lr_schedule=f"linear warmup {warm} steps, cosine to 5%", ema_decay=ema_decay,
                    ema_warmup="decay = min(ema_decay, (1+n)/(10+n))", grad_clip=grad_clip,
                    loss="MSE between predicted and true eps; x_t = scheduler.add_noise(x0, eps, t)",
                    data_range="x0 = 2*x - 1 in [-1, 1]", random_flip=flip,
                    timestep_sampling=(f"uniform integer t in [{focus[0]}, {focus[1]}) with probability {FOCUS_PROB:g} "
                                       f"(t* for sigma {FOCUS_SIGMAS[0]}..{FOCUS_SIGMAS[1]}), else uniform in [0, "
                                       f"{scheduler.config.num_train_timesteps})"),
                    seed=seed)
    result = TrainResult(ema, losses, steps, min(batch_size, images.shape[0]), time.perf_counter() - start, settings)
    return result, scheduler


def save_ddpm_folder(folder: Path, unet, scheduler) -> None:
    """A diffusers pipeline folder (model_index.json, unet/ with safetensors weights, scheduler/)."""
    diffusers = _diffusers()
    diffusers.DDPMPipeline(unet=unet, scheduler=scheduler).save_pretrained(str(folder), safe_serialization=True)

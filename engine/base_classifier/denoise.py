"""Loading a one-shot diffusion denoiser: an improved-/guided-diffusion UNet checkpoint
(engine/base_classifier/diffusion_denoiser.py has the denoiser and its equations) or a diffusers
folder (engine/base_classifier/diffusers_denoise.py).
"""

from __future__ import annotations

from typing import Optional

from diffsmooth.engine.base_classifier.diffusers_denoise import load_diffusers_denoiser
from diffsmooth.engine.base_classifier.diffusion_denoiser import (
    PRESET_SCHEDULES,
    DiffusionDenoiser,
    schedule_for,
)
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.models.checkpoints import load_unet
from diffsmooth.engine.models.diffusers_folder import DiffusersFolder, is_diffusers_folder

__all__ = ["PRESET_SCHEDULES", "DiffusionDenoiser", "schedule_for", "load_denoiser"]


class _DefaultPreset(str):
    """The preset load_denoiser assumes when none is given: equal to 'cifar10', but a diffusers folder can
    tell it from a preset a caller names (which it refuses)."""


_DEFAULT_PRESET = _DefaultPreset("cifar10")


def load_denoiser(path, preset: Optional[str] = _DEFAULT_PRESET, *, schedule: Optional[str] = None,
                  diffusion_steps: Optional[int] = None, rescale_timesteps: Optional[bool] = None,
                  scheduler=None, **config) -> DiffusionDenoiser:
    """Load an improved-/guided-diffusion UNet state dict as a one-shot denoiser (eval mode, CPU), or a
    diffusers folder: a pipeline folder, or a UNet folder with its `scheduler` folder.

    `preset` picks the architecture and schedule ('cifar10', 'imagenet', 'demo'); keyword
    arguments override UNet config fields, or give the whole config when preset is None. A diffusers
    folder (or the DiffusersFolder read from it) brings its own config and schedule: it takes none of them.
    """
    if isinstance(path, DiffusersFolder) or is_diffusers_folder(path):
        given = [name for name, value in (("preset", None if preset is _DEFAULT_PRESET else preset),
                                          ("schedule", schedule), ("diffusion_steps", diffusion_steps),
                                          ("rescale_timesteps", rescale_timesteps)) if value is not None]
        if given or config:
            raise UserError(f"{getattr(path, 'path', path)} is a diffusers folder, whose configs give the UNet and its "
                            f"schedule: leave out {', '.join([*given, *sorted(config)])}")
        return load_diffusers_denoiser(path, scheduler)
    if scheduler is not None:
        raise UserError("`scheduler` is for a diffusers UNet folder; a checkpoint file takes `preset` / `schedule`")
    unet = load_unet(path, preset, **config)
    return DiffusionDenoiser(unet, schedule_for(preset, schedule, diffusion_steps, rescale_timesteps))

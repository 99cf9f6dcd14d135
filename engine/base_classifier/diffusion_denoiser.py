"""The one-shot diffusion denoiser of DiffSmooth / DDS: x_rs in [0,1] -> purified image in [0,1].

x_t = sqrt(abar*) (2 x_rs - 1);  x0 = clamp(sqrt(1/abar*) x_t - sqrt(1/abar* - 1) eps(x_t, t*), -1, 1);
returned as (x0 + 1) / 2. eps = the UNet's first C output channels (docs/compatibility.md). The module is
one_step.py's OneStepModule in its epsilon form.

The denoiser class and the presets' schedules; loading one (a checkpoint file or a diffusers folder) is
engine/base_classifier/denoise.py, which sits above this module and diffusers_denoise.py.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from diffsmooth.engine.base_classifier.one_step import OneStepModule
from diffsmooth.engine.base_classifier.schedule import DiffusionSchedule
from diffsmooth.engine.errors import UserError

# The diffusion schedule each UNet preset was trained with.
PRESET_SCHEDULES = {
    "cifar10": DiffusionSchedule("cosine", 4000, rescale_timesteps=True),    # improved-diffusion
    "imagenet": DiffusionSchedule("linear", 1000, rescale_timesteps=False),  # guided-diffusion
    "demo": DiffusionSchedule("cosine", 4000, rescale_timesteps=True),       # the embedded model
}


class DiffusionDenoiser(nn.Module):
    """A noise-predicting UNet with its schedule; `.denoise(x_rs, sigma)` is one-shot denoising."""

    def __init__(self, unet: nn.Module, schedule: DiffusionSchedule, channels: Optional[int] = None):
        super().__init__()
        self.unet = unet.eval()
        self.schedule = schedule
        self.channels = channels if channels is not None else unet.config.in_channels

    def timestep(self, sigma: float) -> int:
        """t*: the first timestep whose noise level reaches 2*sigma in [-1, 1] image units."""
        return self.schedule.timestep(sigma)

    def purifier(self, sigma: float, fused_attention: bool = False, lean: bool = False) -> OneStepModule:
        """An nn.Module computing denoise(., sigma), sharing this UNet's weights; `fused_attention`
        runs the UNet's attention through scaled_dot_product_attention (GPU fast path). `lean` (the
        lean UNet): on its own copy of the UNet that computes only the noise estimate (UNetModel.eps_only),
        with t*'s time embedding computed once per call at batch 1 and broadcast; the same maths."""
        unet = self.unet
        if lean:
            if not hasattr(unet, "eps_only"):
                raise UserError(f"the lean UNet needs the engine's UNetModel, not {type(unet).__name__}")
            unet = unet.eps_only()
        if fused_attention:
            if not hasattr(unet, "with_fused_attention"):
                raise UserError(f"fused attention needs the engine's UNetModel, not {type(unet).__name__}")
            unet = unet.with_fused_attention()
        purifier = OneStepModule(unet, self.schedule.coefficients(sigma), self.channels, epsilon_form=True)
        if lean:
            purifier.shared_timestep = True
        return purifier

    @torch.inference_mode()
    def denoise(self, x_rs: torch.Tensor, sigma: float) -> torch.Tensor:
        """Purify x_rs = x + sigma * eps (float32 [B,C,H,W], [0,1] scale) in one UNet call."""
        if x_rs.dim() != 4 or x_rs.shape[1] != self.channels:
            raise UserError(f"denoise expects [B,{self.channels},H,W] images, got {tuple(x_rs.shape)}")
        return self.purifier(sigma)(x_rs)


def schedule_for(preset: Optional[str], schedule: Optional[str] = None,
                 diffusion_steps: Optional[int] = None,
                 rescale_timesteps: Optional[bool] = None) -> DiffusionSchedule:
    """The preset's schedule, with any explicitly given field overriding it."""
    base = PRESET_SCHEDULES.get(preset) if preset else None
    if preset and base is None:
        raise UserError(f"unknown preset {preset!r}: choose one of {', '.join(PRESET_SCHEDULES)}")
    if base is None and (schedule is None or diffusion_steps is None):
        raise UserError("a UNet without a preset needs schedule= ('linear'|'cosine') and diffusion_steps=")
    return DiffusionSchedule(
        schedule or base.name,
        int(diffusion_steps if diffusion_steps is not None else base.num_steps),     # 0 is refused, not the preset's
        bool(base.rescale_timesteps if rescale_timesteps is None and base else rescale_timesteps),
    )

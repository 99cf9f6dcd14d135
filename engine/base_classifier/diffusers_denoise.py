"""A diffusers denoiser folder as the engine's denoiser: x_rs in [0,1] -> x_hat in [0,1] at a sigma.

`load_diffusers_denoiser(folder)` reads the folder (engine/models/diffusers_folder.py), builds the
UNet (engine/models/diffusers_unet.py) and the schedule from the scheduler's config, and returns a
`DiffusersDenoiser`, which the pipeline uses like any other: `purifier(sigma)` is one network call
(engine/base_classifier/one_step.py has the equations).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from diffsmooth.engine.base_classifier.diffusion_denoiser import DiffusionDenoiser
from diffsmooth.engine.base_classifier.one_step import (
    ConsistencySchedule,
    DiscreteSchedule,
    OneStepCoefficients,
    OneStepModule,
)
from diffsmooth.engine.errors import UserError, first_line
from diffsmooth.engine.models.diffusers_folder import DiffusersFolder, read_diffusers_folder
from diffsmooth.engine.models.diffusers_unet import import_diffusers, load_diffusers_unet, unknown_fields

__all__ = ["DiffusersDenoiser", "load_diffusers_denoiser", "schedule_of", "check_sigma"]


class DiffusersDenoiser(DiffusionDenoiser):
    """A diffusers UNet2DModel with its scheduler's schedule; `.denoise(x_rs, sigma)` is one network call.
    Its attention is diffusers' own (torch's scaled_dot_product_attention), fused or not."""

    def __init__(self, unet: nn.Module, schedule, channels: int, folder: Optional[DiffusersFolder] = None):
        super().__init__(unet, schedule, channels)
        self.kind = "consistency" if isinstance(schedule, ConsistencySchedule) else "ddpm"
        self.format = folder.format if folder is not None else None
        self.folder = folder

    def new_scheduler(self):
        """A fresh instance of the folder's own scheduler (a method that steps through it sets its timesteps)."""
        if self.folder is None:
            raise UserError("this diffusers denoiser was built without its folder: it has no scheduler to step")
        return _scheduler_instance(self.folder)

    def coefficients(self, sigma: float) -> OneStepCoefficients:
        return self.schedule.coefficients(sigma)

    def timestep(self, sigma: float):
        """t* for the DDPM family; the model's timestep input (250 log 2 sigma) for a consistency model."""
        c = self.coefficients(sigma)
        return c.t if c.t is not None else c.model_timestep

    def purifier(self, sigma: float, fused_attention: bool = False, lean: bool = False) -> OneStepModule:
        """denoise(., sigma) as a module sharing this UNet's weights (`fused_attention` changes nothing:
        diffusers' attention already runs through scaled_dot_product_attention; nor does `lean`, the
        engine UNet's eps-only copy: a diffusers UNet runs as it is)."""
        return OneStepModule(self.unet, self.coefficients(sigma), self.channels)


def _scheduler_instance(folder: DiffusersFolder):
    diffusers = import_diffusers()
    name = folder.scheduler_class
    cls = getattr(diffusers, name)
    config = {k: v for k, v in folder.scheduler_config.items() if not k.startswith("_")}
    unknown = unknown_fields(cls, config)
    where = folder.scheduler_dir / "scheduler_config.json"
    if unknown:
        raise UserError(f"{where} has field(s) {', '.join(unknown[:5])} that diffusers {diffusers.__version__}'s "
                        f"{name} does not know: upgrade diffusers, or fix the config")
    try:
        return cls(**config)
    except (NotImplementedError, ValueError, TypeError, KeyError, RuntimeError) as exc:
        raise UserError(f"{where}: diffusers cannot build {name} from it ({type(exc).__name__}: "
                        f"{first_line(exc)[:160]})") from None


def schedule_of(folder: DiffusersFolder):
    """The folder's schedule: DiscreteSchedule (DDPM family) or ConsistencySchedule."""
    scheduler = _scheduler_instance(folder)
    config = scheduler.config
    if folder.kind == "consistency":
        low, high, data = float(config.sigma_min), float(config.sigma_max), float(config.sigma_data)
        if not 0 <= low < high or not data > 0:
            raise UserError(f"{folder.scheduler_dir / 'scheduler_config.json'}: sigma_min={low:g}, sigma_max={high:g}, "
                            f"sigma_data={data:g} do not describe a noise range")
        return ConsistencySchedule(low, high, data, folder.scheduler_class)
    abar = scheduler.alphas_cumprod
    if not isinstance(abar, torch.Tensor) or abar.dim() != 1 or not bool(torch.isfinite(abar).all()):
        raise UserError(f"{folder.scheduler_dir / 'scheduler_config.json'}: the schedule's alphas_cumprod are not "
                        f"finite; check beta_start / beta_end / trained_betas")
    return DiscreteSchedule(folder.scheduler_class, str(config.prediction_type), int(config.num_train_timesteps),
                            tuple(float(a) for a in abar.tolist()))


def check_sigma(folder: DiffusersFolder, sigma: float) -> None:
    """UserError when the read folder's schedule cannot denoise at `sigma` (from its configs, no weights)."""
    schedule_of(folder).coefficients(sigma)


def load_diffusers_denoiser(path, scheduler=None) -> DiffusersDenoiser:
    """A diffusers pipeline folder (or a UNet folder and its `scheduler` folder; or the DiffusersFolder read
    from them) as a one-step denoiser (eval mode, fp32, CPU)."""
    folder = path if isinstance(path, DiffusersFolder) else read_diffusers_folder(path, scheduler)
    schedule = schedule_of(folder)              # config errors before the weights are read
    unet = load_diffusers_unet(folder)
    return DiffusersDenoiser(unet, schedule, folder.channels, folder)

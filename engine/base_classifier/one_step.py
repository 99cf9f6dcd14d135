"""One-step purification: the module every one-shot denoiser runs (the engine UNet's DDPM one-shot and a
diffusers folder's) and a diffusers denoiser's coefficients at a smoothing sigma.

Every kind the engine takes reduces to one network call F on an input scaled from x_rs in [0, 1]
(docs/compatibility.md, "diffusers denoisers"):

    x_t   = input_scale * (2 x_rs - 1)
    x0    = clamp(c_skip * x_t + c_out * F(c_in * x_t, model_timestep)[:, :C], -1, 1)
    x_hat = (x0 + 1) / 2

DDPM family (DDPMScheduler / DDIMScheduler): t* = the first t of the scheduler's own alphas_cumprod with
sqrt((1 - abar_t) / abar_t) >= 2 sigma (the paper's rule), input_scale = sqrt(abar*), c_in = 1, and
(c_skip, c_out) = (1/sqrt(abar*), -sqrt(1/abar* - 1)) for epsilon, (0, 1) for sample,
(sqrt(abar*), -sqrt(1 - abar*)) for v_prediction: the pred_original_sample of DDPMScheduler.step.
Consistency models (CMStochasticIterativeScheduler): the model sees x = 2 x_rs - 1 at noise level
s = 2 sigma, input_scale = 1, c_in = 1/sqrt(s^2 + sd^2), c_skip = sd^2/((s - s_min)^2 + sd^2),
c_out = (s - s_min) sd/sqrt(s^2 + sd^2), model_timestep = 250 log(s + 1e-44): the scheduler's
scale_model_input, boundary-condition scalings and sigma_to_t at s.
The engine UNet's DDPM one-shot (schedule.py's OneShotCoefficients) is the epsilon case above, computed as
improved-diffusion writes it: x0 = sqrt(1/abar*) x_t - sqrt(1/abar* - 1) eps(x_t, t*).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import nn

from diffsmooth.engine.base_classifier.schedule import first_timestep
from diffsmooth.engine.errors import UserError

__all__ = ["OneStepCoefficients", "DiscreteSchedule", "ConsistencySchedule", "OneStepModule",
           "ONE_STEP_BUFFERS", "EPSILON_BUFFERS", "PREDICTION_TYPES"]

PREDICTION_TYPES = ("epsilon", "sample", "v_prediction")
# The sigma-dependent inputs of the purifier, held as fp32 buffers (a compiled graph reads them at run time).
ONE_STEP_BUFFERS = ("sigma", "model_timestep", "input_scale", "c_in", "c_skip", "c_out")
# The epsilon form's (the engine UNet's DDPM one-shot): c_in = 1 is not applied and c_out is subtracted as its
# magnitude, the floats and exported graph (its ops, so its sha256) improved-diffusion's order gives.
EPSILON_BUFFERS = ("sigma", "model_timestep", "input_scale", "c_skip", "minus_c_out")


@dataclass(frozen=True)
class OneStepCoefficients:
    """Everything the one-step purifier needs at one sigma."""

    sigma: float
    t: Optional[int]            # t* (DDPM family); None for a consistency model
    noise_level: float          # the model's noise level: 2 sigma (consistency), sqrt((1-abar*)/abar*) (DDPM)
    model_timestep: float
    input_scale: float
    c_in: float
    c_skip: float
    c_out: float


def _check_sigma(sigma: float) -> None:
    if not (isinstance(sigma, (int, float)) and math.isfinite(sigma) and sigma > 0):
        raise UserError(f"sigma must be > 0, got {sigma}")


@dataclass(frozen=True)
class DiscreteSchedule:
    """A DDPM-family scheduler's discrete schedule: its alphas_cumprod (as the scheduler computes them,
    float32, then float64 here) and what the model predicts."""

    scheduler: str
    prediction_type: str
    num_train_timesteps: int
    alphas_cumprod: tuple = field(repr=False)

    def __post_init__(self):
        if self.prediction_type not in PREDICTION_TYPES:
            raise UserError(f"{self.scheduler} prediction_type {self.prediction_type!r} is not one of "
                            f"{', '.join(PREDICTION_TYPES)}")

    def timestep(self, sigma: float) -> int:
        """t* (schedule.first_timestep, the one search)."""
        return first_timestep(self.alphas_cumprod, sigma, f"this {self.scheduler}'s {len(self.alphas_cumprod)} steps")

    def coefficients(self, sigma: float) -> OneStepCoefficients:
        t = self.timestep(sigma)
        abar = float(self.alphas_cumprod[t])
        if self.prediction_type == "epsilon" and abar <= 0.0:
            raise UserError(f"sigma={sigma} falls on {self.scheduler}'s last step, whose alphas_cumprod is 0 (zero "
                            f"terminal SNR): an epsilon-predicting model cannot recover x0 there; use a smaller sigma")
        if self.prediction_type == "epsilon":
            c_skip, c_out = math.sqrt(1.0 / abar), -math.sqrt(1.0 / abar - 1.0)
        elif self.prediction_type == "sample":
            c_skip, c_out = 0.0, 1.0
        else:                                                   # v_prediction
            c_skip, c_out = math.sqrt(abar), -math.sqrt(1.0 - abar)
        level = math.sqrt((1.0 - abar) / abar) if abar > 0 else math.inf
        return OneStepCoefficients(sigma=float(sigma), t=t, noise_level=level, model_timestep=float(t),
                                   input_scale=math.sqrt(abar), c_in=1.0, c_skip=c_skip, c_out=c_out)


@dataclass(frozen=True)
class ConsistencySchedule:
    """A consistency model's noise range and data scale (CMStochasticIterativeScheduler's config)."""

    sigma_min: float
    sigma_max: float
    sigma_data: float
    scheduler: str = "CMStochasticIterativeScheduler"

    def coefficients(self, sigma: float) -> OneStepCoefficients:
        _check_sigma(sigma)
        s, s_min, sd = 2.0 * float(sigma), float(self.sigma_min), float(self.sigma_data)
        if not s_min <= s <= self.sigma_max:
            raise UserError(f"sigma={sigma} is noise level 2 sigma = {s:g} on the consistency model's [-1, 1] scale, "
                            f"outside its [sigma_min, sigma_max] = [{s_min:g}, {self.sigma_max:g}]: use sigma in "
                            f"[{s_min / 2:g}, {self.sigma_max / 2:g}]")
        return OneStepCoefficients(
            sigma=float(sigma), t=None, noise_level=s, model_timestep=1000.0 * 0.25 * math.log(s + 1e-44),
            input_scale=1.0, c_in=1.0 / math.sqrt(s * s + sd * sd),
            c_skip=sd * sd / ((s - s_min) ** 2 + sd * sd), c_out=(s - s_min) * sd / math.sqrt(s * s + sd * sd))


class OneStepModule(nn.Module):
    """A one-step denoiser at one sigma, x_rs -> x_hat in [0, 1]: x0 = c_skip x_t + c_out F(c_in x_t, t). The
    coefficients are fp32 buffers that forward reads, so a compiled graph or CUDA graph reads them at run time and
    `set_coefficients` moves a built (or compiled) module to another sigma in place (engine/runs/model_set.py);
    `epsilon_form` runs the engine UNet's DDPM one-shot (EPSILON_BUFFERS) in its own order of operations."""

    shared_timestep = False     # True (lean UNet): t* as one timestep [1], its embedding computed once per call

    def __init__(self, unet, coefficients, channels: int, epsilon_form: bool = False):
        super().__init__()
        self.unet = unet
        self.channels = channels
        self.buffer_names = EPSILON_BUFFERS if epsilon_form else ONE_STEP_BUFFERS
        for name in self.buffer_names:
            self.register_buffer(name, torch.zeros((), dtype=torch.float32), persistent=False)
        self.set_coefficients(coefficients)
        self.epsilon_form = epsilon_form

    def set_coefficients(self, coefficients) -> None:
        """Write another sigma's constants into the buffers (same tensors, new values)."""
        with torch.inference_mode():
            for name in self.buffer_names:
                getattr(self, name).fill_(float(getattr(coefficients, name)))

    def forward(self, x_rs: torch.Tensor) -> torch.Tensor:
        x_t = self.input_scale * (2.0 * x_rs - 1.0)
        t = self.model_timestep.reshape(1) if self.shared_timestep else self.model_timestep.expand(x_rs.shape[0])
        if self.epsilon_form:
            eps = self.unet(x_t, t)[:, : self.channels].to(x_t.dtype)
            x0 = self.c_skip * x_t - self.minus_c_out * eps
        else:
            out = self.unet(self.c_in * x_t, t)[:, : self.channels].to(x_t.dtype)
            x0 = self.c_skip * x_t + self.c_out * out
        return (x0.clamp(-1.0, 1.0) + 1.0) / 2.0

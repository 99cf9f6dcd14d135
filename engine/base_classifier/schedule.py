"""Diffusion noise schedules (linear, cosine), the timestep t* for a smoothing sigma, and the
one-shot denoising coefficients, exactly as improved-/guided-diffusion compute them (float64)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from diffsmooth.engine.errors import UserError


def betas_for(schedule: str, num_steps: int) -> np.ndarray:
    """Betas of the `linear` or `cosine` schedule with `num_steps` steps, float64."""
    if num_steps < 1:
        raise UserError(f"a schedule needs at least 1 step, got {num_steps}")
    if schedule == "linear":
        if num_steps < 50:
            raise UserError(f"the linear schedule needs >= 50 steps (betas would exceed 1), got {num_steps}")
        scale = 1000.0 / num_steps
        return np.linspace(scale * 1e-4, scale * 0.02, num_steps, dtype=np.float64)
    if schedule == "cosine":
        def alpha_bar(u: float) -> float:
            return math.cos((u + 0.008) / 1.008 * math.pi / 2) ** 2
        return np.array(
            [min(1 - alpha_bar((i + 1) / num_steps) / alpha_bar(i / num_steps), 0.999)
             for i in range(num_steps)],
            dtype=np.float64,
        )
    raise UserError(f"unknown noise schedule {schedule!r}: use 'linear' or 'cosine'")


def first_timestep(alphas_cumprod, sigma: float, what: str) -> int:
    """The paper's t*: the first t whose noise level sqrt((1 - abar_t) / abar_t) reaches 2 sigma (sigma in [0, 1]
    pixel units, twice that on the [-1, 1] scale the model sees), not the nearest t; the one t* search of every
    discrete schedule (improved-/guided-diffusion's and a diffusers DDPM scheduler's). `what` names the schedule in
    the line that refuses a sigma beyond it."""
    if not (isinstance(sigma, (int, float)) and math.isfinite(sigma) and sigma > 0):
        raise UserError(f"sigma must be > 0, got {sigma}")
    abar = np.asarray(alphas_cumprod, dtype=np.float64)
    with np.errstate(divide="ignore"):
        ratio = np.sqrt((1.0 - abar) / abar)
    hits = np.nonzero(ratio >= 2.0 * sigma)[0]
    if len(hits) == 0:
        raise UserError(f"sigma={sigma} is beyond {what} (largest sigma it reaches: {ratio[-1] / 2:.3f})")
    return int(hits[0])


@dataclass(frozen=True)
class OneShotCoefficients:
    """Everything the one-shot denoiser needs at one sigma (docs/compatibility.md)."""

    sigma: float
    t: int                      # t*, index into the schedule
    model_timestep: float       # what the UNet is fed: t* or t* * 1000 / T when rescaled
    sqrt_abar: float            # scales 2*x_rs - 1 into x_t
    sqrt_recip_abar: float      # x0 = sqrt_recip_abar * x_t - sqrt_recipm1_abar * eps
    sqrt_recipm1_abar: float

    # The one-step form's constants (one_step.py): x0 = c_skip x_t + c_out eps with c_in = 1; the epsilon form
    # subtracts minus_c_out = sqrt(1/abar* - 1) as improved-diffusion does.
    input_scale = property(lambda self: self.sqrt_abar)
    c_in = property(lambda self: 1.0)
    c_skip = property(lambda self: self.sqrt_recip_abar)
    c_out = property(lambda self: -self.sqrt_recipm1_abar)
    minus_c_out = property(lambda self: self.sqrt_recipm1_abar)


@dataclass(frozen=True)
class DiffusionSchedule:
    """A discrete diffusion schedule; `rescale_timesteps` feeds the UNet t*1000/T (improved-diffusion)."""

    name: str
    num_steps: int
    rescale_timesteps: bool = False

    @classmethod
    def from_record(cls, recorded: dict) -> "DiffusionSchedule":
        """The schedule an export manifest recorded (its `schedule` field)."""
        return cls(str(recorded["name"]), int(recorded["num_steps"]), bool(recorded.get("rescale_timesteps", False)))

    @property
    def alphas_cumprod(self) -> np.ndarray:
        return np.cumprod(1.0 - betas_for(self.name, self.num_steps))

    def timestep(self, sigma: float) -> int:
        """t* = the first t with sqrt((1 - abar_t) / abar_t) >= 2*sigma (not the nearest t)."""
        return first_timestep(self.alphas_cumprod, sigma, f"this {self.name} schedule with {self.num_steps} steps")

    def coefficients(self, sigma: float) -> OneShotCoefficients:
        """t*, the UNet's timestep input and the x_t / x0 scale factors at this sigma."""
        t = self.timestep(sigma)
        abar = float(self.alphas_cumprod[t])
        model_t = t * (1000.0 / self.num_steps) if self.rescale_timesteps else float(t)
        return OneShotCoefficients(
            sigma=float(sigma), t=t, model_timestep=model_t,
            sqrt_abar=math.sqrt(abar),
            sqrt_recip_abar=math.sqrt(1.0 / abar),
            sqrt_recipm1_abar=math.sqrt(1.0 / abar - 1.0),
        )

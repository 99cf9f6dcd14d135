"""Reverse chains (DensePure, Xiao et al., ICLR 2023): each noisy sample x_rs is purified K times by a short reverse
diffusion chain of S steps from t*, each step with its own keyed noise; the head sees the K results [K, C, H, W].

For one run (the maths of DensePure's published code, `runners/diffpure_*_densepure.py` and its `p_sample`):
  x = sqrt(1 / (1 + (2 sigma)^2)) (2 x_rs - 1);  t* from sigma (cosine: a closed form in 2 sigma and T; other
  schedules: the timestep whose sqrt(1/abar - 1) is nearest 2 sigma);  the chain visits round(t* - i t*/S),
  i = 0..S-1, then 0, with betas recomputed for it; each step feeds the UNet its original timestep, turns eps
  into a clipped x0, takes the posterior mean and adds the (learned-range or fixed-large) variance's noise, none
  on the last step; the result (x + 1)/2 is the run's sample. Step i of run k draws its noise as RowNoise draw
  k * MAX_STEPS + i: keyed by (image, sample, run, step), so rows are equal across batch sizes, shards, resume and
  ranks. A diffusers DDPM folder steps through its own DDPMScheduler (SchedulerChains). docs/methods.md.
"""

from __future__ import annotations

import math
import sys
import threading
from dataclasses import dataclass
from typing import Tuple
from unittest import mock

import numpy as np
import torch
from torch import nn

from diffsmooth.engine.base_classifier.methods.config import MethodOption
from diffsmooth.engine.base_classifier.methods.purifier import Purifier
from diffsmooth.engine.base_classifier.purifier_graph import PurifierGraph, example_batch
from diffsmooth.engine.base_classifier.schedule import DiffusionSchedule
from diffsmooth.engine.errors import UserError

MAX_STEPS = 100         # the most reverse steps a run takes (its draws are numbered run * MAX_STEPS + step)


@dataclass(frozen=True)
class ReverseSchedule:
    """One reverse chain at one sigma: the input scale, each step's UNet timestep and coefficients (float64, as
    DensePure's numpy tables; the stage reads them as fp32 tensors, as its `_extract_into_tensor` does)."""

    scale: float                        # x_t = scale * (2 x_rs - 1)
    t_star: float                       # DensePure's t* (the cosine closed form is not an integer)
    timesteps: Tuple[int, ...]          # the steps' original timesteps, first to last
    model_timesteps: Tuple[float, ...]  # what the UNet is fed at each (rescaled as the checkpoint expects)
    coefficients: np.ndarray            # [S, 7] per step taken: sqrt(1/abar), sqrt(1/abar - 1), posterior coef1,
    #                                     coef2, clipped posterior log-variance, log beta, fixed-large log-variance

    @classmethod
    def of(cls, schedule, sigma: float, steps: int) -> "ReverseSchedule":
        """DensePure's chain for an improved-/guided-diffusion schedule (engine/base_classifier/schedule.py)."""
        if getattr(schedule, "name", None) not in ("cosine", "linear"):
            raise UserError("densepure runs improved-/guided-diffusion UNet checkpoints (a cosine or linear schedule), "
                            f"not a {type(schedule).__name__}")
        big_t, two_sigma = int(schedule.num_steps), 2.0 * float(sigma)
        if schedule.name == "cosine":               # improved-diffusion: alpha_bar(t / T), closed-form t*
            def alpha_bar(t):
                return math.cos((t / big_t + 0.008) / 1.008 * math.pi / 2) ** 2
            t_star = big_t * (1 - (2 * 1.008 * math.asin(math.sin(math.pi / (2 * 1.008)) / (1 + two_sigma ** 2) ** 0.5))
                              / math.pi)
        else:                                       # guided-diffusion: the discrete cumulative product
            table = schedule.alphas_cumprod

            def alpha_bar(t):
                return float(table[t])
            t_star = float(_nearest_timestep(np.sqrt(1.0 / table - 1), two_sigma, sigma))
        timesteps = _chain_timesteps(t_star, steps, sigma)
        chain = [0, *reversed(timesteps)]           # the respaced chain, index j <-> chain[j + 1]
        betas = np.array([min(1 - alpha_bar(chain[j + 1]) / alpha_bar(chain[j]), 0.999) for j in range(steps)])
        abar = np.cumprod(1.0 - betas)
        abar_prev = np.append(1.0, abar[:-1])
        posterior = betas * (1.0 - abar_prev) / (1.0 - abar)
        # DensePure's clipped log-variance repeats entry 1 at index 0; one step (S = 1) has no entry 1, and its only
        # step adds no noise, so it reads nothing there (its code cannot run S = 1).
        clipped = np.log(np.append(posterior[1], posterior[1:])) if steps > 1 else np.zeros(1)
        fixed_large = np.log(np.append(posterior[1], betas[1:])) if steps > 1 else np.zeros(1)
        columns = [np.sqrt(1.0 / abar), np.sqrt(1.0 / abar - 1), betas * np.sqrt(abar_prev) / (1.0 - abar),
                   (1.0 - abar_prev) * np.sqrt(1.0 - betas) / (1.0 - abar), clipped, np.log(betas), fixed_large]
        table = np.stack(columns, axis=1)[::-1]     # row i: the i-th step taken (respaced index S - 1 - i)
        scale = (1000.0 / big_t) if schedule.rescale_timesteps else 1.0
        return cls((1 / (1 + two_sigma ** 2)) ** 0.5, t_star, timesteps,
                   tuple(t * scale for t in timesteps), np.ascontiguousarray(table))


def _chain_timesteps(t_star: float, steps: int, sigma: float) -> Tuple[int, ...]:
    """The S timesteps a run visits, round(t* - i t*/S), i = 0..S-1 (then 0); refused where they collide."""
    timesteps = tuple(round(t_star - i * (t_star / steps)) for i in range(steps))
    if len(set(timesteps)) < steps or timesteps[-1] < 1:
        raise UserError(f"densepure: {steps} steps do not fit below t* = {t_star:.1f} at sigma {sigma:g}: "
                        f"use fewer steps")
    return timesteps


def _nearest_timestep(ratio: np.ndarray, two_sigma: float, sigma: float) -> int:
    """guided-diffusion's t*: of the two timesteps whose sqrt(1/abar - 1) bracket 2 sigma, the nearer (the later
    on a tie); DensePure falls back to the last timestep where none brackets it, which is refused here instead."""
    for t in range(len(ratio) - 1):
        if ratio[t] < two_sigma <= ratio[t + 1]:
            return t + 1 if two_sigma - ratio[t] > ratio[t + 1] - two_sigma else t
    raise UserError(f"densepure: sigma {sigma:g} is outside this schedule's noise levels")


class ReverseStep(nn.Module):
    """One reverse step, x_t -> x_{t-1}, for any step of the chain: the timestep and coefficients are inputs, so one
    (compiled) graph serves every step; `c` = [sqrt(1/abar), sqrt(1/abar - 1), coef1, coef2, min log-var, max
    log-var, noise on/off]."""

    def __init__(self, unet: nn.Module, channels: int, learned_variance: bool):
        super().__init__()
        self.unet, self.channels, self.learned_variance = unet, int(channels), bool(learned_variance)

    def forward(self, x: torch.Tensor, t: torch.Tensor, c: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        out = self.unet(x, t.expand(x.shape[0]))
        eps = out[:, : self.channels].to(x.dtype)
        x0 = (c[0] * x - c[1] * eps).clamp(-1.0, 1.0)
        mean = c[2] * x0 + c[3] * x
        if self.learned_variance:
            frac = (out[:, self.channels: 2 * self.channels].to(x.dtype) + 1) / 2
            log_variance = frac * c[5] + (1 - frac) * c[4]
        else:
            log_variance = c[4]
        return mean + c[6] * torch.exp(0.5 * log_variance) * noise


def step_noise(noise, run: int, step: int, shape) -> torch.Tensor:
    """The rows' noise of `step` in reverse run `run`: draw run * MAX_STEPS + step of the rows' RowNoise."""
    return noise.normal(run * MAX_STEPS + step, shape)


def run_chains(x_rs: torch.Tensor, noise, scale: float, steps: int, runs: int, advance) -> torch.Tensor:
    """K runs of S steps from x = scale (2 x_rs - 1), each from the same x_rs: `advance(x, i, z)` takes step i with
    noise z (the row's keyed draw; zeros on the last step). Returns the runs' results [B,K,C,H,W] in [0,1]."""
    shape = tuple(x_rs.shape[1:])
    start = scale * ((x_rs - 0.5) * 2)
    quiet = torch.zeros_like(start)
    results = []
    for k in range(runs):
        x = start
        for i in range(steps):
            x = advance(x, i, step_noise(noise, k, i, shape) if i < steps - 1 else quiet)
        results.append((x + 1) * 0.5)
    return torch.stack(results, dim=1)


class ReverseChainsStage:
    """The purify stage: x_rs [B,C,H,W] (+ the rows' RowNoise) -> K purified samples [B,K,C,H,W] in [0,1]. Each run's
    chain steps the whole batch of B (`step`: the ReverseStep as a built stage): the UNet always sees the run's batch,
    the size a run is tuned for, and a step never holds K times the batch's activations."""

    def __init__(self, step, reverse_schedule: ReverseSchedule, runs: int, fixed_large: bool):
        self.step, self.reverse_schedule, self.runs = step, reverse_schedule, int(runs)
        self.name = f"reverse chains ({runs} x {len(reverse_schedule.timesteps)} steps)"
        self.device, self.precision = step.device, step.precision
        self.weights = getattr(step, "weights", None)
        table = reverse_schedule.coefficients.copy()
        if fixed_large:
            table[:, 4] = table[:, 6]
        table[:, 6] = [1.0] * (len(table) - 1) + [0.0]              # no noise on the last step
        # one tensor per step, not views of one table: a compiled graph guards on its inputs' storage offsets
        self.coefficients = [torch.tensor(row, dtype=torch.float32, device=self.device) for row in table]
        self.timesteps = [torch.tensor([t], dtype=torch.float32, device=self.device) for t in reverse_schedule.model_timesteps]
        eager = getattr(step, "eager", step)
        self.eager = self if eager is step else ReverseChainsStage(eager, reverse_schedule, runs, fixed_large)

    @torch.inference_mode()         # every step's input an inference tensor, as its outputs: one compiled graph
    def __call__(self, x_rs: torch.Tensor, noise) -> torch.Tensor:
        return run_chains(x_rs, noise, self.reverse_schedule.scale, len(self.reverse_schedule.timesteps), self.runs,
                          lambda x, i, z: self.step(x, self.timesteps[i], self.coefficients[i], z))


_SCHEDULER_NOISE = threading.Lock()     # the scheduler's noise function is swapped process-wide while it steps


class SchedulerChains:
    """The purify stage for a diffusers DDPM folder: each run's chain steps through the folder's own DDPMScheduler
    (its `step` on the custom timesteps round(t* - i t*/S), t* DensePure's nearest timestep in the scheduler's
    alphas_cumprod), the UNet a built stage. The step's noise is the row's keyed draw k * MAX_STEPS + i, none on the
    last step: DDPMScheduler.step takes no noise argument (it draws with its module's `randn_tensor`), so that
    function hands it the draw while it steps."""

    def __init__(self, unet, scheduler, sigma: float, steps: int, runs: int, channels: int):
        self.unet, self.scheduler, self.runs, self.channels = unet, scheduler, int(runs), int(channels)
        self.module = sys.modules[type(scheduler).step.__module__]
        if type(scheduler).__name__ != "DDPMScheduler" or not hasattr(self.module, "randn_tensor"):
            raise UserError(f"densepure steps a diffusers folder through its DDPMScheduler, not a "
                            f"{type(scheduler).__name__}: give a DDPM pipeline folder (or --scheduler one)")
        abar = np.asarray(scheduler.alphas_cumprod, dtype=np.float64)
        with np.errstate(divide="ignore"):
            t_star = _nearest_timestep(np.sqrt(1.0 / abar - 1), 2.0 * float(sigma), sigma)
        self.timesteps = _chain_timesteps(float(t_star), steps, sigma)
        scheduler.set_timesteps(timesteps=list(self.timesteps))
        self.scale = (1 / (1 + (2.0 * float(sigma)) ** 2)) ** 0.5
        self.learned = scheduler.config.variance_type in ("learned", "learned_range")
        self.name = f"{type(scheduler).__name__} chains ({runs} x {steps} steps)"
        self.device, self.precision = unet.device, unet.precision
        self.weights = getattr(unet, "weights", None)
        eager = getattr(unet, "eager", unet)
        self.eager = self if eager is unet else SchedulerChains(eager, type(scheduler).from_config(scheduler.config),
                                                                sigma, steps, runs, channels)

    def _advance(self, x: torch.Tensor, t: int, z: torch.Tensor) -> torch.Tensor:
        """The UNet at timestep t, then the scheduler's step with z as its noise."""
        out = self.unet(x, torch.full((x.shape[0],), float(t), device=x.device)).to(x.dtype)
        out = out if self.learned and out.shape[1] == 2 * self.channels else out[:, : self.channels]
        with _SCHEDULER_NOISE, mock.patch.object(self.module, "randn_tensor", lambda *shape, **kw: z):
            return self.scheduler.step(out, t, x).prev_sample

    @torch.inference_mode()
    def __call__(self, x_rs: torch.Tensor, noise) -> torch.Tensor:
        return run_chains(x_rs, noise, self.scale, len(self.timesteps), self.runs,
                          lambda x, i, z: self._advance(x, self.timesteps[i], z))


class ReverseChainsPurifier(Purifier):
    """K runs of S reverse steps from t* (its settings: reverse_runs K, sweepable, and steps S)."""

    # Defaults: DensePure's merge script (results/merge_results.py: majority_vote_num 10, steps 2).
    options = (MethodOption("reverse_runs", int, 10, 1, 256, "reverse runs K whose labels' majority votes",
                            sweepable=True),
               MethodOption("steps", int, 2, 1, MAX_STEPS, "reverse steps S of each run, from t* to 0"))
    copies_option = "reverse_runs"
    denoises = True
    draws_noise = True

    def stage(self, sigma, denoiser, backend, fast=None):
        if hasattr(denoiser, "new_scheduler"):          # a diffusers folder: its own scheduler steps each chain
            unet = backend.stage(denoiser.unet, "reverse step UNet")
            return SchedulerChains(unet, denoiser.new_scheduler(), sigma, self.steps, self.copies,
                                   int(denoiser.channels))
        reverse_schedule = ReverseSchedule.of(getattr(denoiser, "schedule", None), sigma, self.steps)
        unet, learned = denoiser.unet, _learns_variance(denoiser)
        if getattr(fast, "fused_attention", False) and hasattr(unet, "with_fused_attention"):
            unet = unet.with_fused_attention()
        step = backend.stage(ReverseStep(unet, int(denoiser.channels), learned), "reverse step")
        return ReverseChainsStage(step, reverse_schedule, self.copies, fixed_large=not learned)

    def graph(self, sigma, denoiser, image_shape, method):
        """The reverse step alone (x_t, t, c, noise) -> x_{t-1}: every step of every chain at every sigma runs this
        one graph, its timestep and coefficients inputs (the chain around it is exported_stage's)."""
        if hasattr(denoiser, "new_scheduler"):
            raise UserError("densepure exports the reverse step of an improved-/guided-diffusion checkpoint; a "
                            "diffusers folder steps through its own scheduler on the torch backend")
        reverse_schedule = ReverseSchedule.of(getattr(denoiser, "schedule", None), sigma, self.steps)
        learned = _learns_variance(denoiser)
        x = example_batch(image_shape) * 2 - 1
        noise = torch.randn(x.shape, generator=torch.Generator().manual_seed(1))
        inputs = (x, torch.tensor([reverse_schedule.model_timesteps[0]], dtype=torch.float32),
                  torch.tensor(reverse_schedule.coefficients[0], dtype=torch.float32), noise)
        module = ReverseStep(denoiser.unet, int(denoiser.channels), learned).eval()
        return PurifierGraph(module, inputs, ("x_t", "t", "c", "noise"), "x_prev", "reverse_step",
                             batch_inputs=("x_t", "noise"),
                             fields={"method": method, "purifier": "reverse-step", "sigma": float(sigma),
                                     "learned_variance": learned})

    def lookup(self, sigma, method):
        return {"method": method, "purifier": "reverse-step"}

    def exported_stage(self, sigma, graph, manifest):
        """The K chains of S steps around the exported step graph, the chain's reverse_schedule from the schedule its
        manifest records."""
        recorded = manifest.get("schedule") or {}
        if recorded.get("name") not in ("cosine", "linear"):
            raise UserError(f"{manifest.get('onnx_file', 'the reverse-step graph')} records no improved-/guided-"
                            f"diffusion schedule (cosine or linear): re-export it")
        schedule = DiffusionSchedule.from_record(recorded)
        reverse_schedule = ReverseSchedule.of(schedule, sigma, self.steps)
        return ReverseChainsStage(graph, reverse_schedule, self.copies, fixed_large=not bool(manifest.get("learned_variance")))

    def key(self, sigma):
        """Its chains at one sigma and S: run k's noises do not depend on K, so K runs are the first K of more."""
        return ("reverse-chains", float(sigma), self.steps)

    def serving(self, purifiers):
        return max(range(len(purifiers)), key=lambda i: purifiers[i].copies)

    def share(self, samples):
        return samples[:, : self.copies]

    def unet_calls(self):
        return self.copies * self.steps

    def noise_left(self, sigma):
        return 0.0

    def tag(self):
        return f"__K{self.copies}__S{self.steps}"


def _learns_variance(denoiser) -> bool:
    """Whether the UNet predicts DensePure's learned variance range beside eps (improved-diffusion's learn_sigma)."""
    return bool(getattr(getattr(denoiser.unet, "config", None), "learn_sigma", False))


ReverseChains = ReverseChainsPurifier      # its name before parts ended in Purifier / Head: scripts written with it keep working

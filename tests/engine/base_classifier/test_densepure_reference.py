"""DensePure's purifier against its published maths (github Jayfeather1024/DensePure: runners/diffpure_ddpm_densepure.py,
runners/diffpure_guided_densepure.py and the `p_sample` / `p_mean_variance` of its modified gaussian_diffusion.py),
written out here as that code computes it: float64 numpy tables, recomputed for the respaced chain on a chain's
first step and read as fp32 at each use, the noise of every `p_sample` call given explicitly. The engine's chain,
fed the same noises, must agree within 1e-5 (fp32) for an improved-diffusion CIFAR-10 UNet (cosine, T = 4000,
learned range, rescaled timesteps), a guided-diffusion ImageNet UNet (linear, T = 1000, learned range) and a UNet
without learned variance (fixed-large, as the demo's) at S in {2, 5, 10}; and S = 1 (which DensePure's code cannot
run) is one clipped x0 prediction."""

import math

import numpy as np
import pytest
import torch
from tiny_fixtures import TINY_UNET, random_unet

from diffsmooth.engine.backends.torch.runner import TorchRunner
from diffsmooth.engine.base_classifier.methods import MethodConfig
from diffsmooth.engine.base_classifier.methods.reverse_chains_purifier import MAX_STEPS, ReverseSchedule
from diffsmooth.engine.base_classifier.schedule import DiffusionSchedule, betas_for
from diffsmooth.engine.errors import UserError

SIGMA = 0.5
RUNS = 2


class PublishedDensePure:
    """One DensePure reverse run as its code runs it (`use_t_steps`), the `randn_like` of each p_sample given."""

    def __init__(self, unet, schedule: str, big_t: int, rescale: bool, learned: bool = True):
        self.unet, self.kind, self.big_t, self.rescale, self.learned = unet, schedule, big_t, rescale, learned
        self.origin = np.cumprod(1.0 - betas_for(schedule, big_t))      # guided: alphas_cumprod_origin

    def t_star(self, sigma):
        two = sigma * 2
        if self.kind == "cosine":               # Diffusion.__init__ (ddpm runner)
            return self.big_t * (1 - (2 * 1.008 * math.asin(math.sin(math.pi / (2 * 1.008)) / (1 + two ** 2) ** 0.5))
                                 / math.pi)
        ratio = np.sqrt(1.0 / self.origin - 1)  # GuidedDiffusion.__init__
        t = len(ratio) - 1
        for k in range(len(ratio) - 1):
            if ratio[k] < two and ratio[k + 1] >= two:
                t = k + 1 if two - ratio[k] > ratio[k + 1] - two else k
                break
        return t

    def respace(self, indices):
        """p_sample's tables on a chain's first step (step == len(indices_t_steps))."""
        indices = list(indices) + [0]
        indices = indices[::-1]
        betas = []
        for i in range(len(indices) - 1):
            if self.kind == "cosine":
                def alpha_bar(u):
                    return math.cos((u + 0.008) / 1.008 * math.pi / 2) ** 2
                betas.append(min(1 - alpha_bar(indices[i + 1] / self.big_t) / alpha_bar(indices[i] / self.big_t), 0.999))
            else:
                betas.append(min(1 - self.origin[indices[i + 1]] / self.origin[indices[i]], 0.999))
        b = np.array(betas, dtype=np.float64)
        ac = np.cumprod(1.0 - b)
        prev = np.append(1.0, ac[:-1])
        pv = b * (1.0 - prev) / (1.0 - ac)
        self.tables = dict(betas=b, clipped=np.log(np.append(pv[1], pv[1:])), coef1=b * np.sqrt(prev) / (1.0 - ac),
                           coef2=(1.0 - prev) * np.sqrt(1.0 - b) / (1.0 - ac), recip=np.sqrt(1.0 / ac),
                           recipm1=np.sqrt(1.0 / ac - 1), fixed_large=np.append(pv[1], b[1:]))

    def extract(self, name, t, x):
        arr = self.tables[name] if name != "log_betas" else np.log(self.tables["betas"])
        return torch.from_numpy(arr)[t].float().reshape(-1, *([1] * (x.dim() - 1)))

    def p_sample(self, x, t, real_t, noise):
        c = x.shape[1]
        model_t = real_t.float() * (1000.0 / self.big_t) if self.rescale else real_t
        out = self.unet(x, model_t)
        if self.learned:                        # LEARNED_RANGE
            eps, values = torch.split(out, c, dim=1)
            min_log, max_log = self.extract("clipped", t, x), self.extract("log_betas", t, x)
            frac = (values + 1) / 2
            log_var = frac * max_log + (1 - frac) * min_log
        else:                                   # FIXED_LARGE (improved-diffusion without learn_sigma)
            eps = out
            self.tables["log_fixed_large"] = np.log(self.tables["fixed_large"])
            log_var = self.extract("log_fixed_large", t, x)
        x0 = (self.extract("recip", t, x) * x - self.extract("recipm1", t, x) * eps).clamp(-1, 1)
        mean = self.extract("coef1", t, x) * x0 + self.extract("coef2", t, x) * x
        mask = (t != 0).float().view(-1, *([1] * (x.dim() - 1)))
        return mean + mask * torch.exp(0.5 * log_var) * noise

    @torch.no_grad()
    def run(self, x_rs, sigma, steps, noises):
        """x_rs in [0,1] -> the run's sample in [-1, 1] (noises[i]: the i-th p_sample's randn_like)."""
        scale = (1 / (1 + (sigma * 2) ** 2)) ** 0.5
        x = scale * ((x_rs - 0.5) * 2)
        t = self.t_star(sigma)
        inter = t / steps
        indices = [round(t - i * inter) for i in range(steps)]
        for i in range(len(indices)):
            if i == 0:
                self.respace(indices)
            tt = torch.tensor([len(indices) - i - 1] * x.shape[0])
            real_t = torch.tensor([indices[i]] * x.shape[0])
            x = self.p_sample(x, tt, real_t, noises[i])
        return x


class GivenNoise:
    """A RowNoise stand-in serving explicit noises: draw k * MAX_STEPS + i is run k's noise at step i."""

    def __init__(self, noises):
        self.noises = noises            # [run][step] -> [B, C, H, W]

    def normal(self, draw, shape):
        return self.noises[draw // MAX_STEPS][draw % MAX_STEPS]


def _cases():
    cifar = dict(TINY_UNET)
    imagenet = dict(TINY_UNET, num_head_channels=16, resblock_updown=True)
    fixed = dict(TINY_UNET, learn_sigma=False)
    return {"improved-diffusion cifar10": ("cifar10", cifar, DiffusionSchedule("cosine", 4000, rescale_timesteps=True)),
            "guided-diffusion imagenet": ("imagenet", imagenet, DiffusionSchedule("linear", 1000)),
            "fixed-variance cosine (the demo's kind)": ("cifar10", fixed,
                                                        DiffusionSchedule("cosine", 4000, rescale_timesteps=True))}


@pytest.fixture(scope="module")
def unets():
    from diffsmooth.engine.models.unet import UNetModel, unet_config

    made = {}
    for name, (preset, config, schedule) in _cases().items():
        unet = random_unet(**config) if preset == "cifar10" and config.get("learn_sigma", True) else None
        if unet is None:
            torch.manual_seed(1)
            unet = UNetModel(unet_config(preset, **config))
            with torch.no_grad():
                for p in unet.parameters():
                    if p.abs().sum() == 0:
                        p.normal_(0, 0.02)
        made[name] = (unet.eval(), schedule)
    return made


def _engine_chain(unet, schedule, sigma, runs, steps):
    from diffsmooth.engine.base_classifier.denoise import DiffusionDenoiser

    config = MethodConfig("densepure", sigma, options=(("reverse_runs", runs), ("steps", steps)))
    return config.purifier.stage(config.sigma, DiffusionDenoiser(unet, schedule), TorchRunner("cpu"))


@pytest.mark.parametrize("case", list(_cases()))
@pytest.mark.parametrize("steps", [2, 5, 10])
def test_the_chain_equals_densepures_published_maths(unets, case, steps):
    unet, schedule = unets[case]
    gen = torch.Generator().manual_seed(steps)
    x = torch.rand(3, 3, 8, 8, generator=gen)
    noises = [[torch.randn(3, 3, 8, 8, generator=gen) for _ in range(steps)] for _ in range(RUNS)]
    published = PublishedDensePure(unet, schedule.name, schedule.num_steps, schedule.rescale_timesteps,
                                   learned=unet.config.learn_sigma)
    expected = torch.stack([(published.run(x, SIGMA, steps, noises[k]) + 1) * 0.5 for k in range(RUNS)], dim=1)
    got = _engine_chain(unet, schedule, SIGMA, RUNS, steps)(x, GivenNoise(noises))
    assert got.shape == (3, RUNS, 3, 8, 8)
    assert (got - expected).abs().max() <= 1e-5
    # the runs differ (their noises do), and the chain moved the input: nothing trivially equal
    assert (got[:, 0] - got[:, 1]).abs().max() > 1e-3
    assert (got - x.unsqueeze(1)).abs().max() > 1e-2


def test_the_last_steps_noise_is_never_read_and_a_wrong_step_noise_shows(unets):
    unet, schedule = unets["improved-diffusion cifar10"]
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(2, 3, 8, 8, generator=gen)
    noises = [[torch.randn(2, 3, 8, 8, generator=gen) for _ in range(3)] for _ in range(RUNS)]
    chain = _engine_chain(unet, schedule, SIGMA, RUNS, 3)
    base = chain(x, GivenNoise(noises))
    louder = [[n if i < 2 else 100 * n for i, n in enumerate(run)] for run in noises]
    assert torch.equal(chain(x, GivenNoise(louder)), base)          # step 3 of 3 adds no noise
    swapped = [[run[1], run[0], run[2]] for run in noises]
    assert (chain(x, GivenNoise(swapped)) - base).abs().max() > 1e-3


def test_one_step_is_one_clipped_x0_prediction_at_densepures_own_t_star(unets):
    """S = 1: x0 = clamp(sqrt(1/a) x_t - sqrt(1/a - 1) eps(x_t, round(t*))) with DensePure's t* (the cosine closed
    form, rounded), its input scale sqrt(1 / (1 + 4 sigma^2)) and a = alpha_bar(round(t*)/T) / alpha_bar(0): the
    three ways it differs from DDS's one-shot step (the first t whose abar reaches the noise level, the scale
    sqrt(abar_t), and abar_t = alpha_bar((t+1)/T) / alpha_bar(0))."""
    unet, schedule = unets["improved-diffusion cifar10"]
    plan = ReverseSchedule.of(schedule, SIGMA, 1)
    assert plan.timesteps == (round(plan.t_star),)
    # t* can land on DDS's (1984 here), but the input scale and the step's abar are not DDS's
    dds = schedule.coefficients(SIGMA)
    assert abs(plan.scale - dds.sqrt_abar) > 1e-5 and abs(plan.coefficients[0][0] - dds.sqrt_recip_abar) > 1e-5
    x = torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(3))

    def alpha_bar(u):
        return math.cos((u + 0.008) / 1.008 * math.pi / 2) ** 2
    t = plan.timesteps[0]
    a = alpha_bar(t / 4000) / alpha_bar(0)
    x_t = (1 / (1 + 4 * SIGMA ** 2)) ** 0.5 * (2 * x - 1)
    with torch.no_grad():
        eps = unet(x_t, torch.full((2,), t * 0.25))[:, :3]
    expected = ((math.sqrt(1 / a) * x_t - math.sqrt(1 / a - 1) * eps).clamp(-1, 1) + 1) / 2
    got = _engine_chain(unet, schedule, SIGMA, 1, 1)(x, GivenNoise([[None]]))      # no noise is drawn
    assert (got[:, 0] - expected).abs().max() <= 1e-5
    dds = _dds(unet, schedule)(x)
    assert (got[:, 0] - dds).abs().max() > 1e-4                     # and it is not DDS's step


def _dds(unet, schedule):
    from diffsmooth.engine.base_classifier.denoise import DiffusionDenoiser
    return DiffusionDenoiser(unet, schedule).purifier(SIGMA)


def test_a_chain_that_cannot_fit_below_t_star_is_refused_in_one_line():
    schedule = DiffusionSchedule("linear", 1000)
    with pytest.raises(UserError, match="steps do not fit below t"):
        ReverseSchedule.of(schedule, 0.01, 50)
    with pytest.raises(UserError, match="cosine or linear"):
        ReverseSchedule.of(object(), SIGMA, 2)

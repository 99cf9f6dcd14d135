"""diffusers denoisers against diffusers itself: the one-shot x0 of the DDPM family equals
DDPMScheduler.step(...).pred_original_sample (and DDIMScheduler's), the consistency model's one call
equals CMStochasticIterativeScheduler's scale_model_input + step at noise level 2 sigma, in fp32."""

import math

import pytest
import torch

pytest.importorskip("diffusers")
pytest.importorskip("safetensors")

from diffusers import CMStochasticIterativeScheduler, DDIMScheduler, DDPMScheduler  # noqa: E402
from diffusers_fixtures import save_pipeline, tiny_unet  # noqa: E402

from diffsmooth.engine.base_classifier.denoise import DiffusionDenoiser, load_denoiser  # noqa: E402
from diffsmooth.engine.errors import UserError  # noqa: E402

SIGMAS = (0.12, 0.25, 0.5, 1.0)
ATOL = 2e-5


def _x_rs(seed=0, channels=3, sigma=0.25):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(3, channels, 8, 8, generator=g)
    return x + sigma * torch.randn(x.shape, generator=g)


def _t_star(scheduler, sigma):
    """The paper's rule, stated independently: the first t with (1 - abar) / abar >= (2 sigma)^2."""
    abar = scheduler.alphas_cumprod.double()
    return int(torch.nonzero((1 - abar) / abar >= (2 * sigma) ** 2)[0])


def _diffusers_x0(unet, scheduler, x_rs, sigma, step_with=None):
    """What diffusers computes: x_t = sqrt(abar*) (2 x_rs - 1), the UNet at t*, step's pred_original_sample."""
    t = _t_star(scheduler, sigma)
    x_t = scheduler.alphas_cumprod[t].sqrt() * (2 * x_rs - 1)
    with torch.no_grad():
        out = unet(x_t, t).sample
    stepper = step_with or scheduler
    return t, stepper.step(out, t, x_t).pred_original_sample


SCHEDULES = [
    dict(beta_schedule="linear"),
    dict(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012),
    dict(beta_schedule="squaredcos_cap_v2"),
    dict(beta_schedule="sigmoid"),
    dict(trained_betas=torch.linspace(1e-4, 0.03, 500).tolist(), num_train_timesteps=500),
]


@pytest.mark.parametrize("prediction_type", ["epsilon", "v_prediction", "sample"])
@pytest.mark.parametrize("schedule", SCHEDULES, ids=["linear", "scaled_linear", "squaredcos_cap_v2", "sigmoid",
                                                     "trained_betas"])
def test_ddpm_one_shot_equals_diffusers_step(tmp_path, schedule, prediction_type):
    unet = tiny_unet(0)
    scheduler = DDPMScheduler(prediction_type=prediction_type, clip_sample=True, clip_sample_range=1.0, **schedule)
    denoiser = load_denoiser(save_pipeline(tmp_path / "p", unet, scheduler), None)
    assert isinstance(denoiser, DiffusionDenoiser)      # the pipeline's seam: a denoiser like any other
    for k, sigma in enumerate(SIGMAS):
        x_rs = _x_rs(k, sigma=sigma)
        t, x0 = _diffusers_x0(unet, scheduler, x_rs, sigma)
        assert denoiser.timestep(sigma) == t
        ours = denoiser.denoise(x_rs, sigma)
        assert torch.allclose(ours, (x0 + 1) / 2, atol=ATOL, rtol=0), (sigma, (ours - (x0 + 1) / 2).abs().max())


@pytest.mark.parametrize("prediction_type", ["epsilon", "v_prediction"])
def test_ddim_one_shot_equals_both_schedulers(tmp_path, prediction_type):
    unet = tiny_unet(1)
    scheduler = DDIMScheduler(beta_schedule="squaredcos_cap_v2", prediction_type=prediction_type, clip_sample=True,
                              steps_offset=1, set_alpha_to_one=False)
    denoiser = load_denoiser(save_pipeline(tmp_path / "p", unet, scheduler), None)
    scheduler.set_timesteps(scheduler.config.num_train_timesteps)
    ddpm = DDPMScheduler.from_config(scheduler.config)
    for sigma in SIGMAS:
        x_rs = _x_rs(2, sigma=sigma)
        t, x0 = _diffusers_x0(unet, scheduler, x_rs, sigma)
        _, x0_ddpm = _diffusers_x0(unet, scheduler, x_rs, sigma, step_with=ddpm)
        ours = denoiser.denoise(x_rs, sigma)
        assert torch.allclose(ours, (x0 + 1) / 2, atol=ATOL, rtol=0)
        assert torch.allclose(ours, (x0_ddpm + 1) / 2, atol=ATOL, rtol=0)


def test_learned_variance_takes_the_first_channels(tmp_path):
    unet = tiny_unet(2, out_channels=6)
    scheduler = DDPMScheduler(variance_type="learned_range")
    denoiser = load_denoiser(save_pipeline(tmp_path / "p", unet, scheduler), None)
    for sigma in (0.25, 0.5):
        x_rs = _x_rs(3, sigma=sigma)
        _, x0 = _diffusers_x0(unet, scheduler, x_rs, sigma)
        assert torch.allclose(denoiser.denoise(x_rs, sigma), (x0 + 1) / 2, atol=ATOL, rtol=0)


def test_zero_terminal_snr_v_prediction(tmp_path):
    """rescale_betas_zero_snr: abar_T = 0; v-prediction still recovers x0 there, epsilon is refused."""
    unet = tiny_unet(3)
    scheduler = DDPMScheduler(rescale_betas_zero_snr=True, prediction_type="v_prediction")
    denoiser = load_denoiser(save_pipeline(tmp_path / "v", unet, scheduler), None)
    x_rs = _x_rs(4, sigma=0.5)
    _, x0 = _diffusers_x0(unet, scheduler, x_rs, 0.5)
    assert torch.allclose(denoiser.denoise(x_rs, 0.5), (x0 + 1) / 2, atol=ATOL, rtol=0)
    eps = load_denoiser(save_pipeline(tmp_path / "e", unet, DDPMScheduler(rescale_betas_zero_snr=True)), None)
    with pytest.raises(UserError, match="zero terminal SNR") as err:
        eps.denoise(x_rs, 1e4)
    assert "\n" not in str(err.value)


def test_sigma_beyond_the_schedule_is_refused(tmp_path):
    denoiser = load_denoiser(save_pipeline(tmp_path / "p", tiny_unet(0), DDPMScheduler(num_train_timesteps=100)), None)
    with pytest.raises(UserError, match="beyond") as err:
        denoiser.purifier(50.0)
    assert "\n" not in str(err.value)


def _diffusers_consistency(unet, scheduler, x_rs, sigma):
    """diffusers' one-step consistency sampling from x = 2 x_rs - 1 at sigma_t = 2 sigma: its sigma_to_t,
    scale_model_input and step (boundary-condition scalings, clip_denoised), with the schedule set to that level."""
    s = 2 * sigma
    x = 2 * x_rs - 1
    t = torch.tensor([float(scheduler.sigma_to_t(s))], dtype=torch.float64)
    scheduler.timesteps = t
    scheduler.sigmas = torch.tensor([s, scheduler.config.sigma_min], dtype=torch.float32)
    scheduler._step_index = None
    scaled = scheduler.scale_model_input(x, t[0])
    with torch.no_grad():
        out = unet(scaled, t[0]).sample
    return scheduler.step(out, t[0], x).prev_sample


@pytest.mark.parametrize("config", [dict(), dict(sigma_min=0.01, sigma_max=20.0, sigma_data=0.25)],
                         ids=["default", "other-range"])
def test_consistency_model_equals_diffusers(tmp_path, config):
    unet = tiny_unet(4)
    scheduler = CMStochasticIterativeScheduler(**config)
    denoiser = load_denoiser(save_pipeline(tmp_path / "cm", unet, scheduler), None)
    for k, sigma in enumerate(SIGMAS):
        x_rs = _x_rs(5 + k, sigma=sigma)
        expected = _diffusers_consistency(unet, scheduler, x_rs, sigma)
        ours = denoiser.denoise(x_rs, sigma)
        assert torch.allclose(ours, (expected + 1) / 2, atol=ATOL, rtol=0), (ours - (expected + 1) / 2).abs().max()
        assert math.isclose(denoiser.timestep(sigma), 250 * math.log(2 * sigma), rel_tol=1e-12)


def test_consistency_sigma_outside_the_range_is_refused(tmp_path):
    scheduler = CMStochasticIterativeScheduler(sigma_min=0.1, sigma_max=4.0)
    denoiser = load_denoiser(save_pipeline(tmp_path / "cm", tiny_unet(4), scheduler), None)
    for sigma in (0.04, 2.5):
        with pytest.raises(UserError, match=r"outside its \[sigma_min, sigma_max\]") as err:
            denoiser.purifier(sigma)
        assert "\n" not in str(err.value)
    denoiser.purifier(0.05)             # 2 sigma = sigma_min: inside
    denoiser.purifier(2.0)              # 2 sigma = sigma_max: inside


@pytest.mark.parametrize("scheduler", [DDPMScheduler(prediction_type="v_prediction"), CMStochasticIterativeScheduler()],
                         ids=["ddpm", "consistency"])
def test_set_coefficients_moves_a_purifier_to_another_sigma(tmp_path, scheduler):
    """A built (or compiled) purifier reads its coefficients from buffers: moving it equals building anew."""
    denoiser = load_denoiser(save_pipeline(tmp_path / "p", tiny_unet(5), scheduler), None)
    x_rs = _x_rs(9)
    moved = denoiser.purifier(0.25)
    moved.set_coefficients(denoiser.coefficients(0.5))
    with torch.no_grad():
        assert torch.equal(moved(x_rs), denoiser.purifier(0.5)(x_rs))


def test_one_channel_model(tmp_path):
    unet = tiny_unet(6, channels=1)
    scheduler = DDPMScheduler()
    denoiser = load_denoiser(save_pipeline(tmp_path / "p", unet, scheduler), None)
    x_rs = _x_rs(7, channels=1)
    _, x0 = _diffusers_x0(unet, scheduler, x_rs, 0.25)
    assert denoiser.channels == 1
    assert torch.allclose(denoiser.denoise(x_rs, 0.25), (x0 + 1) / 2, atol=ATOL, rtol=0)


def test_learned_timestep_embedding_gets_the_integer_step(tmp_path):
    """time_embedding_type 'learned' indexes a table with t*: the engine's float timestep is rounded to it."""
    unet = tiny_unet(8, time_embedding_type="learned", num_train_timesteps=1000)
    scheduler = DDPMScheduler()
    denoiser = load_denoiser(save_pipeline(tmp_path / "p", unet, scheduler), None)
    x_rs = _x_rs(10)
    _, x0 = _diffusers_x0(unet, scheduler, x_rs, 0.25)
    assert torch.allclose(denoiser.denoise(x_rs, 0.25), (x0 + 1) / 2, atol=ATOL, rtol=0)

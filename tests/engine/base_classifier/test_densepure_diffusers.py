"""DensePure on a diffusers DDPM folder steps through the folder's own DDPMScheduler: given the same step noises,
its chains equal a loop written with the scheduler's public API alone (set_timesteps(timesteps=...), step with a
seeded generator; the last step's pred_original_sample, which is its noise-free prev_sample), for a learned-range
and a fixed-variance scheduler at S in {2, 5}; certify on such a folder writes equal rows whatever the batch."""

import numpy as np
import pytest
import torch

pytest.importorskip("diffusers")
pytest.importorskip("safetensors")

from cli_helpers import assert_rows_spread, invoke_ok, rows_without_time  # noqa: E402
from diffusers import DDIMScheduler, DDPMScheduler  # noqa: E402
from diffusers_fixtures import save_pipeline, tiny_unet  # noqa: E402
from tiny_fixtures import SIGMA, centroid_classifier, tiny_images  # noqa: E402

from diffsmooth.engine.backends.torch.runner import TorchRunner  # noqa: E402
from diffsmooth.engine.base_classifier.denoise import load_denoiser  # noqa: E402
from diffsmooth.engine.base_classifier.methods import MethodConfig  # noqa: E402
from diffsmooth.engine.base_classifier.methods.reverse_chains_purifier import MAX_STEPS  # noqa: E402
from diffsmooth.engine.errors import UserError  # noqa: E402
from diffsmooth.engine.models.checkpoints import save_cohen_checkpoint  # noqa: E402


class GeneratorDraws:
    """A RowNoise stand-in: draw d is the d-th of the draws a seeded generator makes in the loop's order."""

    def __init__(self, seed: int, runs: int, steps: int, shape):
        g = torch.Generator().manual_seed(seed)
        self.draws = {k * MAX_STEPS + i: torch.randn(shape, generator=g) for k in range(runs) for i in range(steps)}

    def normal(self, draw, shape):
        return self.draws[draw]


def _scheduler_loop(unet, scheduler, x_rs, sigma, timesteps, runs, seed):
    """DensePure's chains written with the scheduler's public API only."""
    g = torch.Generator().manual_seed(seed)
    scheduler.set_timesteps(timesteps=list(timesteps))
    channels = x_rs.shape[1]
    out_runs = []
    for _ in range(runs):
        x = (1 / (1 + 4 * sigma ** 2)) ** 0.5 * (2 * x_rs - 1)
        for i, t in enumerate(timesteps):
            out = unet(x, torch.full((x.shape[0],), float(t)))
            if out.shape[1] != 2 * channels or scheduler.config.variance_type != "learned_range":
                out = out[:, :channels]
            result = scheduler.step(out, t, x, generator=g)
            x = result.prev_sample if i < len(timesteps) - 1 else result.pred_original_sample
        out_runs.append((x + 1) / 2)
    return torch.stack(out_runs, dim=1)


@pytest.mark.parametrize("variance_type, out_channels", [("learned_range", 6), ("fixed_small", 3)])
@pytest.mark.parametrize("steps", [2, 5])
def test_chains_equal_the_schedulers_own_steps(tmp_path, variance_type, out_channels, steps):
    folder = save_pipeline(tmp_path / "ddpm", tiny_unet(0, out_channels=out_channels),
                           DDPMScheduler(variance_type=variance_type))
    denoiser = load_denoiser(folder, None)
    runs, sigma = 2, 0.5
    config = MethodConfig("densepure", sigma, options=(("reverse_runs", runs), ("steps", steps)))
    chains = config.purifier.stage(config.sigma, denoiser, TorchRunner())
    x_rs = torch.rand(3, 3, 8, 8, generator=torch.Generator().manual_seed(4))
    t_star = chains.timesteps[0]
    abar = np.asarray(DDPMScheduler().alphas_cumprod, dtype=np.float64)
    ratio = np.sqrt(1 / abar - 1)
    assert ratio[t_star - 1] < 2 * sigma <= ratio[t_star + 1]                       # the nearest timestep
    with torch.no_grad():
        # the generator's draws in the loop's order: each run draws at every step (the last one's is unused)
        draws = GeneratorDraws(7, runs, steps, x_rs.shape)
        expected = _scheduler_loop(denoiser.unet, DDPMScheduler(variance_type=variance_type), x_rs, sigma,
                                   chains.timesteps, runs, 7)
    got = chains(x_rs, draws)
    assert got.shape == (3, runs, 3, 8, 8)
    assert torch.allclose(got, expected, atol=1e-5, rtol=0), (got - expected).abs().max()
    assert not torch.allclose(got[:, 0], got[:, 1], atol=1e-3)                     # the runs' noises differ


def test_other_schedulers_and_export_are_refused_in_one_line(tmp_path):
    folder = save_pipeline(tmp_path / "ddim", tiny_unet(0), DDIMScheduler())
    denoiser = load_denoiser(folder, None)
    config = MethodConfig("densepure", 0.5)
    with pytest.raises(UserError, match="steps a diffusers folder through its DDPMScheduler, not a DDIMScheduler"):
        config.purifier.stage(config.sigma, denoiser, TorchRunner())
    with pytest.raises(UserError, match="a diffusers folder steps through its own scheduler on the torch backend"):
        config.purifier.graph(config.sigma, denoiser, (3, 8, 8), config.name)


@pytest.mark.slow
def test_certify_on_a_ddpm_folder_writes_equal_rows_across_batches(tmp_path):
    folder = save_pipeline(tmp_path / "ddpm", tiny_unet(0, out_channels=6), DDPMScheduler(variance_type="learned_range"))
    images = tiny_images()
    purify = load_denoiser(folder, None).purifier(SIGMA)
    save_cohen_checkpoint(tmp_path / "clf.pt", centroid_classifier(0, images, SIGMA, purify), "cifar_resnet20")
    np.savez(tmp_path / "data.npz", images=images, labels=np.arange(6))
    args = ["certify", "--denoiser", folder, "--classifier", tmp_path / "clf.pt", "--dataset", "npz", "--data",
            tmp_path / "data.npz", "--sigma", SIGMA, "--method", "densepure", "--option", "reverse_runs=3",
            "--option", "steps=2", "--n0", 6, "--n", 24, "--alpha", 0.2, "--quiet"]
    for batch in (5, 24):
        invoke_ok([*args, "--batch", batch, "--out", tmp_path / f"b{batch}.tsv"])
    assert_rows_spread(tmp_path / "b5.tsv", min_classes=3)
    assert rows_without_time(tmp_path / "b5.tsv") == rows_without_time(tmp_path / "b24.tsv")

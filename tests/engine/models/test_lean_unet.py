"""The lean UNet (issue 45, `--lean-unet`): an eps-only copy of a learned-sigma UNet (its output conv
computes only the noise estimate) and t*'s time embedding computed once, at batch 1. Same maths as the
default purifier on CPU in fp32 (within 1e-6), shares nothing with the caller's UNet, follows
`set_coefficients`, and saves the FLOPs counted here."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from stage_fixtures import SHAPE, build_tiny_stages, image, make_pipeline
from tiny_fixtures import TINY_UNET

from diffsmooth.bench.flops import stage_flops
from diffsmooth.engine.base_classifier.diffusion_denoiser import PRESET_SCHEDULES, DiffusionDenoiser
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.models.unet import ResBlock, UNetModel, unet_config
from diffsmooth.engine.runs.fast_path import FastPath


@pytest.fixture(scope="module")
def tiny():
    return build_tiny_stages()


def _states(module):
    return {k: v.clone() for k, v in module.state_dict().items()}


def test_eps_only_copy_shares_nothing_and_keeps_the_noise_filters(tiny):
    unet = tiny[1].unet
    before = _states(unet)
    lean = unet.eps_only()
    assert unet.config.learn_sigma and unet.out[2].out_channels == 6 and lean.out[2].out_channels == 3
    assert lean.computes_channels == 3 and unet.computes_channels == 6
    torch.testing.assert_close(lean.out[2].weight, unet.out[2].weight[:3], rtol=0, atol=0)
    torch.testing.assert_close(lean.out[2].bias, unet.out[2].bias[:3], rtol=0, atol=0)
    originals = {t.data_ptr() for t in unet.state_dict().values()}
    assert not originals & {t.data_ptr() for t in lean.state_dict().values()}
    assert not {id(m) for m in unet.modules()} & {id(m) for m in lean.modules()}
    with torch.no_grad():
        for p in lean.parameters():
            p.add_(1.0)                      # writing the copy leaves the caller's UNet as it was
    for name, value in unet.state_dict().items():
        assert torch.equal(value, before[name]), name


@pytest.mark.parametrize("which", ["tiny (learned sigma)", "demo (eps only already)"])
def test_lean_purifier_equals_the_default_within_1e_6(tiny, which):
    if which.startswith("tiny"):
        denoiser, shape = tiny[1], SHAPE
    else:
        from diffsmooth.engine.base_classifier.methods import MethodConfig
        from diffsmooth.engine.runs.assemble import ModelSources, load_models
        denoiser, _ = load_models(MethodConfig("diffsmooth", 0.5), ModelSources.demo())
        shape = (1, 32, 32)
    x = torch.rand(16, *shape, generator=torch.Generator().manual_seed(1))
    for fused in (False, True):
        with torch.inference_mode():
            default = denoiser.purifier(0.5, fused)(x)
            lean = denoiser.purifier(0.5, fused, lean=True)(x)
        assert lean.shape == default.shape
        assert float((lean - default).abs().max()) <= 1e-6, (which, fused)
        assert float((default - x).abs().max()) > 1e-2          # the comparison sees the denoiser at work


def test_one_timestep_serves_the_batch_and_a_wrong_count_is_refused(tiny):
    unet = tiny[1].unet
    x = torch.rand(5, *SHAPE) * 2 - 1
    with torch.inference_mode():
        per_image = unet(x, torch.full((5,), 321.0))
        shared = unet(x, torch.full((1,), 321.0))
        other = unet(x, torch.full((1,), 40.0))
    assert float((per_image - shared).abs().max()) <= 1e-6
    assert float((other - shared).abs().max()) > 1e-3              # the timestep still matters
    with pytest.raises(UserError, match=r"\[5\] \(or \[1\]"):
        unet(x, torch.zeros(2))


def test_lean_purifier_follows_set_coefficients(tiny):
    """The embedding is computed from the t* buffer inside the call: moving the purifier to another
    sigma in place (a table's model set) gives that sigma's output."""
    denoiser = tiny[1]
    moved = denoiser.purifier(0.25, lean=True)
    moved.set_coefficients(denoiser.schedule.coefficients(0.5))
    x = torch.rand(8, *SHAPE, generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        fresh = denoiser.purifier(0.5, lean=True)(x)
        assert torch.equal(moved(x), fresh)
        assert float((denoiser.purifier(0.25, lean=True)(x) - fresh).abs().max()) > 1e-3


def test_lean_needs_the_engine_unet():
    class Other(torch.nn.Module):
        def forward(self, x, t):
            return x

    denoiser = DiffusionDenoiser(Other(), PRESET_SCHEDULES["cifar10"], channels=3)
    with pytest.raises(UserError, match="lean UNet needs the engine's UNetModel"):
        denoiser.purifier(0.5, lean=True)


def test_lean_pipeline_counts_equal_the_default(tiny):
    """Votes of the whole base classifier (denoise, local smoothing, classify) on the same samples."""
    from diffsmooth.engine.backends.torch.runner import TorchRunner
    from diffsmooth.engine.backends.torch.stages import build_torch_stages
    from diffsmooth.engine.certify.monte_carlo import MonteCarloPipeline
    config, denoiser, classifier = tiny
    stages = build_torch_stages(config, classifier, denoiser, TorchRunner(), SHAPE, 10, FastPath(lean_unet=True))
    lean = MonteCarloPipeline(stages, config.sigma, seed=3)
    default = make_pipeline(tiny)
    for k in range(3):
        a, b = default.count(image(k), k, 0, 300, 100), lean.count(image(k), k, 0, 300, 100)
        assert (a > 0).sum() >= 2
        np.testing.assert_array_equal(a, b)


def _saved_by_lean(unet: UNetModel, shape, batch: int) -> int:
    """FLOPs per sample the lean UNet does not compute, counted by hand: the output conv's variance
    filters, and (batch - 1) / batch of the time MLP and of every ResBlock's embedding projection."""
    conv = unet.out[2]
    dropped = conv.out_channels - unet.config.in_channels
    out_conv = 2 * dropped * conv.in_channels * conv.kernel_size[0] * conv.kernel_size[1] * shape[1] * shape[2]
    linears = [unet.time_embed[0], unet.time_embed[2]] + [m.emb_layers[1] for m in unet.modules()
                                                          if isinstance(m, ResBlock)]
    embedding = sum(2 * lin.in_features * lin.out_features for lin in linears)
    return out_conv + (embedding * (batch - 1)) // batch


@pytest.mark.parametrize("batch", [2, 64])
def test_flops_saved_are_the_variance_filters_and_the_per_sample_embedding(tiny, batch):
    denoiser = tiny[1]
    full, _ = stage_flops(denoiser.purifier(0.5), SHAPE, batch=batch)
    lean, _ = stage_flops(denoiser.purifier(0.5, lean=True), SHAPE, batch=batch)
    assert full - lean == pytest.approx(_saved_by_lean(denoiser.unet, SHAPE, batch), abs=1)


def test_cifar10_flops_saved_as_docs_say():
    """docs/performance.md: 21.6 MFLOP of 16.77 GFLOP per sample at batch 2000 (0.13%) for the CIFAR-10 UNet."""
    with torch.device("meta"):
        unet = UNetModel(unet_config("cifar10"))
    denoiser = DiffusionDenoiser(unet, PRESET_SCHEDULES["cifar10"])
    full, _ = stage_flops(denoiser.purifier(0.5), (3, 32, 32), batch=2000)
    lean, _ = stage_flops(denoiser.purifier(0.5, lean=True), (3, 32, 32), batch=2000)
    assert round(full / 1e9, 2) == 16.77 and round((full - lean) / 1e6, 1) == 21.6
    assert full - lean == pytest.approx(_saved_by_lean(unet, (3, 32, 32), 2000), abs=1)


def test_an_eps_only_copy_of_a_model_without_learned_sigma_is_a_plain_copy():
    torch.manual_seed(0)
    unet = UNetModel(unet_config("cifar10", **{**TINY_UNET, "learn_sigma": False}))
    lean = unet.eps_only()
    assert lean.out[2].out_channels == 3 and lean.out[2] is not unet.out[2]
    assert copy.deepcopy(lean).computes_channels == 3

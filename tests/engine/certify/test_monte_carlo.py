"""Pipeline behaviour with small stand-in modules: batch-size independence, method wiring,
fixed vs fresh local noise, NaN detection, one-shot denoising formula."""

import numpy as np
import pytest
import torch
from torch import nn

from diffsmooth.engine.backends.torch.runner import TorchRunner
from diffsmooth.engine.backends.torch.stages import build_torch_stages
from diffsmooth.engine.base_classifier.denoise import DiffusionDenoiser
from diffsmooth.engine.base_classifier.methods import MethodConfig
from diffsmooth.engine.base_classifier.schedule import DiffusionSchedule
from diffsmooth.engine.certify.monte_carlo import MonteCarloPipeline, NonFiniteScores
from diffsmooth.engine.certify.smooth import Smooth
from diffsmooth.engine.errors import UserError

SHAPE = (1, 8, 8)


class ToyEps(nn.Module):
    """A stand-in noise predictor with learned-sigma output (2C channels)."""

    def __init__(self, channels=1):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(channels, 2 * channels, 3, padding=1)
        self.seen_t = None

    def forward(self, x, t):
        self.seen_t = t
        return self.conv(x) * 0.1


def toy_classifier(classes=4):
    torch.manual_seed(1)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, classes))


def make_smooth(method, sigma=0.5, m=3, local_noise="fixed", seed=0, classes=4):
    denoiser = DiffusionDenoiser(ToyEps(), DiffusionSchedule("cosine", 4000, True), channels=1)
    config = MethodConfig(method, sigma, m=m, local_sigma=0.25, local_noise=local_noise)
    stages = build_torch_stages(config, toy_classifier(classes), denoiser, TorchRunner(), SHAPE, classes)
    return Smooth(MonteCarloPipeline(stages, sigma, seed))


def image():
    return torch.linspace(0, 1, 64).view(*SHAPE)


@pytest.mark.parametrize("method,mode", [("rs", "fixed"), ("dds", "fixed"), ("diffsmooth", "fixed"),
                                         ("diffsmooth", "fresh")])
def test_counts_do_not_depend_on_batch_size(method, mode):
    smooth = make_smooth(method, local_noise=mode)
    a = smooth.pipeline.count(image(), 4, 0, 200, batch=7)
    b = smooth.pipeline.count(image(), 4, 0, 200, batch=200)
    assert (a > 0).sum() >= 2, f"votes {a} do not spread: equal counts would prove nothing"
    assert np.array_equal(a, b)


def explicit_votes(method, mode, image_index, first, num, sigma=0.5, m=3, seed=0):
    """The votes of samples first..first+num-1 built one by one from the noise definition
    (x + sigma * eps_j, one-shot denoise, local noises, argmax), independent of the pipeline."""
    from diffsmooth.engine.certify.noise import STREAM_LOCAL, STREAM_SMOOTHING, fixed_local_noise, gaussian
    classifier = toy_classifier()
    denoiser = DiffusionDenoiser(ToyEps(), DiffusionSchedule("cosine", 4000, True), channels=1)
    votes = []
    with torch.no_grad():
        for j in range(first, first + num):
            x = image().unsqueeze(0) + sigma * gaussian(seed, STREAM_SMOOTHING, image_index, j, 1, SHAPE)
            if method != "rs":
                x = denoiser.denoise(x, sigma)
            if method == "diffsmooth":
                delta = (fixed_local_noise(m, SHAPE) if mode == "fixed"
                         else gaussian(seed, STREAM_LOCAL, image_index, j, 1, (m, *SHAPE))[0])
                scores = torch.softmax(classifier(x + 0.25 * delta), dim=-1).mean(0)
            else:
                scores = classifier(x)[0]
            votes.append(int(scores.argmax()))
    return np.bincount(votes, minlength=4)


@pytest.mark.parametrize("method,mode", [("rs", "fixed"), ("dds", "fixed"), ("diffsmooth", "fixed"),
                                         ("diffsmooth", "fresh")])
def test_counts_equal_votes_of_explicit_samples(method, mode):
    """Batches starting mid-run (sample 13, batch 7) count exactly the samples they name."""
    expected = explicit_votes(method, mode, image_index=5, first=13, num=60)
    assert (expected > 0).sum() >= 2, f"votes {expected} do not spread"
    got = make_smooth(method, local_noise=mode).pipeline.count(image(), 5, 13, 60, batch=7)[0]
    assert np.array_equal(got, expected)


def test_counts_depend_on_seed_and_image_index():
    smooth = make_smooth("rs", sigma=1.0)
    a = smooth.pipeline.count(image(), 0, 0, 400, 100)
    assert not np.array_equal(a, smooth.pipeline.count(image(), 1, 0, 400, 100))
    other = make_smooth("rs", sigma=1.0, seed=9)
    assert not np.array_equal(a, other.pipeline.count(image(), 0, 0, 400, 100))


def test_one_shot_denoise_formula():
    unet = ToyEps()
    schedule = DiffusionSchedule("cosine", 4000, True)
    den = DiffusionDenoiser(unet, schedule, channels=1)
    x_rs = torch.rand(2, *SHAPE)
    out = den.denoise(x_rs, 0.5)
    c = schedule.coefficients(0.5)
    x_t = c.sqrt_abar * (2 * x_rs - 1)
    eps = unet.conv(x_t)[:, :1] * 0.1
    expected = ((c.sqrt_recip_abar * x_t - c.sqrt_recipm1_abar * eps).clamp(-1, 1) + 1) / 2
    assert torch.allclose(out, expected, atol=1e-6)
    assert unet.seen_t.dtype == torch.float32 and float(unet.seen_t[0]) == 496.0
    assert den.timestep(0.5) == 1984
    assert out.min() >= 0 and out.max() <= 1


def test_diffsmooth_m_local_noises_in_one_classifier_call():
    calls = []
    classifier = toy_classifier()
    classifier.register_forward_hook(lambda mod, inp, out: calls.append(inp[0].shape[0]))
    denoiser = DiffusionDenoiser(ToyEps(), DiffusionSchedule("cosine", 4000, True), channels=1)
    config = MethodConfig("diffsmooth", 0.5, m=5, local_sigma=0.25)
    stages = build_torch_stages(config, classifier, denoiser, TorchRunner(), SHAPE, 4)
    calls.clear()
    MonteCarloPipeline(stages, 0.5).count(image(), 0, 0, 30, batch=10)
    assert calls == [50, 50, 50]       # B x m images per call, no Python loop over m


def test_fixed_and_fresh_local_noise_differ():
    # each mode's counts equal its own definition (test_counts_equal_votes_of_explicit_samples)
    a = make_smooth("diffsmooth", local_noise="fixed").pipeline.count(image(), 0, 0, 300, 100)
    b = make_smooth("diffsmooth", local_noise="fresh").pipeline.count(image(), 0, 0, 300, 100)
    assert not np.array_equal(a, b)


def test_certify_selects_on_n0_and_bounds_on_the_next_n():
    """CERTIFY by hand from explicit votes: cA from samples 0..n0-1, pA_lower from samples
    n0..n0+n-1 (scipy's beta quantile), radius sigma * Phi^-1(pA_lower)."""
    from scipy.stats import beta, norm
    sigma, n0, n, alpha = 0.25, 20, 200, 0.01
    selection = explicit_votes("rs", "fixed", 2, 0, n0, sigma=sigma)
    estimation = explicit_votes("rs", "fixed", 2, n0, n, sigma=sigma)
    c_a = int(np.argmax(selection))
    assert (estimation > 0).sum() >= 2 and int(np.argmax(estimation)) == c_a
    p_lower = beta.ppf(alpha, estimation[c_a], n - estimation[c_a] + 1)
    assert p_lower > 0.5, "the hand computation must reach the certify branch"
    pred, radius = make_smooth("rs", sigma=sigma).certify(image(), n0=n0, n=n, alpha=alpha, batch=64, image_index=2)
    assert pred == c_a and radius == pytest.approx(sigma * norm.ppf(p_lower), rel=1e-9)


def test_predict_follows_the_binomial_test():
    from scipy.stats import binomtest
    counts = explicit_votes("rs", "fixed", 3, 0, 100, sigma=0.25)
    top, second = sorted(counts)[::-1][:2]
    expected = int(np.argmax(counts)) if binomtest(top, top + second, 0.5).pvalue <= 0.001 else Smooth.ABSTAIN
    assert make_smooth("rs", sigma=0.25).predict(image(), n=100, alpha=0.001, batch=64, image_index=3) == expected


def test_constant_classifier_gets_maximal_radius():
    class Constant(nn.Module):
        def forward(self, x):
            out = torch.zeros(x.shape[0], 3)
            out[:, 2] = 1.0
            return out
    config = MethodConfig("rs", 0.25)
    stages = build_torch_stages(config, Constant(), None, TorchRunner(), SHAPE, 3)
    pred, radius = Smooth(MonteCarloPipeline(stages, 0.25)).certify(image(), 10, 1000, 0.001, 256, image_index=0)
    from diffsmooth.engine.certify.cohen import max_certifiable_radius
    assert pred == 2 and radius == pytest.approx(max_certifiable_radius(1000, 0.001, 0.25))


def test_nan_scores_stop_the_image():
    class NaNClassifier(nn.Module):
        def forward(self, x):
            return torch.full((x.shape[0], 3), float("nan"))
    stages = build_torch_stages(MethodConfig("rs", 0.5), NaNClassifier(), None, TorchRunner(), SHAPE, None)
    with pytest.raises(NonFiniteScores, match="NaN/Inf"):
        MonteCarloPipeline(stages, 0.5).count(image(), 0, 0, 10, 5)


def test_bad_shapes_and_parameters_are_user_errors():
    with pytest.raises(UserError, match="cannot take images of shape"):
        build_torch_stages(MethodConfig("rs", 0.5), toy_classifier(), None, TorchRunner(), (3, 8, 8), 4)
    with pytest.raises(UserError, match="labels up to 9 but the classifier scores only 4"):
        build_torch_stages(MethodConfig("rs", 0.5), toy_classifier(), None, TorchRunner(), SHAPE, 10)
    for kwargs, msg in (({"sigma": 0}, "sigma must be > 0"), ({"m": 0}, "setting m must be 1..1024"),
                        ({"local_sigma": -0.1}, "setting local_sigma must be >= 0"),
                        ({"local_noise": "x"}, "setting local_noise must be one of")):
        args = dict(name="diffsmooth", sigma=0.5)
        args.update(kwargs)
        with pytest.raises(UserError, match=msg):
            MethodConfig(**args)
    smooth = make_smooth("rs")
    for kwargs, msg in (({"n0": 0}, "n0"), ({"n": 0}, "n must"), ({"alpha": 1.0}, "alpha"), ({"batch": 0}, "batch"),
                        ({"image_index": None}, "give `image_index`"), ({"image_index": -1}, "image_index")):
        args = dict(n0=1, n=10, alpha=0.001, batch=5, image_index=0)
        args.update(kwargs)
        with pytest.raises(UserError, match=msg):
            smooth.certify(image(), **args)

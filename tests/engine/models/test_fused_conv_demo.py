"""--fused-conv on the demo ResNet-20 (Fashion-MNIST, one channel, 32x32) the way it runs on CUDA, emulated
on the CPU: the folded net fed NHWC, every fusable convolution through the CUDA kernel's cuDNN call (faked with
cuDNN's maths, and refusing mixed dtypes or non-NHWC operands), fp16 weights under autocast.

On an H200, test_gpu.py's test_fused_conv_classifier_on_cuda failed with all 1000 votes on class 1. The same
counts come out on the CPU in fp32 with the original, unfolded classifier: that image (embedded 5, a trouser)
is unanimous for the correct model. These tests check on the CPU what the GPU test takes for granted: the
fused path agrees with the unfused model on real images, and the GPU test's image spreads its votes."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from stage_fixtures import GPU_FUSED_CONV_IMAGE

from diffsmooth.engine.models import folded_resnet
from diffsmooth.engine.models import shipped as demo_assets

pytestmark = pytest.mark.skipif(not demo_assets.DEMO_UNET.exists() or
                                not demo_assets.demo_classifier_path(0.25).exists(),
                                reason="embedded demo models not shipped")

CL = torch.channels_last


def _fake_cudnn(monkeypatch, fault=None):
    """torch.cudnn_convolution_add_relu as cuDNN computes it: relu(conv(x, w) + alpha * z + bias), fp32
    accumulation, the output in x's dtype and NHWC. It refuses what cuDNN's fused kernels cannot take.
    fault plants an error for the oracle to notice: 'no-bias', or 'nchw' (the NHWC memory read as NCHW)."""
    calls = []

    def add_relu(x, weight, z, alpha, bias, stride, padding, dilation, groups):
        assert x.dtype == weight.dtype == z.dtype == bias.dtype, (x.dtype, weight.dtype, z.dtype, bias.dtype)
        for name, t in (("x", x), ("weight", weight), ("z", z)):
            assert t.is_contiguous(memory_format=CL), f"{name} is not NHWC: {tuple(t.shape)} {t.stride()}"
        assert bias.shape == (weight.shape[0],) and z.shape[1] == weight.shape[0], (bias.shape, z.shape)
        calls.append(tuple(x.shape))
        if fault == "nchw":       # the NHWC buffer taken for NCHW: what a wrong layout descriptor would do
            x = torch.as_strided(x, x.shape, torch.empty(x.shape).stride())
        b = None if fault == "no-bias" else bias.float()
        out = F.conv2d(x.float(), weight.float(), b, stride, padding, dilation, groups) + float(alpha) * z.float()
        assert out.shape == z.shape, (out.shape, z.shape)
        return F.relu(out).to(x.dtype).contiguous(memory_format=CL)

    monkeypatch.setattr(torch, "cudnn_convolution_add_relu", add_relu)
    monkeypatch.setitem(folded_resnet.CUDNN_FUSION, "enabled", True)
    # The CUDA kernel (fused where _fusable, conv2d + add + relu elsewhere) in place of the op's CPU one.
    monkeypatch.setattr(folded_resnet, "conv_bias_add_relu", folded_resnet._conv_bias_add_relu_cuda)
    monkeypatch.setattr(folded_resnet.FoldedNet, "nhwc", True)          # what the folded net does on CUDA
    return calls


def _demo_images(count=32, noise=0.25):
    """Embedded test images with the local-smoothing noise the classifier sees (seeded)."""
    from diffsmooth import load_dataset
    data = load_dataset("embedded")
    x = torch.stack([data[i][0] for i in range(count)])
    return x + noise * torch.randn(x.shape, generator=torch.Generator().manual_seed(0))


def _fused_demo_logits(monkeypatch, dtype, fault=None):
    from diffsmooth import load_demo_classifier
    clf = load_demo_classifier(0.25).eval()
    x = _demo_images()
    with torch.no_grad():
        expected = clf(x)
    calls = _fake_cudnn(monkeypatch, fault)
    folded = folded_resnet.fold_classifier(clf, dtype).eval().to(memory_format=CL)    # as on CUDA
    autocast = torch.autocast("cpu", dtype=dtype) if dtype != torch.float32 else torch.autocast("cpu", enabled=False)
    with torch.inference_mode(), autocast:
        got = folded(x).float()
    fusable = [m for m in folded.modules() if isinstance(m, folded_resnet.FoldedConv) and m.relu][1:]   # not the stem
    return expected, got, len(calls) == len(fusable) > 0


@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-4), (torch.float16, 2e-2)])
def test_fused_demo_classifier_scores_real_images_like_the_unfused_one(monkeypatch, dtype, tolerance):
    """The demo classifier folded and run through the (faked) cuDNN fused calls, NHWC, in fp32 and in fp16
    under autocast: the logits of real noisy images are the original classifier's (relative to their size)
    and so are the votes. The images' logits and votes differ (no constant output can pass)."""
    expected, got, all_fused = _fused_demo_logits(monkeypatch, dtype)
    assert all_fused, "not every convolution after the stem reached the fused call"
    assert len(set(expected.argmax(1).tolist())) >= 5 and float(expected.std(0).min()) > 0.5
    assert torch.isfinite(got).all()
    diff = float((got - expected).abs().max())
    assert diff <= tolerance * (1 + float(expected.abs().max())), f"max |logit diff| {diff:.3g}"
    agree = int((got.argmax(1) == expected.argmax(1)).sum())
    assert agree >= len(got) - (0 if dtype == torch.float32 else 1), f"{agree} of {len(got)} votes agree"


@pytest.mark.parametrize("fault", ["no-bias", "nchw"])
def test_the_real_image_oracle_notices_a_wrong_fused_call(monkeypatch, fault):
    """The comparison above fails for a fused call that loses its bias or reads NHWC memory as NCHW."""
    expected, got, _ = _fused_demo_logits(monkeypatch, torch.float32, fault)
    assert float((got - expected).abs().max()) > 0.1 * (1 + float(expected.abs().max()))


@pytest.mark.slow
def test_the_gpu_fused_conv_test_image_spreads_its_votes_on_the_cpu(monkeypatch):
    """test_gpu.py's test_fused_conv_classifier_on_cuda counts GPU_FUSED_CONV_IMAGE (diffsmooth, sigma 0.5,
    m 5, 1000 samples in batches of 250) and requires votes on two classes or more. Here the first of those
    batches (samples 0-249: the noise is indexed by sample, so they are the GPU run's first 250) on the CPU,
    --fused-conv with the CUDA kernel's fused calls emulated, and the unfolded classifier: both spread, the
    same counts. Votes that spread over the first 250 samples spread over all 1000."""
    from diffsmooth.engine.backends.torch import stages as torch_stages
    from diffsmooth.engine.base_classifier.methods import MethodConfig
    from diffsmooth.engine.data import load_dataset
    from diffsmooth.engine.runs.assemble import ModelSources, load_models
    from diffsmooth.engine.runs.fast_path import FastPath
    from diffsmooth.engine.runs.stage_build import build_smooth
    config = MethodConfig("diffsmooth", 0.5, m=5, local_sigma=0.25)
    sources = ModelSources.demo()
    models = load_models(config, sources)
    x, _ = load_dataset("embedded")[GPU_FUSED_CONV_IMAGE]

    def counts(fused_conv):
        pipe = build_smooth(config, sources, (1, 32, 32), 10, device="cpu", precision="fp32",
                            fast=FastPath(fused_conv=fused_conv), models=models).pipeline
        return pipe.count(x, GPU_FUSED_CONV_IMAGE, 0, 250, 250)
    reference = counts(False)
    assert (reference > 0).sum() >= 2, f"image {GPU_FUSED_CONV_IMAGE} is unanimous for the unfolded model: {reference}"
    calls = _fake_cudnn(monkeypatch)
    real = torch_stages.folded_classifier
    monkeypatch.setattr(torch_stages, "folded_classifier",                # channels_last weights, as on CUDA
                        lambda *a, **k: real(*a, **k).to(memory_format=CL))
    fused = counts(True)
    assert calls, "the fused call was never reached"
    assert np.abs(fused - reference).sum() <= 1, (fused, reference)         # 4 of 1000 before: fp32 rounding

"""What a first GPU run would trip on, checked on CPU: the cuDNN fused-convolution kernel's inputs
and its probe, the fast-path agreement check (production counts vs eager fp32, TF32 off, planted
faults), compiled stages past dynamo's recompile limit, CUDA-graph capture failure and the
out-of-memory fallback, and bench/gpu_check.sh's time budget."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from diffsmooth.engine.models import folded_resnet
from diffsmooth.engine.models.folded_resnet import CUDNN_FUSION, FUSED_CALLS, check_fusion, fusion_verdict


# -- item 2: --fused-conv ---------------------------------------------------------------------------

def _fake_cudnn(monkeypatch):
    """cuDNN's fused calls as their documented maths on CPU, including what they add: z * alpha, with
    cudnn_convolution_relu's z being its own uninitialised output (NaN here, as garbage can be)."""
    calls = []

    def add_relu(x, weight, z, alpha, bias, stride, padding, dilation, groups):
        calls.append(("add_relu", z.clone()))
        out = F.conv2d(x, weight, bias, stride, padding, dilation, groups)
        return F.relu(out + alpha * z)

    def relu(x, weight, bias, stride, padding, dilation, groups):
        calls.append(("relu", None))
        out = F.conv2d(x, weight, bias, stride, padding, dilation, groups)
        garbage = torch.full_like(out, float("nan"))
        return F.relu(out + 0.0 * garbage)

    monkeypatch.setattr(torch, "cudnn_convolution_add_relu", add_relu)
    monkeypatch.setattr(torch, "cudnn_convolution_relu", relu)
    return calls


def _nhwc(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).contiguous(
        memory_format=torch.channels_last)


def test_fused_kernel_without_residual_adds_an_explicit_zero(monkeypatch):
    """The CUDA kernel's cuDNN call (run on CPU through fakes with cuDNN's maths) must not read
    uninitialised memory: no residual means an explicit zero z, and the output is finite and equal
    to conv2d + bias + relu."""
    calls = _fake_cudnn(monkeypatch)
    monkeypatch.setitem(CUDNN_FUSION, "enabled", True)
    x, weight, bias = _nhwc(4, 16, 8, 8), _nhwc(16, 16, 3, 3, seed=1), torch.randn(16)
    before = FUSED_CALLS["count"]
    out = folded_resnet._conv_bias_add_relu_cuda(x, weight, bias, None, 1, 1, True)
    assert FUSED_CALLS["count"] == before + 1 and calls, "the fused branch was not taken"
    assert [kind for kind, _ in calls] == ["add_relu"]
    assert torch.equal(calls[0][1], torch.zeros_like(calls[0][1]))
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, F.relu(F.conv2d(x, weight, bias, 1, 1)))
    assert out.is_contiguous(memory_format=torch.channels_last)
    residual = _nhwc(4, 16, 8, 8, seed=2)
    with_residual = folded_resnet._conv_bias_add_relu_cuda(x, weight, bias, residual, 1, 1, True)
    torch.testing.assert_close(with_residual, F.relu(F.conv2d(x, weight, bias, 1, 1) + residual))


def test_fusion_verdict_refuses_non_finite_outputs():
    expected = torch.randn(8, 10)
    nan = expected.clone()
    nan[3, 2] = float("nan")
    assert "NaN" in fusion_verdict(nan, expected)           # diff is NaN, and NaN > tol is False
    inf = expected.clone()
    inf[0, 0] = float("inf")
    assert "NaN/Inf" in fusion_verdict(inf, expected)
    assert "disagree" in fusion_verdict(expected + 1.0, expected)
    assert fusion_verdict(expected + 1e-4, expected) is None


class _FlagReader(torch.nn.Module):
    """Returns NaN in one output while cuDNN fusion is on: what reading uninitialised memory looks like."""

    def __init__(self):
        super().__init__()
        self.shapes = []

    def forward(self, x):
        self.shapes.append(tuple(x.shape))
        out = x.flatten(1)[:, :10].clone()
        if CUDNN_FUSION["enabled"]:
            out[0, 0] = float("nan")
        return out


def test_fusion_probe_turns_fusion_off_on_a_nan_output(monkeypatch):
    monkeypatch.setitem(CUDNN_FUSION, "enabled", True)
    messages = []
    net = _FlagReader()
    assert not check_fusion(net, torch.rand(12, 1, 8, 8), messages.append)
    assert not CUDNN_FUSION["enabled"] and "NaN/Inf" in messages[0] and net.shapes == [(12, 1, 8, 8)] * 2


def test_fusion_is_probed_at_the_runs_classifier_call(monkeypatch):
    """build_smooth hands the fused-conv probe the images per classifier call of the run (batch x m
    on CPU, where the classifier runs in one call)."""
    from diffsmooth.engine.base_classifier import methods
    from diffsmooth.engine.base_classifier.methods import MethodConfig
    from diffsmooth.engine.runs.assemble import ModelSources, build_smooth
    from diffsmooth.engine.runs.fast_path import FastPath
    from tests.test_models import randomized_bn_resnet
    seen = []
    real = methods.folded_classifier

    def recording(classifier, backend, image_shape, log=None, probe_batch=8):
        seen.append(probe_batch)
        return real(classifier, backend, image_shape, log, probe_batch)
    monkeypatch.setattr(methods, "folded_classifier", recording)
    config = MethodConfig("rs", 0.25)
    build_smooth(config, ModelSources(), (3, 8, 8), 10, fast=FastPath(fused_conv=True),
                 models=(None, randomized_bn_resnet("cifar_resnet20")), batch=40)
    assert seen == [40]
    from diffsmooth.engine.runs.assemble import classifier_call_images
    assert classifier_call_images(MethodConfig("diffsmooth", 0.25, m=3, local_sigma=0.1), 40, (3, 8, 8), "cpu") == 120

"""studies/memory.py: the bytes alive during a forward pass, counted on meta tensors (issue 45's ImageNet
memory question: docs/performance.md, "ImageNet memory")."""

from __future__ import annotations

import torch
from torch import nn

from studies.memory import LiveBytes, forward_peak, model_set_memory, stage_memory


def test_live_bytes_counts_what_is_alive_not_what_was_made():
    x = torch.zeros(1024, 1024, device="meta")          # 4 MiB, made before: not counted
    counter = LiveBytes()
    with counter:
        for _ in range(10):
            x = x + 1                                    # each result frees the one before
    assert counter.peak == 2 * 4 * 2 ** 20 and counter.live == 4 * 2 ** 20
    with LiveBytes() as kept:
        parts = [torch.zeros(256, device="meta") + i for i in range(3)]    # three kept: 3 x 1 KiB (+ temporaries)
        view = parts[0][:10]                             # a view adds nothing
    assert kept.live == 3 * 1024 and view.numel() == 10


def test_a_convolution_holds_its_output_and_scales_with_the_batch():
    conv = nn.Conv2d(8, 16, 3, padding=1)
    one = stage_memory("conv", conv, [(8, 32, 32)], 4, torch.float16)
    assert one.activations == 4 * 16 * 32 * 32 * 2 and one.weights == (16 * 8 * 9 + 16) * 2
    peak = forward_peak(nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 8, 1)).to("meta"),
                        torch.zeros(2, 8, 16, 16, device="meta"))
    assert peak == 2 * 2 * 16 * 16 * 16 * 4        # the 16-channel activation and the ReLU's output, fp32


def test_the_cifar10_unet_estimate_is_linear_in_the_batch():
    small, large = (e.activations for e in model_set_memory("cifar10", [100, 200], "fp16", reference_batch=None)
                    if e.stage.startswith("denoiser"))
    assert 1.9 < large / small < 2.1 and small > 100 * 3 * 32 * 32 * 2

"""`--pack-images K` (engine/models/packed_resnet.py): a CIFAR ResNet's first stage on K images per tensor with
block-diagonal weights scores like the network as it is, for any batch, in both memory layouts; each image reads
only its own channels; the run options carry it end to end and the demo's rows do not change."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from cli_helpers import invoke_ok, rows_without_time
from stage_fixtures import RESNET8, SHAPE, build_tiny_stages, image, make_pipeline, randomized_bn_resnet
from test_triton_conv import prototype_classifier, prototype_images

from diffsmooth.bench.variants import parse_variant
from diffsmooth.engine.backends.torch.runner import TorchRunner
from diffsmooth.engine.backends.torch.stages import build_torch_stages
from diffsmooth.engine.certify.monte_carlo import MonteCarloPipeline
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.models.packed_resnet import PackedCifarResNet, pack_classifier
from diffsmooth.engine.runs.fast_path import FastPath
from diffsmooth.engine.runs.request import RunRequest

CL = torch.channels_last


def _images(n, seed=0):
    """Noisy images around ten prototypes, which prototype_classifier's votes tell apart."""
    return prototype_images(n, 32, 0.25, seed=seed)


@pytest.mark.parametrize("arch", ["cifar_resnet20", "cifar_resnet110"])
@pytest.mark.parametrize("k", [2, 4])
def test_the_packed_network_scores_like_the_network_for_any_batch(arch, k):
    clf = prototype_classifier(arch, 32)
    packed = pack_classifier(clf, k)
    assert isinstance(packed.net, PackedCifarResNet) and packed.net.images_per_tensor == k
    assert packed.net.conv1.weight.shape == (16 * k, 3 * k, 3, 3) and packed.net.layer1[0].bn1.num_features == 16 * k
    x = _images(13)
    with torch.no_grad():
        expected = clf(x)
        assert len(set(expected.argmax(1).tolist())) >= 4, "the votes must spread for the comparison to mean much"
        for n in (1, 3, k, 13):                              # batches k divides and ones padded with zero images
            got = packed(x[:n])
            assert got.shape == (n, 10)
            torch.testing.assert_close(got, expected[:n], rtol=1e-5, atol=1e-5)
        got = packed(x.contiguous(memory_format=CL))         # the CUDA fast path's layout
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
        assert torch.equal(got.argmax(1), expected.argmax(1))


def test_each_image_reads_only_its_own_channels():
    """Block-diagonal, not dense: an image's scores do not move with the image packed beside it."""
    packed = pack_classifier(randomized_bn_resnet("cifar_resnet20", seed=2), 2)
    x, partners = _images(1, seed=3), _images(3, seed=4)
    with torch.no_grad():
        alone = packed(x)
        for partner in partners:
            torch.testing.assert_close(packed(torch.cat([x, partner[None]]))[:1], alone, rtol=0, atol=1e-6)
        wide = packed.net.layer1[0].conv1.weight
        assert float(wide[:16, 16:].abs().max()) == 0.0 and float(wide[:16, :16].abs().max()) > 0


def test_a_classifier_that_is_not_a_cifar_resnet_runs_as_it_is():
    said = []
    other = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 10))
    assert pack_classifier(other, 2, said.append) is other and "not a CIFAR ResNet" in said[0]
    resnet = randomized_bn_resnet("cifar_resnet20")
    assert pack_classifier(resnet, 1) is resnet
    with pytest.raises(UserError, match="pack_images"):
        pack_classifier(resnet, 3)


def test_the_packed_stages_count_like_the_default():
    tiny = build_tiny_stages()
    config, denoiser, _ = tiny
    resnet = randomized_bn_resnet("cifar_resnet20", seed=0)
    x = image(11)
    default = make_pipeline(tiny, classifier=resnet).count(x, 0, 0, 60, 20)
    assert (default > 0).sum() >= 2, default
    stages = build_torch_stages(config, resnet, denoiser, TorchRunner(), SHAPE, 10, FastPath(pack_images=2))
    assert isinstance(stages.score.module.classifier.net, PackedCifarResNet)
    np.testing.assert_array_equal(MonteCarloPipeline(stages, config.sigma, seed=3).count(x, 0, 0, 60, 20), default)


def test_a_held_packed_stage_takes_another_classifiers_weights_like_a_fresh_build():
    """A table's model set: a later run's packed classifier (same architecture, other weights) reuses the held
    stage, its block-diagonal weights copied in, and scores as a fresh packed build of it does."""
    from diffsmooth.engine.runs.model_set import ModelSet
    first, second = randomized_bn_resnet("cifar_resnet20", seed=1), randomized_bn_resnet("cifar_resnet20", seed=2)
    models = ModelSet()
    backend = models.backend(TorchRunner())
    held = backend.stage(pack_classifier(first, 2), "classifier")
    again = backend.stage(pack_classifier(second, 2), "classifier")
    assert again is held and models.reuses == 1
    x = _images(6, seed=8)
    with torch.no_grad():
        fresh = second(x)
        assert float((fresh - first(x)).abs().max()) > 1e-2
        torch.testing.assert_close(held(x), fresh, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kwargs, message", [
    ({"pack_images": 3}, "one of 1, 2, 4"),
    ({"pack_images": True}, "one of 1, 2, 4"),
    ({"pack_images": 2, "fused_conv": True}, "pick one"),
    ({"pack_images": 2, "triton_conv": True}, "pick one"),
    ({"pack_images": 2, "backend": "onnxruntime"}, "torch backend"),
])
def test_pack_images_that_cannot_apply_is_refused_in_one_line(kwargs, message):
    with pytest.raises(UserError, match=message) as info:
        FastPath.resolve("cpu", **kwargs)
    assert "\n" not in str(info.value)


def test_pack_images_is_recorded_only_when_on_and_parses_as_a_variant():
    assert "pack_images" not in FastPath.resolve("cuda").as_dict()
    assert "pack_images" not in FastPath.resolve("cpu", pack_images=1, backend="onnxruntime").as_dict()
    on = FastPath.resolve("cpu", pack_images=4)
    assert on.as_dict()["pack_images"] == 4 and on.changes_arithmetic
    assert parse_variant("pack-images=2+freezing") == {"pack_images": 2, "inductor": ("freezing",)}
    for bad in ("pack-images=3", "pack-images=1", "pack-images=2+triton-conv"):
        with pytest.raises(UserError, match=re.escape(f"variant '{bad}'")):
            parse_variant(bad)
    with pytest.raises(UserError, match="`pack_images` is for single configurations"):
        RunRequest.parse("certify", out="x.tsv", pack_images=2, m=[3, 5])


def test_the_demo_rows_are_identical_with_packed_images(tmp_path):
    """The demo's ResNet-20 (one input channel) through the command line: the same rows, the option recorded."""
    base = ["certify", "--dataset", "embedded", "--method", "diffsmooth", "--sigma", "0.5", "--n0", "10", "--n", "50",
            "--max", "30", "--skip", "10", "--batch", "30", "--threads", "1", "--quiet"]
    invoke_ok([*base, "--out", tmp_path / "default.tsv"])
    invoke_ok([*base, "--pack-images", "2", "--validate-samples", "40", "--validate-images", "1",
               "--out", tmp_path / "packed.tsv"])
    default = rows_without_time(tmp_path / "default.tsv")
    assert len(default) == 3 and len({r["radius"] for r in default}) >= 2
    assert rows_without_time(tmp_path / "packed.tsv") == default
    assert json.loads((tmp_path / "packed.tsv.settings.json").read_text())["fast_path"]["pack_images"] == 2


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_a_compiled_channels_last_packed_stage_votes_like_eager():
    """As the CUDA fast path builds it (channels_last, torch.compile at one static shape), here with inductor's
    CPU backend: the reshapes and the dropped padding trace, and the votes equal the eager network's. On the
    depth-8 CIFAR ResNet (packing rewrites the stem and the first stage, which it has; its compile is a fraction
    of a ResNet-20's; test_the_packed_network_scores_like_the_network_for_any_batch covers depths 20 and 110)."""
    clf = prototype_classifier(RESNET8, 32)
    x = _images(9, seed=6)
    with torch.no_grad():
        expected = clf(x)
    stage = TorchRunner(compile=True, channels_last=True).stage(pack_classifier(clf, 2), "packed")
    got = stage(x)
    assert got.shape == (9, 10) and len(set(expected.argmax(1).tolist())) >= 3
    assert torch.equal(got.argmax(1), expected.argmax(1))
    assert float((got - expected).abs().max()) < 1e-4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_packed_resnet110_in_fp16_on_the_cuda_fast_path_votes_like_fp32():
    """As `--pack-images 2` runs on a GPU: channels_last, fp16 autocast, compiled, replayed from a CUDA graph, at
    the fast path's 10,000 classifier images per call (cuDNN picks its kernels for the packed shape); the votes
    agree with the unpacked network in fp32 (TF32 off) on >= 99.9% of images that spread over the classes."""
    clf = prototype_classifier("cifar_resnet110", 32)
    x = prototype_images(10_000, 32, 0.25, seed=7)
    with torch.no_grad():
        expected = torch.cat([clf(chunk) for chunk in x.split(1000)])
    backend = TorchRunner(device="cuda", precision="fp16", compile=True, cuda_graphs=True)
    stage = backend.stage(pack_classifier(clf, 2), "packed classifier")
    for _ in range(3):                                   # warm-up, then capture and replay
        got = stage(x.cuda()).float().cpu()
    assert len(set(expected.argmax(1).tolist())) >= 8
    agree = float((got.argmax(1) == expected.argmax(1)).float().mean())
    assert agree >= 0.999, f"vote agreement {agree:.4%} (max |logit diff| {float((got - expected).abs().max()):.3g})"

"""Architecture tests: official parameter names/shapes, forward shapes, numerics and ONNX-friendliness."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from stage_fixtures import randomized_bn_resnet

from diffsmooth.engine.errors import UserError
from diffsmooth.engine.models.resnet import (
    DATASET_STATS,
    DEFAULT_NORMALIZATION,
    InputCenterLayer,
    NormalizedClassifier,
    NormalizeLayer,
    build_classifier_net,
    normalization_layer,
)
from diffsmooth.engine.models.unet import (
    PRESETS,
    AttentionBlock,
    GroupNorm32,
    UNetConfig,
    UNetModel,
    qkv_attention_fused,
    qkv_attention_legacy,
    timestep_embedding,
    unet_config,
)

KEYS = Path(__file__).resolve().parents[2] / "data" / "keys"   # every key and shape of the official checkpoints


def _reference_entries(name: str) -> list:
    """[key, shape, dtype] of every tensor in the named official checkpoint, as its key list records."""
    return json.loads((KEYS / f"{name}.json").read_text())["entries"]


def _entries(state_dict, prefix: str = "") -> list:
    return [[prefix + k, list(v.shape), str(v.dtype).removeprefix("torch.")] for k, v in state_dict.items()]


def _tiny(**kw) -> UNetConfig:
    base = dict(
        image_size=32, in_channels=3, model_channels=32, num_res_blocks=1, attention_resolutions=(16, 8),
        channel_mult=(1, 2, 2), num_heads=2, learn_sigma=True,
    )
    base.update(kw)
    return UNetConfig(**base)


def _randomize(module: torch.nn.Module, seed: int = 0, std: float = 0.05) -> None:
    """Give every parameter random values (the zero-initialised output convs would hide bugs)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * std)


# --------------------------------------------------------------------------- official key lists


@pytest.mark.parametrize(
    "preset, keyfile, n_params",
    [("cifar10", "cifar10_uncond_50M_500K", 52_546_438), ("imagenet", "256x256_diffusion_uncond", 552_814_086)],
)
def test_unet_presets_match_official_state_dicts(preset, keyfile, n_params):
    with torch.device("meta"):
        model = UNetModel(PRESETS[preset])
    assert sum(p.numel() for p in model.parameters()) == n_params
    assert _entries(model.state_dict()) == _reference_entries(keyfile)


@pytest.mark.parametrize(
    "arch, keyfile, prefix, dataset, n_params",
    [
        ("cifar_resnet110", "cohen_cifar_resnet110", "", "cifar10", 1_730_714),
        ("cifar_resnet20", "cohen_cifar_resnet20", "", "cifar10", None),
        ("resnet50", "cohen_imagenet_resnet50", "1.module.", "imagenet", None),
    ],
)
def test_classifiers_match_cohen_state_dicts(arch, keyfile, prefix, dataset, n_params):
    net = build_classifier_net(arch)
    model = NormalizedClassifier(normalization_layer("normalize", dataset), net)
    got = _entries(model.state_dict()) if not prefix else _entries(net.state_dict(), prefix)
    assert got == _reference_entries(keyfile)
    if n_params is not None:
        assert sum(p.numel() for p in net.parameters()) == n_params


def test_imagenet32_resnet110_is_cifar_resnet110_with_1000_classes():
    a = _entries(build_classifier_net("imagenet32_resnet110").state_dict())
    b = _entries(build_classifier_net("cifar_resnet110", num_classes=1000).state_dict())
    assert a == b and ["fc.weight", [1000, 64], "float32"] in a


# --------------------------------------------------------------------------- UNet forward


@pytest.mark.parametrize(
    "learn_sigma, in_channels, size, updown",
    [(True, 3, 32, False), (False, 1, 32, False), (True, 1, 28, True), (False, 3, 28, False), (True, 3, 32, True)],
)
def test_tiny_unet_forward_shapes(learn_sigma, in_channels, size, updown):
    cfg = _tiny(learn_sigma=learn_sigma, in_channels=in_channels, resblock_updown=updown)
    assert cfg.out_channels == (2 * in_channels if learn_sigma else in_channels)
    model = UNetModel(cfg).eval()
    _randomize(model)
    x = torch.randn(2, in_channels, size, size)
    with torch.no_grad():
        out = model(x, torch.tensor([496.0, 143.25]))
    assert out.shape == (2, cfg.out_channels, size, size)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()


def test_unet_rejects_sizes_not_divisible_by_downsampling():
    model = UNetModel(_tiny(channel_mult=(1, 2, 2, 2))).eval()  # needs multiples of 8
    with torch.no_grad(), pytest.raises(UserError, match="multiple of 8"):
        model(torch.randn(1, 3, 28, 28), torch.tensor([1.0]))
    with torch.no_grad(), pytest.raises(UserError, match=r"\[B, 3, H, W\]"):
        model(torch.randn(1, 1, 32, 32), torch.tensor([1.0]))


def test_unet_timesteps_float_int_and_scalar_agree():
    model = UNetModel(_tiny()).eval()
    _randomize(model)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        a = model(x, torch.tensor([259, 259]))
        b = model(x, torch.tensor([259.0, 259.0]))
        c = model(x, 259)
        d = model(x, torch.tensor([259.5, 259.5]))
    assert torch.equal(a, b) and torch.equal(a, c)
    assert not torch.equal(a, d)  # fractional timesteps are not rounded


def test_unet_runs_cast_to_bfloat16():
    model = UNetModel(_tiny()).eval()
    _randomize(model)
    x, t = torch.randn(2, 3, 32, 32), torch.tensor([10.0, 700.0])
    with torch.no_grad():
        ref = model(x, t)
        out = model.to(torch.bfloat16)(x, t)
    assert out.dtype == torch.float32  # output follows the input dtype
    assert (out - ref).abs().max() < 0.05 * ref.abs().max()


def test_unet_dropout_only_in_train_mode():
    model = UNetModel(_tiny(dropout=0.5))
    _randomize(model)
    x, t = torch.randn(1, 3, 32, 32), torch.tensor([10.0])
    with torch.no_grad():
        model.eval()
        assert torch.equal(model(x, t), model(x, t))
        model.train()
        assert not torch.equal(model(x, t), model(x, t))


def test_imagenet_preset_layout_runs_at_224_style_sizes():
    # The 256 model runs on 224 crops (multiple of 32): check with the same flags at reduced width.
    cfg = replace(PRESETS["imagenet"], model_channels=32, num_head_channels=32)
    model = UNetModel(cfg).eval()
    with torch.no_grad():
        out = model(torch.randn(1, 3, 224, 224), torch.tensor([145]))
    assert out.shape == (1, 6, 224, 224)


def test_config_validation_and_presets():
    assert PRESETS["cifar10"].attention_ds == {2, 4}
    assert PRESETS["imagenet"].attention_ds == {8, 16, 32}
    assert PRESETS["demo"].out_channels == 1
    assert unet_config("cifar10", attention_resolutions="16,8") == PRESETS["cifar10"]
    assert unet_config("demo", dropout=0.0).dropout == 0.0
    with pytest.raises(UserError, match="unknown UNet preset"):
        unet_config("celeba")
    with pytest.raises(UserError, match="unknown UNet config key"):
        unet_config("cifar10", num_channels=64)
    with pytest.raises(UserError, match="needs"):
        unet_config(None, image_size=32)
    with pytest.raises(UserError, match="attention resolution"):
        _tiny(attention_resolutions=(2,))  # ds 16 does not exist with 3 levels
    with pytest.raises(UserError, match="multiple of 32"):
        _tiny(model_channels=48)
    with pytest.raises(UserError, match="heads"):
        _tiny(num_heads=3)


# --------------------------------------------------------------------------- numerics


def _reference_attention(qkv: torch.Tensor, heads: int) -> torch.Tensor:
    """Straightforward legacy-layout attention written with einsum (test oracle)."""
    b, width, t = qkv.shape
    ch = width // (3 * heads)
    q, k, v = qkv.reshape(b * heads, 3 * ch, t).split(ch, dim=1)
    w = torch.einsum("bct,bcs->bts", q, k) / math.sqrt(ch)
    w = torch.softmax(w.double(), dim=-1)
    return torch.einsum("bts,bcs->bct", w, v.double()).reshape(b, heads * ch, t)


@pytest.mark.parametrize("heads", [1, 4])
def test_attention_matches_einsum_reference(heads):
    torch.manual_seed(0)
    qkv = torch.randn(2, heads * 3 * 16, 64) * 2
    ours = qkv_attention_legacy(qkv, heads)
    assert ours.shape == (2, heads * 16, 64)
    torch.testing.assert_close(ours.double(), _reference_attention(qkv, heads), rtol=1e-5, atol=1e-5)
    assert torch.equal(ours, qkv_attention_legacy(qkv, heads, head_channels=16))


@pytest.mark.parametrize("heads", [1, 4])
def test_fused_attention_matches_einsum_reference(heads):
    torch.manual_seed(1)
    qkv = torch.randn(2, heads * 3 * 16, 64) * 2
    fused = qkv_attention_fused(qkv.transpose(1, 2), heads, 16).transpose(1, 2)
    torch.testing.assert_close(fused.double(), _reference_attention(qkv, heads), rtol=1e-5, atol=1e-5)


def test_fused_attention_hands_sdpa_unit_stride_heads(monkeypatch):
    """CUDA's flash / memory-efficient kernels take q, k, v only with stride 1 in the last
    dimension (else SDPA silently runs its unfused maths): check what the block passes."""
    import diffsmooth.engine.models.unet as unet_module
    seen = []
    real = unet_module.F.scaled_dot_product_attention

    def spy(q, k, v, *args, **kw):
        seen.append([t.stride(-1) for t in (q, k, v)])
        return real(q, k, v, *args, **kw)

    monkeypatch.setattr(unet_module.F, "scaled_dot_product_attention", spy)
    block = AttentionBlock(64, 4)
    block.fused = True
    for layout in (torch.contiguous_format, torch.channels_last):
        block(torch.randn(2, 64, 4, 4).contiguous(memory_format=layout))
    assert seen == [[1, 1, 1], [1, 1, 1]]


@pytest.mark.parametrize("preset,overrides", [("cifar10", dict(model_channels=32, num_res_blocks=1)),
                                              ("imagenet", dict(model_channels=32, num_head_channels=32,
                                                                num_res_blocks=1))])
def test_fused_attention_copy_shares_weights_and_matches(preset, overrides):
    """with_fused_attention: same parameters (not copies), the original untouched, same outputs."""
    torch.manual_seed(0)
    model = UNetModel(replace(PRESETS[preset], **overrides)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.05)              # proj_out is zero-initialised: make attention matter
    fused = model.with_fused_attention()
    assert [id(p) for p in fused.parameters()] == [id(p) for p in model.parameters()]
    flags = [(a.fused, b.fused) for a, b in zip(model.modules(), fused.modules()) if isinstance(a, AttentionBlock)]
    assert flags and all(f == (False, True) for f in flags)
    size = 32 if preset == "cifar10" else 64
    x, t = torch.randn(2, 3, size, size), torch.tensor([100.0, 300.0])
    with torch.no_grad():
        reference, ours = model(x, t), fused(x, t)
        without_attention = model.with_fused_attention()
        for block in without_attention.modules():
            if isinstance(block, AttentionBlock):
                block.forward = lambda h: h            # the oracle: attention changes the output
        assert (without_attention(x, t) - reference).abs().max() > 1e-4      # 10x the tolerance below
    torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-5)


def test_attention_softmax_in_float32_for_half_inputs():
    torch.manual_seed(0)
    qkv = (torch.randn(1, 3 * 32, 16) * 3).to(torch.bfloat16)
    out = qkv_attention_legacy(qkv, 1)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), _reference_attention(qkv.double(), 1), rtol=0.05, atol=0.05)


def test_timestep_embedding_cos_then_sin():
    t = torch.tensor([0.0, 496.0, 143.25])
    emb = timestep_embedding(t, 8)
    freqs = torch.tensor([10000 ** (-i / 4) for i in range(4)], dtype=torch.float64)
    args = t.double()[:, None] * freqs[None]
    torch.testing.assert_close(emb.double(), torch.cat([args.cos(), args.sin()], 1), rtol=1e-5, atol=1e-4)
    assert emb.dtype == torch.float32 and timestep_embedding(t, 7).shape == (3, 7)


def test_groupnorm_runs_in_float32_and_casts_back():
    norm = GroupNorm32(64)
    x = (torch.randn(2, 64, 4, 4) * 100 + 1000).to(torch.bfloat16)
    out = norm(x)
    assert out.dtype == torch.bfloat16
    expected = torch.nn.functional.group_norm(x.float(), 32, norm.weight, norm.bias, norm.eps).to(torch.bfloat16)
    assert torch.equal(out, expected)


# --------------------------------------------------------------------------- ONNX export


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::torch.jit.TracerWarning")
def test_tiny_unet_exports_to_onnx_without_einsum(tmp_path):
    onnx = pytest.importorskip("onnx")
    model = UNetModel(_tiny(resblock_updown=True)).eval()
    _randomize(model)
    x, t = torch.randn(2, 3, 32, 32), torch.tensor([496.0, 3.25])
    path = tmp_path / "unet.onnx"
    torch.onnx.export(
        model, (x, t), str(path), opset_version=17, dynamo=False,
        input_names=["x", "t"], output_names=["eps"], dynamic_axes={"x": {0: "b"}, "t": {0: "b"}, "eps": {0: "b"}},
    )
    graph = onnx.load(str(path)).graph
    ops = {n.op_type for n in graph.node}
    assert "Einsum" not in ops and "MatMul" in ops
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    xb, tb = torch.randn(3, 3, 32, 32), torch.tensor([1.0, 100.5, 999.0])
    got = sess.run(None, {"x": xb.numpy(), "t": tb.numpy()})[0]
    with torch.no_grad():
        want = model(xb, tb).numpy()
    assert abs(got - want).max() < 1e-4


# --------------------------------------------------------------------------- classifiers


def test_build_classifier_net_defaults_and_errors():
    assert build_classifier_net("cifar_resnet20").fc.out_features == 10
    assert build_classifier_net("resnet50").fc.out_features == 1000
    assert build_classifier_net("imagenet32_resnet110").fc.out_features == 1000
    with pytest.raises(UserError, match="cifar_resnet110"):
        build_classifier_net("wide_resnet")


@pytest.mark.parametrize("size, in_channels", [(32, 3), (28, 1), (40, 3)])
def test_cifar_resnet_any_size(size, in_channels):
    net = build_classifier_net("cifar_resnet20", num_classes=7, in_channels=in_channels).eval()
    with torch.no_grad():
        assert net(torch.rand(2, in_channels, size, size)).shape == (2, 7)


def test_global_pool_equals_avgpool8_at_32():
    net = build_classifier_net("cifar_resnet20").eval()
    feats = torch.randn(3, 64, 8, 8)
    assert torch.equal(net.avgpool(feats), torch.nn.AvgPool2d(8)(feats))


def test_resnet50_forward_small_input():
    net = build_classifier_net("resnet50", num_classes=5).eval()
    with torch.no_grad():
        assert net(torch.rand(1, 3, 64, 64)).shape == (1, 5)


def test_normalization_layers():
    x = torch.rand(2, 3, 4, 4)
    mean, std = DATASET_STATS["cifar10"]
    m, s = torch.tensor(mean).view(1, 3, 1, 1), torch.tensor(std).view(1, 3, 1, 1)
    norm = normalization_layer("normalize", "cifar10")
    center = normalization_layer("center", "cifar10")
    assert isinstance(norm, NormalizeLayer) and isinstance(center, InputCenterLayer)
    assert torch.equal(norm(x), (x - m) / s)
    assert torch.equal(center(x), x - m)
    assert torch.equal(normalization_layer("none", None)(x), x)
    assert dict(norm.state_dict()) == {} and dict(center.state_dict()) == {}
    assert DATASET_STATS["fashion-mnist"] == ((0.2860,), (0.3530,))
    assert set(DEFAULT_NORMALIZATION) == set(DATASET_STATS)
    with pytest.raises(UserError, match="normalize, center, none"):
        normalization_layer("standardize", "cifar10")
    with pytest.raises(UserError, match="dataset"):
        normalization_layer("normalize", "svhn")


def test_normalized_classifier_is_sequential_norm_then_net():
    net = build_classifier_net("cifar_resnet20").eval()
    model = NormalizedClassifier(normalization_layer("normalize", "cifar10"), net).eval()
    assert model.net is net and isinstance(model.normalization, NormalizeLayer)
    assert all(k.startswith("1.") for k in model.state_dict())
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(model(x), net(model.normalization(x)))


# --------------------------------------------------------------------------- folded classifiers


@pytest.mark.parametrize("arch,size", [("cifar_resnet20", 32), ("resnet50", 64)])
def test_folded_classifier_equals_the_unfolded_one(arch, size):
    """BatchNorm folded into the convolutions, conv + add + ReLU as one op: the same logits (fp32, CPU)."""
    from diffsmooth.engine.models.folded_resnet import FoldedConv, fold_classifier
    clf = randomized_bn_resnet(arch)
    folded = fold_classifier(clf)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in folded.modules())
    convs = [m for m in folded.modules() if isinstance(m, FoldedConv)]
    assert len(convs) == sum(isinstance(m, torch.nn.Conv2d) for m in clf.modules())
    x = torch.rand(6, 3, size, size)
    with torch.no_grad():
        expected, got = clf(x), folded(x)
        assert float(expected.std(dim=0).max()) > 0.1                # the check is not on constant logits
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
        broken = fold_classifier(clf)
        broken.net.blocks[0].convs[-1].relu = False                 # the oracle notices a lost ReLU
        assert (broken(x) - expected).abs().max() > 1e-3
    half = fold_classifier(clf, torch.bfloat16)
    assert half.net.stem.weight.dtype == torch.bfloat16
    with torch.no_grad():
        torch.testing.assert_close(half(x).float(), expected, rtol=0.1, atol=0.3)


def test_fold_leaves_other_classifiers_alone():
    from diffsmooth.engine.models.folded_resnet import fold_classifier
    assert fold_classifier(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 3))) is None
    other = NormalizedClassifier(torch.nn.Identity(), torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 3)))
    assert fold_classifier(other) is None


@pytest.mark.parametrize("channels", [1, 3])
def test_folded_net_feeds_every_convolution_after_the_stem_nhwc(channels, monkeypatch):
    """cuDNN fuses only NHWC convolutions. A one-channel image is NCHW and NHWC at once, so the stem's
    output came back NCHW and nothing was fused on the Fashion-MNIST demo (caught on an H200)."""
    from diffsmooth.engine.models import folded_resnet
    folded = folded_resnet.fold_classifier(randomized_bn_resnet("cifar_resnet20", channels=channels))
    folded = folded.to(memory_format=torch.channels_last)            # as the fast path's stage does
    folded.net.nhwc = True                                           # what CUDA does, here on the CPU
    fusable, op = [], folded_resnet.conv_bias_add_relu

    def spy(x, weight, *rest):
        fusable.append(folded_resnet._fusable(x, weight))
        return op(x, weight, *rest)
    monkeypatch.setattr(folded_resnet, "conv_bias_add_relu", spy)
    x = torch.rand(2, channels, 16, 16)
    with torch.no_grad():
        folded(x)
    assert len(fusable) == sum(isinstance(m, folded_resnet.FoldedConv) for m in folded.modules())
    assert fusable[0] is False and all(fusable[1:]), fusable        # the stem (channels % 8) only


def test_folded_op_compiles_with_channels_last_on_cpu():
    """The custom op's fake implementation lets torch.compile trace it; layout and values kept."""
    from diffsmooth.engine.models.folded_resnet import fold_classifier
    clf = randomized_bn_resnet("cifar_resnet20", seed=1)
    folded = fold_classifier(clf).to(memory_format=torch.channels_last)
    compiled = torch.compile(folded, dynamic=False)
    x = torch.rand(4, 3, 16, 16).contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), clf(x), rtol=1e-4, atol=1e-4)

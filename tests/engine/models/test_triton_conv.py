"""The Triton implicit-GEMM convolution (engine/models/triton_conv.py).

The kernel runs here on the CPU under Triton's interpreter. TRITON_INTERPRET=1 must be set before triton
is imported, so those checks run in one subprocess: this file run as a script (`python test_triton_conv.py
interpret`), which prints its measurements as JSON; the tests below assert on them. Checked there: every
convolution of the CIFAR ResNets (the RGB and one-channel stems, 3x3 stride 1 and 2, the 1x1 stride-2
shortcut; with and without residual and ReLU; 16/32/64 channels and counts that are not multiples of the
tile) against conv2d + add + relu in float64 of the same inputs, in fp32, fp16 and bf16, NHWC and NCHW;
every autotune config; a whole folded + tritonized ResNet-20; the fallback of calls it cannot take.

In this process (no interpreter): the op's reference path, the fallback reasons, tritonize's copy, and
torch.compile tracing the op (fake implementation). The kernel is also compiled ahead of time for
Hopper (sm_90) and Ampere (sm_80) with triton's own ptxas, which needs no GPU. The `gpu` tests run the
kernel on CUDA (ResNet-110 in fp16 against the folded fp32 reference; compiled + CUDA-graph replay).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from stage_fixtures import RESNET8, cifar_net, randomize_batch_norm

from diffsmooth.engine.models import folded_resnet, triton_conv
from diffsmooth.engine.models.folded_resnet import FoldedConv, _reference, fold_classifier
from diffsmooth.engine.models.resnet import BasicBlock, NormalizedClassifier, normalization_layer

HERE = Path(__file__).resolve()
ROOT = HERE.parents[3]
CL = torch.channels_last
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# max |kernel - float64 reference of the same inputs| allowed, relative to (1 + max |reference|): fp32
# accumulation error, plus the output's rounding in fp16 (2**-11) and bf16 (2**-8).
TOLERANCE = {"float32": 1e-5, "float16": 1.5e-3, "bfloat16": 1e-2}

needs_triton = pytest.mark.skipif(triton_conv.triton is None,
                                  reason=f"triton is not importable ({triton_conv._TRITON_ERROR})")

# (name, c_in, c_out, kernel, stride, residual, relu, dtype, size, layout)
CASES = [
    ("RGB stem 3->16 3x3 s1", 3, 16, 3, 1, False, True, "float32", 8, "nhwc"),
    ("one-channel stem 1->16", 1, 16, 3, 1, False, True, "float32", 8, "nhwc"),
    ("3x3 s1 16->16 +res relu", 16, 16, 3, 1, True, True, "float32", 8, "nhwc"),
    ("3x3 s1 32->32 +res relu", 32, 32, 3, 1, True, True, "float32", 8, "nhwc"),
    ("3x3 s1 64->64 +res relu", 64, 64, 3, 1, True, True, "float32", 8, "nhwc"),
    ("3x3 s1 16->16 relu, no res", 16, 16, 3, 1, False, True, "float32", 8, "nhwc"),
    ("3x3 s1 32->32 +res, no relu", 32, 32, 3, 1, True, False, "float32", 8, "nhwc"),
    ("3x3 s2 16->32 relu", 16, 32, 3, 2, False, True, "float32", 8, "nhwc"),
    ("3x3 s2 32->64 relu", 32, 64, 3, 2, False, True, "float32", 8, "nhwc"),
    ("3x3 s2 16->32 odd 9x9 image", 16, 32, 3, 2, False, True, "float32", 9, "nhwc"),
    ("1x1 s2 16->32 shortcut", 16, 32, 1, 2, False, False, "float32", 8, "nhwc"),
    ("1x1 s2 32->64 shortcut", 32, 64, 1, 2, False, False, "float32", 8, "nhwc"),
    ("3x3 s1 20->24 +res (not tile multiples)", 20, 24, 3, 1, True, False, "float32", 8, "nhwc"),
    ("3x3 s1 24->80 relu (two channel tiles)", 24, 80, 3, 1, False, True, "float32", 6, "nhwc"),
    ("3x3 s1 16->16 +res relu, NCHW", 16, 16, 3, 1, True, True, "float32", 8, "nchw"),
    ("RGB stem 3->16, NCHW", 3, 16, 3, 1, False, True, "float32", 8, "nchw"),
    ("fp16 RGB stem", 3, 16, 3, 1, False, True, "float16", 8, "nhwc"),
    ("fp16 3x3 s1 16->16 +res relu", 16, 16, 3, 1, True, True, "float16", 8, "nhwc"),
    ("fp16 3x3 s1 64->64 +res relu", 64, 64, 3, 1, True, True, "float16", 8, "nhwc"),
    ("fp16 3x3 s2 32->64 relu", 32, 64, 3, 2, False, True, "float16", 8, "nhwc"),
    ("fp16 1x1 s2 32->64 shortcut", 32, 64, 1, 2, False, False, "float16", 8, "nhwc"),
    ("fp16 3x3 s1 20->24 +res", 20, 24, 3, 1, True, False, "float16", 8, "nhwc"),
    # The interpreter's bf16 dot is wrong (numpy has no bf16), so there it multiplies in fp32: this
    # checks bf16 loads, epilogue and store, not the bf16 tensor-core product.
    ("bf16 3x3 s1 32->32 +res relu", 32, 32, 3, 1, True, True, "bfloat16", 8, "nhwc"),
    ("bf16 1x1 s2 16->32 shortcut", 16, 32, 1, 2, False, False, "bfloat16", 8, "nhwc"),
]
# Cases run with every autotune config (each config's tiles, masks and K slices).
CONFIG_CASES = ["RGB stem 3->16 3x3 s1", "3x3 s1 64->64 +res relu", "3x3 s1 20->24 +res (not tile multiples)",
                "1x1 s2 32->64 shortcut"]


def _case_tensors(case, seed=0):
    """(x, weight, bias, residual, stride, padding, relu) of a case, values O(1) so a lost term shows."""
    _, c_in, c_out, k, stride, residual, relu, dtype, size, layout = case
    g = torch.Generator().manual_seed(seed)
    dt = DTYPES[dtype]
    x = torch.randn(2, c_in, size, size, generator=g).to(dt)
    if layout == "nhwc":
        x = x.contiguous(memory_format=CL)
    weight = (torch.randn(c_out, c_in, k, k, generator=g) / (c_in * k * k) ** 0.5).to(dt)
    weight = weight.permute(2, 3, 1, 0).contiguous().permute(3, 2, 0, 1)     # as TritonConv stores it
    bias = torch.randn(c_out, generator=g).to(dt)
    out = (size + 2 * (k // 2) - k) // stride + 1
    res = torch.randn(2, c_out, out, out, generator=g).to(dt) if residual else None
    if res is not None and layout == "nhwc":
        res = res.contiguous(memory_format=CL)
    return x, weight, bias, res, stride, k // 2, relu


def _exact(x, weight, bias, res, stride, padding, relu):
    """conv2d + bias + residual + relu in float64 of the very same (rounded) inputs."""
    return _reference(x.double(), weight.double(), bias.double(), None if res is None else res.double(),
                      stride, padding, relu)


# Fused BasicBlocks: (name, channels, size, dtype, batch, config (None: the op's own), layout)
BLOCK_CASES = [
    ("block 16ch 8x8", 16, 8, "float32", 2, None, "nhwc"),
    ("block 20ch 10x10, 8x8 tiles over the border, 4 tiles on 3 programs", 20, 10, "float32", 1, (8, 64, 16, 4, 2),
     "nhwc"),
    ("block 16ch 8x8 NCHW", 16, 8, "float32", 1, None, "nchw"),
    ("block 64ch 8x8 fp16", 64, 8, "float16", 1, None, "nhwc"),
    ("block 32ch 9x9 bf16", 32, 9, "bfloat16", 1, None, "nhwc"),
]


def _block_tensors(c, size, dtype, batch, layout="nhwc", seed=0):
    g = torch.Generator().manual_seed(seed)
    dt = DTYPES[dtype]
    x = torch.randn(batch, c, size, size, generator=g).to(dt)
    if layout == "nhwc":
        x = x.contiguous(memory_format=CL)
    ws = [(torch.randn(c, c, 3, 3, generator=g) / (9 * c) ** 0.5).to(dt).permute(2, 3, 1, 0).contiguous()
          .permute(3, 2, 0, 1) for _ in range(2)]
    return x, ws[0], torch.randn(c, generator=g).to(dt), ws[1], torch.randn(c, generator=g).to(dt)


def _block_exact(x, w1, b1, w2, b2):
    """The two-convolution path in float64, h rounded to the activation dtype as the kernel stores it."""
    h = _reference(x.double(), w1.double(), b1.double(), None, 1, 1, True).to(x.dtype).double()
    return _reference(h, w2.double(), b2.double(), x.double(), 1, 1, True)


# ------------------------------------------------------------------ models whose votes spread


def prototype_images(n, size, noise, seed, device="cpu"):
    """n noisy images around 10 smooth prototypes (a colour and a gradient each), image i around prototype
    i % 10: the stand-in for the classifier's noisy inputs in local smoothing."""
    g = torch.Generator().manual_seed(1234)
    ramp = torch.linspace(-1, 1, size)
    colour = torch.rand(10, 3, 1, 1, generator=g)
    slope = 0.5 * torch.randn(10, 3, 2, 1, 1, generator=g)
    protos = colour + slope[:, :, 0] * ramp[None, None, :, None] + slope[:, :, 1] * ramp[None, None, None, :]
    noise_g = torch.Generator().manual_seed(seed)
    x = protos[torch.arange(n) % 10] + noise * torch.randn(n, 3, size, size, generator=noise_g)
    return x.to(device)


def prototype_classifier(arch, size, residual_scale=0.5, device="cpu"):
    """A random ResNet (an architecture name, or stage_fixtures.RESNET8) with randomised BatchNorm statistics
    (every folded term matters) whose last layer is the nearest-centroid rule over the prototypes' features, so
    votes spread over the 10 classes with margins that fp16 keeps (the residual branches scaled by
    `residual_scale` keep a deep random net's features apart). Eval mode, fp32, on `device`."""
    torch.manual_seed(0)
    net = randomize_batch_norm(cifar_net(arch))
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, BasicBlock):
                m.bn2.weight.mul_(residual_scale)
    clf = NormalizedClassifier(normalization_layer("normalize", "cifar10"), net).eval().to(device)
    calib = prototype_images(100, size, 0.25, seed=99, device=device)
    features = []
    hook = net.fc.register_forward_hook(lambda module, inputs, output: features.append(inputs[0]))
    with torch.no_grad():
        clf(calib)
        hook.remove()
        labels = torch.arange(len(calib), device=device) % 10
        centroids = torch.stack([features[0][labels == c].mean(0) for c in range(10)])
        net.fc.weight.copy_(2 * centroids)
        net.fc.bias.copy_(-(centroids * centroids).sum(1))
    return clf


# ------------------------------------------------------------------ the interpreter subprocess


def _interpreted_measurements() -> dict:
    """Run in a subprocess with TRITON_INTERPRET=1: everything the interpreter tests assert on."""
    from diffsmooth.engine.models.triton_conv import (
        AUTOTUNE_CONFIGS,
        TRITON_CALLS,
        TRITON_FALLBACKS,
        _launch,
        triton_conv_unavailable,
        tritonize,
    )
    out = {"unavailable_cpu": triton_conv_unavailable("cpu"), "interpreted": triton_conv._INTERPRETED,
           "cases": {}, "configs": {}, "fallback": {}}
    op = torch.ops.diffsmooth.triton_conv_bias_add_relu
    for case in CASES:
        args = _case_tensors(case)
        before = TRITON_CALLS["count"]
        got = op(*args)
        exact = _exact(*args)
        out["cases"][case[0]] = {
            "diff": float((got.double() - exact).abs().max()), "scale": float(exact.abs().max()),
            "dtype": str(got.dtype).replace("torch.", ""), "shape": list(got.shape),
            "expected_shape": list(exact.shape),
            "nhwc": bool(got.is_contiguous(memory_format=CL)), "nchw": bool(got.is_contiguous()),
            "input_nhwc_only": bool(args[0].is_contiguous(memory_format=CL) and not args[0].is_contiguous()),
            "calls": TRITON_CALLS["count"] - before, "negative": bool((got < 0).any()),
        }
    for name in CONFIG_CASES:
        case = next(c for c in CASES if c[0] == name)
        args = _case_tensors(case, seed=1)
        exact = _exact(*args)
        for config in AUTOTUNE_CONFIGS:
            got = _launch(*args, config=config)
            out["configs"][f"{name} {config}"] = {"diff": float((got.double() - exact).abs().max()),
                                                  "scale": float(exact.abs().max()), "dtype": case[7]}
    # Calls the kernel does not take: a 9x9 kernel and float64; both give the reference's values.
    for label, (x, w) in {"9x9 kernel": (torch.randn(1, 4, 12, 12), torch.randn(8, 4, 9, 9)),
                          "float64": (torch.randn(1, 16, 8, 8).double(), torch.randn(16, 16, 3, 3).double())}.items():
        b = torch.randn(w.shape[0], dtype=w.dtype)
        before, reasons_before = TRITON_CALLS["count"], dict(TRITON_FALLBACKS)
        got = op(x, w, b, None, 1, w.shape[-1] // 2, True)
        new = {r: n - reasons_before.get(r, 0) for r, n in TRITON_FALLBACKS.items() if n != reasons_before.get(r, 0)}
        out["fallback"][label] = {"calls": TRITON_CALLS["count"] - before, "reasons": new,
                                  "diff": float((got - _reference(x, w, b, None, 1, w.shape[-1] // 2, True)).abs().max())}
    # A whole ResNet, folded and tritonized, against the unfolded model (fp32) and in fp16: the depth-8 CIFAR ResNet
    # (every kind of convolution a ResNet-20 has; test_every_block_config_and_a_fused_resnet20 runs a ResNet-20),
    # 6 images (the interpreter's cost is per image).
    clf = prototype_classifier(RESNET8, 8)
    x = prototype_images(6, 8, 0.25, seed=5)
    with torch.no_grad():
        expected = clf(x)
    net = {"expected_argmax": expected.argmax(1).tolist(), "scale": float(expected.abs().max())}
    for dtype in ("float32", "float16"):
        folded = fold_classifier(clf, DTYPES[dtype])
        folded.net.nhwc = True                                 # NHWC as on CUDA
        convs = sum(isinstance(m, FoldedConv) for m in folded.modules())
        fast = tritonize(folded)
        before = TRITON_CALLS["count"]
        started = time.perf_counter()
        with torch.no_grad():
            got = fast(x).float()
        net[dtype] = {"diff": float((got - expected).abs().max()), "argmax": got.argmax(1).tolist(),
                      "calls": TRITON_CALLS["count"] - before, "convs": convs,
                      "seconds": time.perf_counter() - started}
    out["resnet"] = net
    out["blocks"] = {}
    block_op = torch.ops.diffsmooth.triton_basic_block
    for name, c, size, dtype, batch, config, layout in BLOCK_CASES:
        args = _block_tensors(c, size, dtype, batch, layout)
        before = triton_conv.TRITON_BLOCK_CALLS["count"]
        got = block_op(*args) if config is None else triton_conv._launch_block(*args, config=config)
        exact = _block_exact(*args)
        out["blocks"][name] = {"diff": float((got.double() - exact).abs().max()), "scale": float(exact.abs().max()),
                               "dtype": str(got.dtype).replace("torch.", ""), "calls": triton_conv.TRITON_BLOCK_CALLS[
                                   "count"] - before, "same_layout": bool(got.stride() == args[0].stride())}
    args = _block_tensors(80, 6, "float32", 1)
    before, reasons_before = triton_conv.TRITON_BLOCK_CALLS["count"], dict(TRITON_FALLBACKS)
    got = block_op(*args)
    out["block_fallback"] = {"calls": triton_conv.TRITON_BLOCK_CALLS["count"] - before,
                             "reasons": [r for r, k in TRITON_FALLBACKS.items() if k != reasons_before.get(r, 0)],
                             "diff": float((got - triton_conv._block_reference(*args)).abs().max())}
    return out


def _interpreted_slow_measurements() -> dict:
    """The slower interpreter checks: every fused-block config, a ResNet-20 with fused blocks."""
    from diffsmooth.engine.models.triton_conv import BLOCK_CONFIGS, TRITON_BLOCK_CALLS, TRITON_CALLS, tritonize
    out = {"configs": {}}
    args = _block_tensors(16, 12, "float32", 1, seed=2)
    exact = _block_exact(*args)
    for config in BLOCK_CONFIGS:
        got = triton_conv._launch_block(*args, config=config)
        out["configs"][str(config)] = float((got.double() - exact).abs().max()) / (1 + float(exact.abs().max()))
    clf = prototype_classifier("cifar_resnet20", 8)
    x = prototype_images(4, 8, 0.25, seed=5)     # 4 images, 4 classes: a block's cost is per tile (image) here
    with torch.no_grad():
        expected = clf(x)
    folded = fold_classifier(clf)
    folded.net.nhwc = True
    fast = tritonize(folded, fuse_blocks=True)
    blocks, convs = TRITON_BLOCK_CALLS["count"], TRITON_CALLS["count"]
    with torch.no_grad():
        got = fast(x)
    out["resnet20"] = {"diff": float((got - expected).abs().max()), "scale": float(expected.abs().max()),
                       "argmax": got.argmax(1).tolist(), "expected_argmax": expected.argmax(1).tolist(),
                       "block_calls": TRITON_BLOCK_CALLS["count"] - blocks, "conv_calls": TRITON_CALLS["count"] - convs}
    return out


def _run_interpreter(mode: str) -> dict:
    """This file as a script under TRITON_INTERPRET=1; its JSON result line."""
    if triton_conv.triton is None:
        pytest.skip(f"triton is not importable ({triton_conv._TRITON_ERROR})")
    path = os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path, "TRITON_DEFAULT_FP_FUSION": "1"}
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, str(HERE), mode], capture_output=True, text=True, timeout=900,
                          env=env, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))
    result = json.loads(line[len("RESULT "):])
    result["wall_s"] = time.perf_counter() - started        # (shown by a failing test's repr)
    return result


@pytest.fixture(scope="module")
def interpreted():
    """The subprocess's measurements (one process: importing torch and triton dominates its time)."""
    return _run_interpreter("interpret")


def test_interpreter_runs_the_kernel_itself(interpreted):
    assert interpreted["interpreted"] and interpreted["unavailable_cpu"] is None


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_every_resnet_convolution_equals_conv2d_add_relu(interpreted, case):
    """Each shape class through the op (the interpreter runs the Triton kernel) against float64 conv2d +
    bias + residual + relu of the same inputs; output dtype, shape and layout (NHWC in, NHWC out) as the
    fake implementation promises."""
    r = interpreted["cases"][case[0]]
    assert r["calls"] == 1, "the op did not launch the Triton kernel"
    assert r["shape"] == r["expected_shape"] and r["dtype"] == case[7]
    # NHWC in, NHWC out; a one-channel image is NCHW and NHWC at once, and comes back NCHW (as folded_resnet's op)
    assert r["input_nhwc_only"] == (case[9] == "nhwc" and case[1] > 1)
    assert r["nhwc"] if r["input_nhwc_only"] else r["nchw"], "the output's layout is not the input's"
    assert r["diff"] <= TOLERANCE[case[7]] * (1 + r["scale"]), f"max |diff| {r['diff']:.3g} (scale {r['scale']:.3g})"
    assert r["scale"] > 1.0 and r["negative"] == (not case[6]), "a case whose check could not see a lost term"


def test_every_autotune_config_computes_the_same(interpreted):
    assert len(interpreted["configs"]) == len(CONFIG_CASES) * len(triton_conv.AUTOTUNE_CONFIGS)
    bad = {k: v for k, v in interpreted["configs"].items() if v["diff"] > TOLERANCE[v["dtype"]] * (1 + v["scale"])}
    assert not bad, bad


def test_calls_the_kernel_cannot_take_fall_back_with_a_reason(interpreted):
    fallback = interpreted["fallback"]
    assert fallback["9x9 kernel"]["calls"] == 0 and fallback["float64"]["calls"] == 0
    assert any("9" in r and "larger than" in r for r in fallback["9x9 kernel"]["reasons"]), fallback
    assert any("float64" in r for r in fallback["float64"]["reasons"]), fallback
    assert fallback["9x9 kernel"]["diff"] == 0 and fallback["float64"]["diff"] == 0


def test_tritonized_resnet_scores_like_the_unfolded_model(interpreted):
    """fold_classifier + tritonize on a depth-8 CIFAR ResNet with randomised BatchNorm statistics: every
    convolution (the stem, 3x3 stride 1 and 2, the 1x1 stride-2 shortcuts) reaches the kernel; the logits are the
    unfolded model's (fp32 tight, fp16 to its rounding) and the votes are the same, on images whose votes spread
    over the classes."""
    net = interpreted["resnet"]
    assert len(set(net["expected_argmax"])) >= 4, net["expected_argmax"]     # no constant output passes
    fp32, fp16 = net["float32"], net["float16"]
    assert fp32["calls"] == fp32["convs"] == 9 and fp16["calls"] == 9
    assert fp32["diff"] <= 1e-4 * (1 + net["scale"]), fp32["diff"]
    assert fp32["argmax"] == net["expected_argmax"]
    assert fp16["diff"] <= 2e-2 * (1 + net["scale"]), fp16["diff"]
    assert fp16["argmax"] == net["expected_argmax"]


@pytest.mark.parametrize("case", BLOCK_CASES, ids=[c[0] for c in BLOCK_CASES])
def test_the_fused_basic_block_equals_its_two_convolutions(interpreted, case):
    """relu(conv2(relu(conv1(x) + b1)) + b2 + x) in one kernel (halo recomputed, h kept in the program's
    scratch slot) against the two-convolution path in float64, h rounded to the activation dtype; tiles
    crossing the image border, several tiles per program, NCHW input, fp16 and bf16."""
    r = interpreted["blocks"][case[0]]
    assert r["calls"] == 1 and r["dtype"] == case[3] and r["same_layout"]
    assert r["diff"] <= TOLERANCE[case[3]] * (1 + r["scale"]), f"max |diff| {r['diff']:.3g} (scale {r['scale']:.3g})"
    assert r["scale"] > 1.0


def test_a_block_the_fused_kernel_cannot_take_falls_back(interpreted):
    fallback = interpreted["block_fallback"]
    assert fallback["calls"] == 0 and fallback["diff"] == 0
    assert any("80 channels" in r for r in fallback["reasons"]), fallback


@pytest.mark.slow
def test_every_block_config_and_a_fused_resnet20():
    """Each fused-block config on a 12x12 image (one to four tiles, some over the border), and a ResNet-20
    whose seven stride-1 blocks run fused (the rest per convolution) on four images of four classes (four
    tiles on three programs): the unfolded model's logits and votes."""
    result = _run_interpreter("interpret-slow")
    assert len(result["configs"]) == len(triton_conv.BLOCK_CONFIGS)
    assert all(d <= TOLERANCE["float32"] for d in result["configs"].values()), result["configs"]
    net = result["resnet20"]
    assert net["block_calls"] == 7 and net["conv_calls"] == 7, net
    assert len(set(net["expected_argmax"])) == len(net["expected_argmax"]) == 4
    assert net["argmax"] == net["expected_argmax"]
    assert net["diff"] <= 1e-4 * (1 + net["scale"]), net["diff"]


# ------------------------------------------------------------------ in this process (no interpreter)


def test_availability_and_the_cpu_op_without_the_interpreter():
    """Without TRITON_INTERPRET the CPU op is the reference maths and never launches the kernel."""
    if triton_conv._INTERPRETED:
        pytest.skip("this process runs under TRITON_INTERPRET")
    reason = triton_conv.triton_conv_unavailable("cpu")
    assert reason and "\n" not in reason
    if triton_conv.triton is not None:
        assert "CUDA" in reason and "TRITON_INTERPRET" in reason
    args = _case_tensors(CASES[2])
    before = triton_conv.TRITON_CALLS["count"]
    got = triton_conv.triton_conv_bias_add_relu(*args)
    assert triton_conv.TRITON_CALLS["count"] == before
    torch.testing.assert_close(got, _reference(*args), rtol=0, atol=0)
    assert got.is_contiguous(memory_format=CL)


def test_unsupported_reason_takes_every_resnet_call_and_names_what_it_refuses():
    for case in CASES:
        x, w, b, r, s, p, _ = _case_tensors(case)
        assert triton_conv.unsupported_reason(x, w, b, r, s, p) is None, case[0]
    x, w, b, r, s, p, _ = _case_tensors(CASES[2])
    refused = {
        "float64": (x.double(), w.double(), b.double(), None, s, p),
        "weight dtype": (x, w.half(), b, None, s, p),
        "larger than": (torch.randn(1, 16, 12, 12), torch.randn(16, 16, 9, 9), b, None, 1, 4),
        "input channels": (x, torch.randn(16, 8, 3, 3), b, None, s, p),           # a grouped convolution
        "residual shape": (x, w, b, torch.randn(2, 16, 4, 4), s, p),
        "not a 2-D": (torch.randn(2, 16, 8), w, b, None, s, p),
        "bias": (x, w, torch.randn(3), None, s, p),
        "empty": (torch.randn(0, 16, 8, 8), w, b, None, s, p),
    }
    for expected, args in refused.items():
        reason = triton_conv.unsupported_reason(*args)
        assert reason and expected in reason, (expected, reason)


def test_block_unsupported_reason():
    x, w1, b1, w2, b2 = _block_tensors(16, 8, "float32", 1)
    assert triton_conv.block_unsupported_reason(x, w1, b1, w2, b2) is None
    assert triton_conv.block_unsupported_reason(*_block_tensors(64, 8, "float16", 1)) is None
    refused = {
        "80 channels": _block_tensors(80, 8, "float32", 1),
        "not a 3x3": (x, torch.randn(16, 16, 1, 1), b1, w2, b2),
        "float64": (x.double(), w1.double(), b1.double(), w2.double(), b2.double()),
        "bias": (x, w1, torch.randn(3), w2, b2),
    }
    for expected, args in refused.items():
        reason = triton_conv.block_unsupported_reason(*args)
        assert reason and expected in reason, (expected, reason)


@pytest.fixture(scope="module")
def resnet20():
    return prototype_classifier("cifar_resnet20", 8)


def test_tritonize_fuses_the_stride1_identity_blocks_only(resnet20):
    folded = fold_classifier(resnet20)
    fast = triton_conv.tritonize(folded, fuse_blocks=True)
    kinds = [type(b).__name__ for b in fast.net.blocks]
    assert kinds == ["TritonBlock"] * 3 + ["FoldedBlock", "TritonBlock", "TritonBlock"] * 2, kinds
    assert not any(type(m) is FoldedConv for m in fast.modules())            # the rest per convolution
    assert not any(isinstance(m, triton_conv.TritonBlock) for m in folded.modules())
    x = prototype_images(10, 8, 0.25, seed=3)
    with torch.no_grad():
        torch.testing.assert_close(fast(x), folded(x), rtol=1e-5, atol=1e-5)


def test_tritonize_copies_and_leaves_the_folded_classifier_untouched(resnet20):
    clf = resnet20
    folded = fold_classifier(clf)
    state = {k: v.clone() for k, v in folded.state_dict().items()}
    kinds = [type(m) for m in folded.modules()]
    fast = triton_conv.tritonize(folded)
    assert [type(m) for m in folded.modules()] == kinds and not any(
        isinstance(m, triton_conv.TritonConv) for m in folded.modules())
    assert all(torch.equal(state[k], v) for k, v in folded.state_dict().items())
    convs = [m for m in fast.modules() if isinstance(m, triton_conv.TritonConv)]
    assert len(convs) == sum(isinstance(m, FoldedConv) for m in folded.modules()) == 21
    assert all(a.weight.data_ptr() != b.weight.data_ptr() for a, b in zip(convs, [
        m for m in folded.modules() if isinstance(m, FoldedConv)]))
    x = prototype_images(10, 8, 0.25, seed=3)
    with torch.no_grad():
        torch.testing.assert_close(fast(x), folded(x), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="fold_classifier"):
        triton_conv.tritonize(clf)


@pytest.mark.slow
@pytest.mark.parametrize("fuse_blocks", [False, pytest.param(True, marks=pytest.mark.skipif(
    os.environ.get("DIFFSMOOTH_COMPILE_SWEEP") != "1",
    reason="the fused blocks' CPU compile as well: set DIFFSMOOTH_COMPILE_SWEEP=1"))])
def test_the_op_compiles_with_channels_last_on_cpu(fuse_blocks):
    """torch.compile traces the custom ops through their fake implementations (here the reference path runs)."""
    clf = prototype_classifier("cifar_resnet20", 16)
    fast = triton_conv.tritonize(fold_classifier(clf), fuse_blocks=fuse_blocks).to(memory_format=CL)
    fast.net.nhwc = True
    compiled = torch.compile(fast, dynamic=False)
    x = prototype_images(4, 16, 0.25, seed=4).contiguous(memory_format=CL)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), clf(x), rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------ compiled for NVIDIA GPUs (no GPU needed)


def _nvidia_compile(case, config, dtype, capability, monkeypatch):
    """The convolution kernel as _launch launches it for `case` in `dtype`, compiled for `capability`."""
    x, w, b, r, s, p, relu = _case_tensors(case[:7] + (dtype,) + case[8:])
    return _nvidia_compile_launch("_conv_kernel", lambda: triton_conv._launch(x, w, b, r, s, p, relu, config=config),
                                  capability, monkeypatch)


def _nvidia_compile_block(c, size, config, dtype, capability, monkeypatch):
    args = _block_tensors(c, size, dtype, 2)
    return _nvidia_compile_launch("_block_kernel", lambda: triton_conv._launch_block(*args, config=config),
                                  capability, monkeypatch)


def _nvidia_compile_launch(kernel_name, launch, capability, monkeypatch):
    """triton.compile of what `launch()` launches through triton_conv.<kernel_name>, specialised as triton's
    JIT specialises it (ints equal to 1 become constants, multiples of 16 carry a divisibility hint, pointers
    16-byte aligned), for an NVIDIA GPU of `capability`: ptxas runs, no GPU is touched."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    captured = {}

    class Capture:
        def __getitem__(self, grid):
            def launch(*args, **meta):
                captured.update(args=args, meta=meta)
            return launch
    kernel = getattr(triton_conv, kernel_name)
    monkeypatch.setattr(triton_conv, kernel_name, Capture())
    try:
        launch()
    finally:
        monkeypatch.setattr(triton_conv, kernel_name, kernel)
    args, meta = captured["args"], dict(captured["meta"])
    options = {"num_warps": meta.pop("num_warps"), "num_stages": meta.pop("num_stages")}
    types = {torch.float16: "*fp16", torch.bfloat16: "*bf16", torch.float32: "*fp32"}
    signature, constants, attrs = {}, dict(meta), {}
    for i, (name, value) in enumerate(zip(kernel.arg_names, args)):
        if isinstance(value, torch.Tensor):
            signature[name] = types[value.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif value == 1:
            signature[name], constants[name] = "constexpr", 1
        else:
            signature[name] = "i32"
            if value % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    signature.update({name: "constexpr" for name in meta})
    signature = {name: signature[name] for name in kernel.arg_names}
    return triton.compile(ASTSource(kernel, signature, constants, attrs), target=GPUTarget("cuda", capability, 32),
                          options=options)


def _nvidia_backend_or_skip():
    if triton_conv._INTERPRETED:
        pytest.skip("the kernel was built for the interpreter")
    import triton
    if tuple(int(v) for v in triton.__version__.split(".")[:2]) < (3, 3):
        pytest.skip(f"ahead-of-time compile API of triton {triton.__version__} not supported by this test")
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    if not ptxas.exists():
        pytest.skip("triton's NVIDIA backend (ptxas) is not installed")


HOPPER_QUICK = ["RGB stem 3->16 3x3 s1", "3x3 s1 16->16 +res relu", "3x3 s1 64->64 +res relu"]
RESNET_CLASSES = ["RGB stem 3->16 3x3 s1", "3x3 s1 16->16 +res relu", "3x3 s2 16->32 relu", "1x1 s2 16->32 shortcut",
                  "3x3 s1 32->32 +res relu", "3x3 s1 64->64 +res relu"]


@needs_triton
def test_the_kernel_compiles_for_hopper_with_wgmma(monkeypatch, tmp_path):
    """The stem, the first and the last stage's convolution in fp16 compile for sm_90 with the first config
    that fits: Hopper's warpgroup MMA is used, shared memory within the H100/H200's 227 KB. (Every class and
    config, and the fused block: the slow test below.)"""
    _nvidia_backend_or_skip()
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")
    for name in HOPPER_QUICK:
        case = next(c for c in CASES if c[0] == name)
        config = next(c for c in triton_conv.AUTOTUNE_CONFIGS if triton_conv._fits(c[1], case[1], case[3], case[3]))
        compiled = _nvidia_compile(case, config, "float16", 90, monkeypatch)
        assert "wgmma" in compiled.asm["ptx"], name
        assert compiled.metadata.shared <= 227 * 1024, (name, compiled.metadata.shared)


@pytest.mark.slow
@needs_triton
@pytest.mark.skipif(os.environ.get("DIFFSMOOTH_COMPILE_SWEEP") != "1",
                    reason="the whole sm_90 / sm_80 compile sweep takes 1-2 min: set DIFFSMOOTH_COMPILE_SWEEP=1 "
                           "(the quick Hopper compile above runs always)")
def test_every_config_compiles_for_nvidia(monkeypatch, tmp_path):
    """The stem, the first and the last stage's convolution with every config that fits, fp16 for sm_90 (the
    production path); the other shape classes with the first config that fits; bf16 and fp32 for sm_90 and
    fp16 for sm_80 (A100) for the stem and the 64-channel convolution; the fused block of the 16-channel
    stage with every config that fits, the other stages' with one (sm_90), one for sm_80. 1-2 minutes."""
    _nvidia_backend_or_skip()
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")
    limit = {90: 227 * 1024, 80: 163 * 1024}
    for name in RESNET_CLASSES:
        case = next(c for c in CASES if c[0] == name)
        fitting = [c for c in triton_conv.AUTOTUNE_CONFIGS if triton_conv._fits(c[1], case[1], case[3], case[3])]
        runs = [(config, "float16", 90) for config in (fitting if name in HOPPER_QUICK else fitting[:1])]
        if name in (HOPPER_QUICK[0], HOPPER_QUICK[-1]):
            runs += [(fitting[0], "bfloat16", 90), (fitting[0], "float32", 90), (fitting[0], "float16", 80)]
        for config, dtype, capability in runs:
            compiled = _nvidia_compile(case, config, dtype, capability, monkeypatch)
            assert compiled.metadata.shared <= limit[capability], (name, config, dtype, compiled.metadata.shared)
            # Hopper's warpgroup MMA needs 4 warps; the 2-warp config uses mma.sync
            assert capability != 90 or config[2] < 4 or "wgmma" in compiled.asm["ptx"], (name, config, dtype)
    for c, size in ((16, 32), (32, 16), (64, 8)):        # the fused block in each ResNet-110 stage
        fitting = [cfg for cfg in triton_conv.BLOCK_CONFIGS if triton_conv._block_fits(cfg, c, size, size)]
        for config in fitting if c == 16 else fitting[-1:]:
            compiled = _nvidia_compile_block(c, size, config, "float16", 90, monkeypatch)
            assert compiled.metadata.shared <= limit[90] and "wgmma" in compiled.asm["ptx"], (c, config)
    compiled = _nvidia_compile_block(64, 8, triton_conv.BLOCK_CONFIGS[2], "float16", 80, monkeypatch)
    assert compiled.metadata.shared <= limit[80], "sm_80"


# ------------------------------------------------------------------ on a GPU

gpu = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
       needs_triton]


def _apply(marks):
    def wrap(fn):
        for mark in reversed(marks):
            fn = mark(fn)
        return fn
    return wrap


GPU_CASES = RESNET_CLASSES + ["3x3 s1 20->24 +res (not tile multiples)", "3x3 s1 24->80 relu (two channel tiles)",
                              "3x3 s1 16->16 +res relu, NCHW", "one-channel stem 1->16"]


@_apply(gpu)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_every_resnet_convolution_on_cuda(dtype):
    """The kernel itself on the GPU for each shape class (fp32 with TF32 off: full-precision products), one
    config each (no autotuning: the ResNet-110 test below autotunes)."""
    assert triton_conv.triton_conv_unavailable("cuda") is None
    tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        for name in GPU_CASES:
            case = next(c for c in CASES if c[0] == name)
            args = [a.cuda() if isinstance(a, torch.Tensor) else a
                    for a in _case_tensors(case[:7] + (dtype,) + case[8:])]
            config = next(c for c in triton_conv.AUTOTUNE_CONFIGS if triton_conv._fits(c[1], case[1], case[3], case[3]))
            got = triton_conv._launch(*args, config=config)
            torch.cuda.synchronize()
            exact = _exact(*args)
            diff, scale = float((got.double() - exact).abs().max()), float(exact.abs().max())
            assert diff <= TOLERANCE[dtype] * (1 + scale), (name, diff, scale)
            assert got.is_contiguous(memory_format=folded_resnet._output_format(args[0])), name
    finally:
        torch.backends.cudnn.allow_tf32 = tf32


@_apply(gpu)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_the_fused_block_on_cuda(dtype):
    """The fused BasicBlock kernel on the GPU, each ResNet-110 stage's shape with every config that fits
    (tiles over the border at 9x9, several tiles per program at batch 64), against float64."""
    tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        for c, size, batch in ((16, 32, 4), (32, 16, 4), (64, 8, 64), (16, 9, 3), (20, 10, 2)):
            args = [a.cuda() for a in _block_tensors(c, size, dtype, batch)]
            exact = _block_exact(*args)
            for config in [cfg for cfg in triton_conv.BLOCK_CONFIGS if triton_conv._block_fits(cfg, c, size, size)]:
                got = triton_conv._launch_block(*args, config=config)
                torch.cuda.synchronize()
                diff, scale = float((got.double() - exact).abs().max()), float(exact.abs().max())
                assert diff <= TOLERANCE[dtype] * (1 + scale), (c, size, config, diff, scale)
    finally:
        torch.backends.cudnn.allow_tf32 = tf32


@_apply(gpu)
@pytest.mark.parametrize("fuse_blocks", [False, True])
def test_tritonized_resnet110_fp16_votes_like_the_folded_fp32_reference(fuse_blocks):
    """Cohen's ResNet-110 (randomised BN statistics, prototype classifier) folded in fp16 and tritonized
    (per convolution, or with its 52 stride-1 identity blocks fused), NHWC, on 10,000 noisy 32x32 images (one
    classifier call of B x m): the kernels are reached (autotuned here), and the votes agree with the folded
    fp32 reference (TF32 off) on >= 99.9% of the images, which spread over classes. On the CPU, an emulation
    of this kernel's fp16 rounding agreed on all of 1,000 such images."""
    device = torch.device("cuda")
    clf = prototype_classifier("cifar_resnet110", 32, device=device)
    x = prototype_images(10_000, 32, 0.25, seed=11, device=device).contiguous(memory_format=CL)
    tf32, fusion = torch.backends.cudnn.allow_tf32, folded_resnet.CUDNN_FUSION["enabled"]
    torch.backends.cudnn.allow_tf32, folded_resnet.CUDNN_FUSION["enabled"] = False, False   # conv2d + add + relu
    try:
        reference = fold_classifier(clf).eval()
        with torch.no_grad():
            expected = torch.cat([reference(chunk) for chunk in x.split(2500)]).float()
    finally:
        torch.backends.cudnn.allow_tf32, folded_resnet.CUDNN_FUSION["enabled"] = tf32, fusion
    fast = triton_conv.tritonize(fold_classifier(clf, torch.float16), fuse_blocks=fuse_blocks).eval()
    before, blocks_before = triton_conv.TRITON_CALLS["count"], triton_conv.TRITON_BLOCK_CALLS["count"]
    with torch.no_grad():
        got = fast(x).float()
    torch.cuda.synchronize()
    blocks = sum(isinstance(m, triton_conv.TritonBlock) for m in fast.modules())
    convs = sum(isinstance(m, triton_conv.TritonConv) for m in fast.modules()) - 2 * blocks
    assert blocks == (52 if fuse_blocks else 0) and convs == 111 - 2 * blocks
    assert triton_conv.TRITON_CALLS["count"] - before == convs, "a convolution missed the kernel"
    assert triton_conv.TRITON_BLOCK_CALLS["count"] - blocks_before == blocks, "a block missed the fused kernel"
    assert bool(torch.isfinite(got).all())
    assert len(set(expected.argmax(1).tolist())) >= 8
    agree = float((got.argmax(1) == expected.argmax(1)).float().mean())
    diff = float((got - expected).abs().max())
    assert agree >= 0.999, f"vote agreement {agree:.4%} (max |logit diff| {diff:.3g})"
    assert diff <= 2e-2 * (1 + float(expected.abs().max())), diff


@_apply(gpu)
@pytest.mark.parametrize("fuse_blocks", [False, True])
def test_tritonized_classifier_compiles_and_replays_in_a_cuda_graph(fuse_blocks):
    """As the fast path runs it: torch.compile (the ops opaque to inductor), warm-up (autotuning happens
    here), then a CUDA graph captured and replayed on new inputs equals the eager tritonized call. The
    weights made channels_last, as the fast path's stage does (the kernels read them through strides)."""
    device = torch.device("cuda")
    clf = prototype_classifier("cifar_resnet20", 32, device=device)
    fast = triton_conv.tritonize(fold_classifier(clf, torch.float16), fuse_blocks=fuse_blocks)
    fast = fast.eval().to(memory_format=CL)
    compiled = torch.compile(fast, dynamic=False)
    static = prototype_images(512, 32, 0.25, seed=1, device=device).contiguous(memory_format=CL)
    before = triton_conv.TRITON_CALLS["count"] + triton_conv.TRITON_BLOCK_CALLS["count"]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(side):
        for _ in range(3):
            compiled(static)
    torch.cuda.current_stream().wait_stream(side)
    reached = triton_conv.TRITON_CALLS["count"] + triton_conv.TRITON_BLOCK_CALLS["count"]
    assert reached > before, "the compiled model never reached the Triton kernels"
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        out = compiled(static)
    for seed in (2, 3):
        static.copy_(prototype_images(512, 32, 0.25, seed=seed, device=device).contiguous(memory_format=CL))
        graph.replay()
        with torch.no_grad():
            eager = fast(static)
        torch.cuda.synchronize()
        diff = float((out.float() - eager.float()).abs().max())     # fp16 logits: a few ulps of inductor's fc
        assert diff <= 1e-2 * (1 + float(eager.float().abs().max())), diff
        assert len(set(out.argmax(1).tolist())) >= 5


if __name__ == "__main__":
    torch.set_num_threads(1)            # the interpreter is Python-bound; a second thread only spins
    if sys.argv[1:] == ["interpret"]:
        print("RESULT " + json.dumps(_interpreted_measurements()))
    elif sys.argv[1:] == ["interpret-slow"]:
        print("RESULT " + json.dumps(_interpreted_slow_measurements()))

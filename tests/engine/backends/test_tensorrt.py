"""The TensorRT path without TensorRT: engine file cache keys and the rebuild decision, engine file manifests,
profile selection from the batch, inspector parsing, stage input checks, CLI wiring and errors.

Where TensorRT itself would be called, tests inject either build/load functions or a FAKE
`tensorrt` module (tests/fake_tensorrt.py): those tests prove the wiring only. Tests that need real
TensorRT and a GPU are marked and skip with the reason."""

from __future__ import annotations

import functools
import json
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from click.testing import CliRunner
from fake_tensorrt import FAKE, fake_engine_file
from onnx import TensorProto, helper

from diffsmooth.cli import main
from diffsmooth.engine.backends.tensorrt import runner as trt_backend
from diffsmooth.engine.backends.tensorrt.engine_files import (
    cache_key,
    choose_engine_file,
    engine_file_manifest_path,
    engine_file_path_for,
    profile_covers,
    profile_for,
    read_engine_file_manifest,
    reuse_decision,
    scan_engine_files,
    write_engine_file_manifest,
)
from diffsmooth.engine.backends.tensorrt.runner import TrtStage, tensorrt_available
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.hashing import sha256_file
from diffsmooth.export.manifest import write_manifest
from diffsmooth.export.trt_build import Target, build_engine_files, ensure_engine_file
from diffsmooth.export.trt_inspect import datatype_of, layer_roles, summarize

H100 = Target("10.12.0", "NVIDIA H100 80GB HBM3", "9.0")
A100 = Target("10.12.0", "NVIDIA A100-SXM4-80GB", "8.0")
INPUTS = {"x_rs": ["batch", 1, 8, 8]}


def _graph(folder: Path, name: str, role: str = "denoiser", precision: str = "fp16", inputs=None,
           scale: float = 1.0, **fields):
    """A small valid ONNX graph (x * scale) with an export manifest, as `diffsmooth export` writes."""
    inputs = inputs or INPUTS
    in_name = next(iter(inputs))
    c = helper.make_tensor("c", TensorProto.FLOAT, [], [scale])
    node = helper.make_node("Mul", [in_name, "c"], ["out"])
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info(in_name, TensorProto.FLOAT, ["batch", 1, 8, 8])],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", 1, 8, 8])], [c])
    path = folder / name
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    manifest = {"role": role, "precision": precision, "image_shape": [1, 8, 8], "inputs": inputs,
                "output": {"name": "out", "shape": ["batch", 1, 8, 8]}, "sigma": 0.5,
                "onnx_sha256": sha256_file(path), "external_data": {}, "validation": None}
    manifest.update(fields)
    write_manifest(path, manifest)
    return path, manifest


# ------------------------------------------------------------------------------------------
# Profiles and keys


def test_profile_from_batch_is_one_to_max_with_opt_at_the_batch():
    p = profile_for({"x": ["batch", 3, 32, 32], "noise": ["batch", 5, 3, 32, 32]}, 400, 1000)
    assert p["x"] == {"min": [1, 3, 32, 32], "opt": [400, 3, 32, 32], "max": [1000, 3, 32, 32]}
    assert p["noise"]["min"] == [1, 5, 3, 32, 32] and p["noise"]["max"][0] == 1000
    assert profile_for({"x": ["batch", 1]}, 50)["x"]["max"] == [50, 1]       # max defaults to the batch
    assert profile_covers(p, 1000) and profile_covers(p, 1) and not profile_covers(p, 1001)
    with pytest.raises(UserError, match="smaller than the batch"):
        profile_for({"x": ["batch", 1]}, 100, 10)
    with pytest.raises(UserError, match="no input of the graph has a leading batch axis"):
        profile_for({"x": [4, 1]}, 10)
    # a reverse step's timestep and coefficients: static beside the batched inputs, outside the coverage check
    step = profile_for({"x_t": ["batch", 3, 8, 8], "t": [1], "c": [7], "noise": ["batch", 3, 8, 8]}, 64, 128)
    assert step["c"] == {"min": [7], "opt": [7], "max": [7], "static": True} and step["x_t"]["max"][0] == 128
    assert profile_covers(step, 128) and not profile_covers(step, 129)
    with pytest.raises(UserError, match=">= 1"):
        profile_for({"x": ["batch", 1]}, 0)


def test_engine_file_names_differ_by_gpu_and_profile(tmp_path):
    onnx_path = tmp_path / "denoiser_s0.5_1x8x8_fp16.onnx"
    p = profile_for(INPUTS, 1000)
    a = engine_file_path_for(onnx_path, H100.gpu_name, H100.compute_capability, p)
    b = engine_file_path_for(onnx_path, A100.gpu_name, A100.compute_capability, p)
    c = engine_file_path_for(onnx_path, H100.gpu_name, H100.compute_capability, profile_for(INPUTS, 500))
    assert len({a, b, c}) == 3 and a.parent == tmp_path
    assert a.name == "denoiser_s0.5_1x8x8_fp16.nvidia-h100-80gb-hbm3-sm90.b1000-1000.plan"
    assert engine_file_manifest_path(a).name.endswith(".plan.json")


def _key(**over):
    fields = dict(onnx_sha256="a" * 64, tensorrt_version="10.12.0", gpu_name="NVIDIA H100 80GB HBM3",
                  compute_capability="9.0", profile=profile_for(INPUTS, 1000), precision="fp16")
    fields.update(over)
    return cache_key(**fields)


@pytest.mark.parametrize("field,value", [
    ("onnx_sha256", "b" * 64), ("tensorrt_version", "10.13.0"), ("gpu_name", "NVIDIA A100-SXM4-80GB"),
    ("compute_capability", "8.0"), ("profile", profile_for(INPUTS, 999)), ("precision", "fp32")])
def test_reuse_decision_names_the_field_that_changed(tmp_path, field, value):
    engine_file = tmp_path / "g.plan"
    engine_file.write_bytes(b"plan bytes")
    write_engine_file_manifest(engine_file, {"key": _key(), "plan_sha256": sha256_file(engine_file)})
    assert reuse_decision(engine_file, _key(), sha256_file) == (True, "")
    ok, why = reuse_decision(engine_file, _key(**{field: value}), sha256_file)
    assert not ok and field in why and "\n" not in why


def test_reuse_decision_missing_damaged_or_changed_engine_files(tmp_path):
    engine_file = tmp_path / "g.plan"
    assert reuse_decision(engine_file, _key(), sha256_file) == (False, "no engine file g.plan yet")
    engine_file.write_bytes(b"plan bytes")
    ok, why = reuse_decision(engine_file, _key(), sha256_file)
    assert not ok and "missing" in why
    engine_file_manifest_path(engine_file).write_text("{not json")
    ok, why = reuse_decision(engine_file, _key(), sha256_file)
    assert not ok and "not readable JSON" in why
    write_engine_file_manifest(engine_file, {"key": _key(), "plan_sha256": sha256_file(engine_file)})
    engine_file.write_bytes(b"other bytes")
    ok, why = reuse_decision(engine_file, _key(), sha256_file)
    assert not ok and "changed after it was built" in why


def _engine_file_manifest(tmp_path, name, target, batch, max_batch=None, sha="a" * 64, precision="fp16"):
    engine_file = tmp_path / name
    engine_file.write_bytes(b"x")
    key = cache_key(onnx_sha256=sha, tensorrt_version=target.tensorrt_version, gpu_name=target.gpu_name,
                    compute_capability=target.compute_capability, profile=profile_for(INPUTS, batch, max_batch),
                    precision=precision)
    write_engine_file_manifest(engine_file, {"key": key, "plan_sha256": sha256_file(engine_file)})
    return engine_file


def test_choose_engine_file_by_gpu_tensorrt_and_batch(tmp_path):
    small = _engine_file_manifest(tmp_path, "a.plan", H100, 100)
    big = _engine_file_manifest(tmp_path, "b.plan", H100, 400, 2000)
    exact = _engine_file_manifest(tmp_path, "c.plan", H100, 1000, 4000)
    _engine_file_manifest(tmp_path, "d.plan", A100, 1000)
    _engine_file_manifest(tmp_path, "e.plan", H100, 1000, sha="f" * 64)         # another graph
    _engine_file_manifest(tmp_path, "f.plan", H100, 1000, precision="fp32")      # another precision
    engine_files = scan_engine_files(tmp_path, "a" * 64, "fp16")
    assert sorted(p.name for p, _ in engine_files) == ["a.plan", "b.plan", "c.plan", "d.plan"]
    kw = dict(tensorrt_version="10.12.0", gpu_name=H100.gpu_name, compute_capability="9.0", graph_name="g.onnx",
              onnx_dir=tmp_path)
    assert choose_engine_file(engine_files, batch=1000, **kw)[0] == exact               # opt == the run's batch
    assert choose_engine_file(engine_files, batch=50, **kw)[0] == small                 # else the smallest max that covers
    assert choose_engine_file(engine_files, batch=1500, **kw)[0] == big
    with pytest.raises(UserError, match=r"take batches up to \[100, 2000, 4000\], not 5000"):
        choose_engine_file(engine_files, batch=5000, **kw)
    with pytest.raises(UserError, match="built for another GPU .*NVIDIA H100 80GB HBM3 sm9.0.*not NVIDIA L4"):
        choose_engine_file(engine_files, **dict(kw, gpu_name="NVIDIA L4", compute_capability="8.9"), batch=10)
    with pytest.raises(UserError, match="built with TensorRT 10.12.0, this is 10.13.1"):
        choose_engine_file(engine_files, **dict(kw, tensorrt_version="10.13.1"), batch=10)
    with pytest.raises(UserError, match="no TensorRT engine file for g.onnx"):
        choose_engine_file([], batch=10, **kw)


def test_engine_files_exported_before_the_rename_still_load(tmp_path):
    """An engine file and manifest as `build-engine` wrote them (`.plan`, `.plan.json`, the manifest's format tag and
    plan_* keys: on-disk names kept) are found, chosen and reused; a manifest written today has the same keys."""
    engine_file = tmp_path / "g.nvidia-h100-80gb-hbm3-sm90.b1000-1000.plan"
    engine_file.write_bytes(b"serialized engine")
    old = {"format": "diffsmooth-trt-plan-manifest", "version": 1, "plan_file": engine_file.name, "key": _key(),
           "plan_sha256": sha256_file(engine_file), "plan_bytes": 17, "validation": None}
    (tmp_path / "g.nvidia-h100-80gb-hbm3-sm90.b1000-1000.plan.json").write_text(json.dumps(old, indent=2))
    assert read_engine_file_manifest(engine_file) == (old, "")
    assert reuse_decision(engine_file, _key(), sha256_file) == (True, "")
    found = scan_engine_files(tmp_path, "a" * 64, "fp16")
    assert found == [(engine_file, old)]
    assert choose_engine_file(found, tensorrt_version="10.12.0", gpu_name=H100.gpu_name, compute_capability="9.0",
                              batch=1000, graph_name="g.onnx", onnx_dir=tmp_path) == (engine_file, old)
    write_engine_file_manifest(engine_file, {k: v for k, v in old.items() if k not in ("format", "version", "plan_file")})
    assert json.loads(engine_file_manifest_path(engine_file).read_text()) == old


# ------------------------------------------------------------------------------------------
# The cache around the build (build/load/inspect injected: no TensorRT here)


class FakeBuilder:
    """Stands in for Polygraphy + TensorRT: counts builds, 'engine files' are JSON that the loader accepts."""

    def __init__(self):
        self.builds = []

    def build(self, onnx_path, profile, *, workspace_bytes, timing_cache):
        self.builds.append((Path(onnx_path).name, profile, workspace_bytes, timing_cache))
        return json.dumps({"built_from": Path(onnx_path).name, "n": len(self.builds)}).encode()

    @staticmethod
    def load(data):
        try:
            return json.loads(data)
        except ValueError:
            raise UserError("cannot deserialize") from None

    @staticmethod
    def inspect(engine, profile):
        return INSPECTOR_FP16


def test_engine_files_are_built_reused_and_rebuilt_with_one_line_why(tmp_path):
    onnx_path, manifest = _graph(tmp_path, "denoiser_s0.5_1x8x8_fp16.onnx")
    fb, lines = FakeBuilder(), []
    kw = dict(batch=1000, echo=lines.append, build_fn=fb.build, load_fn=fb.load, inspect_fn=fb.inspect,
              timing_cache=tmp_path / "timing.cache")
    first = ensure_engine_file(onnx_path, manifest, H100, **kw)
    assert first.built and len(fb.builds) == 1 and lines[0].startswith("building ") and "no engine file" in lines[0]
    assert fb.builds[0][1]["x_rs"] == {"min": [1, 1, 8, 8], "opt": [1000, 1, 8, 8], "max": [1000, 1, 8, 8]}
    m, _ = read_engine_file_manifest(first.engine_file_path)
    assert m["key"]["gpu_name"] == H100.gpu_name and m["key"]["precision"] == "fp16"
    assert m["plan_sha256"] == sha256_file(first.engine_file_path) and m["validation"] is None
    assert m["build"]["strongly_typed"] and m["build"]["profiling_verbosity"] == "DETAILED"
    assert m["inspection"]["passed"] and (tmp_path / m["inspector_file"]).exists()
    assert not list(tmp_path.glob("*.tmp"))

    lines.clear()
    again = ensure_engine_file(onnx_path, manifest, H100, **kw)
    assert not again.built and len(fb.builds) == 1 and lines == [f"reusing {first.engine_file_path.name} (key matches)"]

    first.engine_file_path.write_bytes(b"\x00garbage")                  # damaged: the manifest hash catches it
    lines.clear()
    ensure_engine_file(onnx_path, manifest, H100, **kw)
    assert len(fb.builds) == 2 and "changed after it was built" in lines[0]

    calls = []

    def refuse_once(data):                                        # intact bytes the runtime refuses
        calls.append(data)
        if len(calls) == 1:
            raise RuntimeError("Serialization assertion magicTagRead failed")
        return fb.load(data)
    lines.clear()
    ensure_engine_file(onnx_path, manifest, H100, **dict(kw, load_fn=refuse_once))
    assert len(fb.builds) == 3 and "fails to deserialize (Serialization assertion" in lines[0]

    onnx_path2, manifest2 = _graph(tmp_path, "denoiser_s0.5_1x8x8_fp16.onnx", scale=2.0)   # re-exported
    lines.clear()
    ensure_engine_file(onnx_path2, manifest2, H100, **kw)
    assert len(fb.builds) == 4 and "onnx_sha256" in lines[0]

    lines.clear()
    other = ensure_engine_file(onnx_path2, manifest2, A100, **kw)       # another GPU: its own engine file
    assert other.built and other.engine_file_path != first.engine_file_path and "no engine file" in lines[0]
    ensure_engine_file(onnx_path2, manifest2, H100, **dict(kw, rebuild=True))
    assert len(fb.builds) == 6


def test_build_engine_files_refuses_graphs_that_failed_validation_and_filters_precision(tmp_path):
    _graph(tmp_path, "d16.onnx", precision="fp16")
    _graph(tmp_path, "d32.onnx", precision="fp32")
    _graph(tmp_path, "unet.onnx", role="unet", precision="fp32")
    fb = FakeBuilder()
    kw = dict(batch=8, echo=lambda s: None, build_fn=fb.build, load_fn=fb.load, inspect_fn=fb.inspect,
              timing_cache=tmp_path / "t.cache")
    results = build_engine_files(tmp_path, H100, precisions=["fp32"], **kw)
    assert [r.onnx_path.name for r in results] == ["d32.onnx"]
    assert sorted(b[0] for b in fb.builds) == ["d32.onnx"]
    _graph(tmp_path, "bad.onnx", precision="fp16", validation={"passed": False, "summary": "votes 97%"})
    with pytest.raises(UserError, match="bad.onnx failed ONNX validation"):
        build_engine_files(tmp_path, H100, **kw)
    with pytest.raises(UserError, match="no denoiser/classifier graphs at precision bf16"):
        build_engine_files(tmp_path, H100, precisions=["bf16"], **kw)


# ------------------------------------------------------------------------------------------
# Inspection (inspector JSON in the documented detailed format, written here by hand)


def _layer(name, ltype, param, in_fmt, out_fmt, out_name=None):
    return {"Name": name, "LayerType": ltype, "ParameterType": param,
            "Inputs": [{"Name": name + ":in", "Location": "Device", "Dimensions": [8, 1, 8, 8],
                        "Format/Datatype": in_fmt}],
            "Outputs": [{"Name": out_name or name + ":out", "Location": "Device", "Dimensions": [8, 1, 8, 8],
                         "Format/Datatype": out_fmt}]}


INSPECTOR_FP16 = {"Layers": [
    _layer("Reformatting CopyNode for Input Tensor 0 to /conv_in/Conv", "Reformat", "Reformat",
           "Row major linear FP32", "Channel major FP16 format where channel % 8 == 0"),
    _layer("/conv_in/Conv", "CaskConvolution", "Convolution", "Channel major FP16 format where channel % 8 == 0",
           "Channel major FP16 format where channel % 8 == 0"),
    _layer("/norm/InstanceNormalization", "Normalization", "Normalization", "Row major linear FP32",
           "Row major linear FP32"),
    _layer("/attn/Softmax", "SoftMax", "SoftMax", "Row major linear FP32", "Row major linear FP32"),
    _layer("/out/Cast", "Cast", "Cast", "Half", "Float", out_name="out"),
], "Bindings": ["x_rs", "out"]}


def test_inspection_reports_half_layers_and_checks_the_mixed_precision():
    assert datatype_of("Channel major FP16 format where channel % 8 == 0") == "fp16"
    assert datatype_of("Row major linear FP32") == "fp32" and datatype_of("Half") == "fp16"
    assert datatype_of("Float") == "fp32" and datatype_of("N/A due to dynamic shapes") is None
    assert layer_roles(INSPECTOR_FP16["Layers"][0]) == []        # a reformat is not the conv it feeds
    ok = summarize(INSPECTOR_FP16, "fp16", ["out"])
    assert ok["passed"] and ok["half_layers"] == ["Reformatting CopyNode for Input Tensor 0 to /conv_in/Conv",
                                                  "/conv_in/Conv"]
    assert ok["by_role"]["convolution"] == {"fp16": 1} and ok["by_role"]["softmax"] == {"fp32": 1}

    bad = json.loads(json.dumps(INSPECTOR_FP16))
    bad["Layers"][1] = _layer("/conv_in/Conv", "CaskConvolution", "Convolution", "Row major linear FP32",
                              "Row major linear FP32")
    bad["Layers"][3] = _layer("/attn/Softmax", "SoftMax", "SoftMax", "Half", "Half")
    bad["Layers"][4] = _layer("/out/Cast", "Cast", "Cast", "Float", "Half", out_name="out")
    r = summarize(bad, "fp16", ["out"])
    assert not r["passed"]
    assert any("convolution /conv_in/Conv runs in fp32" in f for f in r["failures"])
    assert any("softmax /attn/Softmax runs in fp16" in f for f in r["failures"])
    assert any("graph output out is fp16" in f for f in r["failures"])
    assert not summarize(INSPECTOR_FP16, "fp32", ["out"])["passed"]        # half layers in an fp32 engine file
    names_only = summarize({"Layers": ["/conv_in/Conv", "/norm/InstanceNormalization"]}, "fp16")
    assert not names_only["detailed"] and not names_only["passed"]


# ------------------------------------------------------------------------------------------
# The stage, against the FAKE tensorrt module (wiring only)


class _Stream:
    def __init__(self, handle):
        self.cuda_stream = handle


@pytest.fixture
def fake_trt(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", FAKE)
    current = {"stream": _Stream(111)}
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: current["stream"])
    return current


def test_fake_stage_binds_torch_buffers_and_enqueues_on_the_current_stream(tmp_path, fake_trt):
    engine_file = tmp_path / "g.plan"
    engine_file.write_bytes(fake_engine_file({"x": [(1, 1, 4, 4), (8, 1, 4, 4), (8, 1, 4, 4)]}, scale=3.0))
    stage = TrtStage(engine_file, "denoiser", "cpu", "fp16")        # cpu only because the runtime is fake
    assert stage.input_names == ["x"] and stage.output_name == "y"
    x = torch.randn(5, 1, 4, 4)
    out = stage(x)
    assert torch.equal(out, 3.0 * x)                         # the fake read x and wrote y at the given addresses
    ctx = stage.engine.contexts[0]
    assert ctx.streams == [111] and ctx.shapes["x"] == (5, 1, 4, 4)
    fake_trt["stream"] = _Stream(222)                        # another stream: its own context
    stage(x[:1])
    assert len(stage.engine.contexts) == 2 and stage.engine.contexts[1].streams == [222]
    fake_trt["stream"] = _Stream(111)
    stage(x)
    assert len(stage.engine.contexts) == 2 and ctx.streams == [111, 111]
    with pytest.raises(UserError, match=r"batch 9 is outside the engine file's profile \[1, 8\]"):
        stage(torch.zeros(9, 1, 4, 4))
    with pytest.raises(UserError, match=r"the engine file takes \[batch, 1, 4, 4\]"):
        stage(torch.zeros(2, 1, 4, 5))
    with pytest.raises(UserError, match="takes 1 input"):
        stage(x, x)


def test_fake_stage_takes_static_inputs_beside_the_batch(tmp_path, fake_trt):
    """A reverse step's engine file: x_t and noise batched, the timestep [1] and coefficients [7] fixed by the profile
    (not a batch of 1 or 7 that must agree with x_t's), each checked against its own shape."""
    engine_file = tmp_path / "step.plan"
    engine_file.write_bytes(fake_engine_file({"x_t": [(1, 1, 4, 4), (8, 1, 4, 4), (8, 1, 4, 4)], "t": [(1,), (1,), (1,)],
                                "c": [(7,), (7,), (7,)], "noise": [(1, 1, 4, 4), (8, 1, 4, 4), (8, 1, 4, 4)]}, scale=2.0))
    stage = TrtStage(engine_file, "reverse step", "cpu", "fp32")
    x = torch.randn(5, 1, 4, 4)
    assert torch.equal(stage(x, torch.ones(1), torch.ones(7), torch.zeros(5, 1, 4, 4)), 2.0 * x)
    with pytest.raises(UserError, match="different batch sizes"):
        stage(x, torch.ones(1), torch.ones(7), torch.zeros(4, 1, 4, 4))
    with pytest.raises(UserError, match=r"input c has shape \[6\], the engine file takes \[7\]"):
        stage(x, torch.ones(1), torch.ones(6), torch.zeros(5, 1, 4, 4))
    with pytest.raises(UserError, match=r"input t has shape \[2\], the engine file takes \[1\]"):
        stage(x, torch.ones(2), torch.ones(7), torch.zeros(5, 1, 4, 4))


def assert_one_context_per_stream(stage, handles, calls_per_stream: int) -> None:
    """Each stream the stage was called on has a context of its own that enqueued every one of that
    stream's calls (warm-ups included) there and nowhere else."""
    contexts = stage.engine.contexts
    assert len(contexts) == len(handles), [ctx.streams for ctx in contexts]
    assert sorted(ctx.streams for ctx in contexts) == sorted([h] * calls_per_stream for h in handles)


def test_the_gpu_stream_tests_calls_keep_one_context_per_stream(tmp_path, fake_trt):
    """The call pattern of test_fake_stage_on_gpu_enqueues_on_the_callers_stream_without_sync (a warm-up
    call on each of two streams, then one call on each), judged by the same assertion on CPU: its
    bookkeeping runs here before a GPU sees it (it once expected one call per stream after warm-ups)."""
    engine_file = tmp_path / "g.plan"
    engine_file.write_bytes(fake_engine_file({"x": [(1, 1, 4, 4), (8, 1, 4, 4), (8, 1, 4, 4)]}, scale=3.0))
    stage = TrtStage(engine_file, "denoiser", "cpu", "fp16")
    streams = [_Stream(111), _Stream(222)]
    x = torch.randn(8, 1, 4, 4)
    for s in streams:                       # warm-up
        fake_trt["stream"] = s
        stage(x)
    for i, s in enumerate(streams):         # the calls under test
        fake_trt["stream"] = s
        assert torch.equal(stage(x * (i + 1)), 3.0 * x * (i + 1))
    assert_one_context_per_stream(stage, [111, 222], calls_per_stream=2)
    with pytest.raises(AssertionError):     # one call per stream, as the assertion once read, is not what happened
        assert_one_context_per_stream(stage, [111, 222], calls_per_stream=1)


def test_fake_stage_refuses_bad_engine_files(tmp_path, fake_trt):
    engine_file = tmp_path / "g.plan"
    engine_file.write_bytes(b"\x00not an engine file")
    with pytest.raises(UserError, match="TensorRT cannot deserialize g.plan"):
        TrtStage(engine_file, "d", "cpu", "fp16")
    engine_file.write_bytes(fake_engine_file({"x": [(1, 2), (4, 2), (4, 2)]}, dtypes={"y": "HALF"}))
    with pytest.raises(UserError, match="tensor y is HALF, stages take and return float32"):
        TrtStage(engine_file, "d", "cpu", "fp16")


def test_tensorrt_available_and_missing_tensorrt(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", None)                      # import fails
    ok, why = tensorrt_available()
    assert not ok and "not installed" in why
    with pytest.raises(UserError, match="need TensorRT"):
        trt_backend.import_tensorrt()
    monkeypatch.setitem(sys.modules, "tensorrt", FAKE)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    ok, why = tensorrt_available()
    assert not ok and "no CUDA device" in why and "10.99.0-fake" in why
    with pytest.raises(UserError, match="needs a CUDA GPU"):
        trt_backend.cuda_device("cuda")
    with pytest.raises(UserError, match="runs on a CUDA device"):
        trt_backend.cuda_device("cpu")


def test_select_refuses_precision_missing_gpu_and_failed_validation(tmp_path, monkeypatch):
    from diffsmooth.engine.backends.tensorrt.stages import EngineFileKey, engine_file_for, trt_graphs
    with pytest.raises(UserError, match="not bf16"):
        trt_graphs(tmp_path, precision="bf16")
    monkeypatch.setitem(sys.modules, "tensorrt", FAKE)
    with pytest.raises(UserError, match="runs on a CUDA device"):
        trt_graphs(tmp_path, device="cpu", precision="fp16")
    path, manifest = _graph(tmp_path, "denoiser_s0.5_1x8x8_fp16.onnx")
    fb = FakeBuilder()
    result = ensure_engine_file(path, manifest, H100, batch=100, echo=lambda s: None, build_fn=fb.build, load_fn=fb.load,
                         inspect_fn=fb.inspect, timing_cache=tmp_path / "t.cache")
    want = {"sigma": 0.5, "image_shape": [1, 8, 8], "precision": "fp16"}
    key = functools.partial(EngineFileKey, H100.tensorrt_version, H100.gpu_name, H100.compute_capability)    # + the batch
    engine_file, engine_file_manifest, graph_manifest = engine_file_for(tmp_path, "denoiser", want, "fp16", key(100))
    assert engine_file == result.engine_file_path and graph_manifest["onnx_sha256"] == manifest["onnx_sha256"]
    with pytest.raises(UserError, match="take batches up to"):
        engine_file_for(tmp_path, "denoiser", want, "fp16", key(101))
    m, _ = read_engine_file_manifest(engine_file)
    m["validation"] = {"passed": False, "summary": "vote agreement 99.10%"}
    for k in ("format", "version", "plan_file"):
        m.pop(k)
    write_engine_file_manifest(engine_file, m)
    with pytest.raises(UserError, match="failed validation \\(vote agreement 99.10%\\)"):
        engine_file_for(tmp_path, "denoiser", want, "fp16", key(100))


# ------------------------------------------------------------------------------------------
# CLI wiring (no TensorRT on this machine: one line, exit 2)


@pytest.fixture
def no_tensorrt(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", None)


def _run(args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_cli_without_tensorrt_is_one_line_and_exit_2(tmp_path, no_tensorrt):
    _graph(tmp_path, "denoiser_s0.5_1x8x8_fp16.onnx")
    for args in (["build-engine", "--onnx-dir", tmp_path],
                 ["certify", "--backend", "tensorrt", "--onnx-dir", tmp_path, "--out", tmp_path / "r.tsv"],
                 ["predict", "--backend", "tensorrt", "--onnx-dir", tmp_path, "--out", tmp_path / "p.tsv"],
                 ["export", "--out", tmp_path / "new", "--trt", "--method", "rs"]):
        r = _run(args)
        assert r.exit_code == 2, r.output
        lines = r.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: TensorRT engine files need TensorRT"), r.output
    assert not (tmp_path / "new").exists()                   # export --trt fails before writing graphs
    assert not (tmp_path / "r.tsv").exists()
    r = _run(["certify", "--backend", "tensorrt", "--out", tmp_path / "r.tsv"])
    assert r.exit_code == 2 and "needs --onnx-dir" in r.output


def test_cli_build_engine_options_are_checked(tmp_path, monkeypatch):
    from diffsmooth.export import trt_build
    monkeypatch.setattr(trt_build, "current_target", lambda device: H100)
    _graph(tmp_path, "denoiser_s0.5_1x8x8_fp16.onnx")
    r = _run(["build-engine", "--onnx-dir", tmp_path, "--batch", "100", "--max-batch", "10"])
    assert r.exit_code == 2 and "--max-batch: must be >= --batch (100), got 10" in r.output
    r = _run(["build-engine", "--onnx-dir", tmp_path, "--samples", "999"])
    assert r.exit_code == 2 and "--samples >= 1000" in r.output
    r = _run(["build-engine", "--onnx-dir", tmp_path, "--workspace-gb", "0"])
    assert r.exit_code == 2 and "--workspace-gb" in r.output
    r = _run(["build-engine", "--onnx-dir", tmp_path / "missing"])
    assert r.exit_code == 2 and "no such directory" in r.output


def test_bench_skips_tensorrt_with_the_reason(no_tensorrt, tmp_path):
    from diffsmooth.bench.harness import BenchSettings, _Skip, build_stages
    with pytest.raises(_Skip, match="tensorrt is not installed"):
        build_stages("tensorrt", "fp32", None, BenchSettings(batch=8), workdir=str(tmp_path))


def _has_cupy():
    try:
        import cupy  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or not _has_cupy(), reason="needs a CUDA GPU and CuPy")
def test_fake_stage_on_gpu_enqueues_on_the_callers_stream_without_sync(tmp_path, monkeypatch):
    """Real CUDA, FAKE TensorRT (CuPy does the engine's work): the stage must bind torch's device buffers
    and enqueue on the stream current at call time, behind work already queued there, and must not
    wait for it. Proves the stream wiring only."""
    monkeypatch.setitem(sys.modules, "tensorrt", FAKE)
    engine_file = tmp_path / "g.plan"
    engine_file.write_bytes(fake_engine_file({"x": [(1, 3, 64, 64), (256, 3, 64, 64), (256, 3, 64, 64)]}, scale=3.0, gpu=True))
    stage = TrtStage(engine_file, "denoiser", trt_backend.cuda_device("cuda"), "fp16")
    base = torch.rand(256, 3, 64, 64, device="cuda")
    torch.cuda.synchronize()
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for s in streams:           # first calls pay one-off setup (a context per stream, CuPy's kernel build):
        with torch.cuda.stream(s):   # on an H200 that outlasted the sleep below and failed this test once
            stage(base)
    torch.cuda.synchronize()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    torch.cuda._sleep(1_000_000_000)
    end.record()
    torch.cuda.synchronize()
    sleep_s = begin.elapsed_time(end) / 1000                  # what the queued work lasts on this GPU
    assert sleep_s > 0.1, f"torch.cuda._sleep lasted only {sleep_s:.3f} s: the test cannot tell a wait"
    outs = []
    for i, s in enumerate(streams):
        with torch.cuda.stream(s):
            torch.cuda._sleep(1_000_000_000)                 # queued work on this stream
            x = base * (i + 1)                               # written only after the sleep
            start = time.perf_counter()
            outs.append(stage(x))
            returned_after = time.perf_counter() - start
            still_queued = not s.query()
            # The host-side time is the verdict (the call returned long before the queued work could end);
            # the stream query says the same unless something else on the host blocked.
            assert returned_after < min(0.05, sleep_s / 4), \
                f"the stage call took {returned_after:.3f} s against {sleep_s:.3f} s of queued work: it waited"
            assert still_queued, f"stream {i} idle {returned_after:.3f} s after the call (queued {sleep_s:.3f} s)"
    torch.cuda.synchronize()
    for i, out in enumerate(outs):
        torch.testing.assert_close(out, 3.0 * base * (i + 1))
    assert_one_context_per_stream(stage, [int(s.cuda_stream) for s in streams], calls_per_stream=2)
    name, cc = trt_backend.gpu_identity(stage.device)
    print(f"gpu identity: {name!r} sm{cc}")
    assert name and cc.count(".") == 1


# ------------------------------------------------------------------------------------------
# Real TensorRT (never run on this project's machines)


@pytest.mark.gpu
@pytest.mark.skipif(not tensorrt_available()[0], reason=f"needs TensorRT and a GPU: {tensorrt_available()[1]}")
def test_real_engine_file_matches_onnxruntime(tmp_path):
    """Builds a real engine file of a tiny graph and runs it through the stage on torch's stream."""
    from diffsmooth.engine.backends.onnxruntime.runner import OrtStage
    from diffsmooth.export.trt_build import current_target
    path, manifest = _graph(tmp_path, "denoiser_s0.5_1x8x8_fp32.onnx", precision="fp32", scale=1.5)
    result = build_engine_files(tmp_path, current_target("cuda"), batch=16, echo=print)[0]
    stage = TrtStage(result.engine_file_path, "denoiser", "cuda", "fp32")
    x = torch.rand(16, 1, 8, 8, device="cuda")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        got = stage(x)
    torch.cuda.synchronize()
    want = OrtStage(path, "ort", "cpu", "fp32")(x.cpu())
    np.testing.assert_allclose(got.cpu().numpy(), want.numpy(), rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------
# Engine file validation: the real compare_stages machinery, with an ONNX Runtime stage standing in for
# the TensorRT one (the graph itself as a correct "engine file"; a class-shuffling stage as a broken one)


def test_engine_file_validation_records_votes_and_fails_on_disagreement(tmp_path):
    export_tests = str(Path(__file__).resolve().parents[2] / "export")
    if export_tests not in sys.path:               # importable when this file runs alone, too
        sys.path.insert(0, export_tests)
    from test_export import SHAPE, tiny_classifier

    from diffsmooth.engine.backends.onnxruntime.runner import OrtStage
    from diffsmooth.engine.base_classifier.methods import MethodConfig
    from diffsmooth.export.onnx_export import export_models
    from diffsmooth.export.trt_build import EngineFileResult
    from diffsmooth.export.trt_validate import validate_engine_files
    from diffsmooth.export.validate import ValidationFailed, validation_images

    torch.set_num_threads(1)
    config = MethodConfig("rs", 0.25)                        # the tiny classifier's votes spread at 0.25
    graphs = export_models(config, SHAPE, tmp_path, classifier=tiny_classifier())
    g = graphs[0]
    engine_file = tmp_path / "classifier.plan"
    engine_file.write_bytes(b"stand-in")
    key = {"profile": profile_for(g.manifest["inputs"], 100), "precision": "fp32"}
    write_engine_file_manifest(engine_file, {"key": key, "plan_sha256": sha256_file(engine_file), "validation": None})
    result = EngineFileResult(g.path, engine_file, "classifier", "fp32", g.manifest, {"key": key}, True)
    graph = OrtStage(g.path, "stand-in", "cpu", "fp32", threads=1)
    x, _, _ = validation_images(SHAPE, 10)
    votes = graph((x + 0.25 * torch.randn(x.shape, generator=torch.Generator().manual_seed(0)))).argmax(1)
    assert len(set(votes.tolist())) >= 3                     # the votes spread over several classes

    lines = []
    out = validate_engine_files([result], tmp_path, stage_fn=lambda p, n, prec: graph, threads=1, echo=lines.append)
    res = out[str(engine_file)]
    assert res["passed"] and res["votes"]["samples"] >= 1000 and res["votes"]["threshold"] == 0.9999
    assert read_engine_file_manifest(engine_file)[0]["validation"]["passed"] and lines[0].startswith("ok   classifier.plan")

    shuffled = lambda xs: graph(xs).roll(1, dims=1)     # noqa: E731 - an engine file with wrong scores
    with pytest.raises(ValidationFailed, match="vote agreement"):
        validate_engine_files([result], tmp_path, stage_fn=lambda p, n, prec: shuffled, threads=1, echo=lines.append)
    assert read_engine_file_manifest(engine_file)[0]["validation"]["passed"] is False
    with pytest.raises(UserError, match=">= 1000"):
        validate_engine_files([result], tmp_path, samples=999)


def test_polygraphy_build_passes_the_intended_settings(tmp_path, monkeypatch):
    """Wiring only: Polygraphy's loaders are replaced by recorders (TensorRT is FAKE here), but the
    keyword arguments are first checked against the signatures of the installed Polygraphy."""
    import inspect
    pg = pytest.importorskip("polygraphy.backend.trt")
    from diffsmooth.export import trt_build

    for cls, kwargs in ((pg.NetworkFromOnnxPath, ["strongly_typed"]),
                        (pg.CreateConfig, ["profiles", "memory_pool_limits", "load_timing_cache",
                                           "profiling_verbosity", "tf32"]),
                        (pg.EngineBytesFromNetwork, ["config", "save_timing_cache"])):
        params = {k for c in cls.__mro__ if "__init__" in vars(c) for k in inspect.signature(c.__init__).parameters}
        assert all(k in params for k in kwargs), (cls.__name__, [k for k in kwargs if k not in params])

    calls = {}

    def recorder(name, result=None):
        def make(*args, **kwargs):
            calls[name] = (args, kwargs)
            return result if result is not None else (lambda: b"serialized engine")
        return make
    fake = type(sys)("tensorrt")
    fake.__dict__.update(FAKE.__dict__)
    fake.MemoryPoolType = type("MemoryPoolType", (), {"WORKSPACE": "WORKSPACE"})
    fake.ProfilingVerbosity = type("ProfilingVerbosity", (), {"DETAILED": "DETAILED"})
    monkeypatch.setitem(sys.modules, "tensorrt", fake)
    monkeypatch.setattr(pg, "NetworkFromOnnxPath", recorder("network", "network-loader"))
    monkeypatch.setattr(pg, "CreateConfig", recorder("config", "config-loader"))
    monkeypatch.setattr(pg, "EngineBytesFromNetwork", recorder("engine"))
    profile = profile_for({"x": ["batch", 3, 8, 8], "noise": ["batch", 2, 3, 8, 8]}, 64, 128)
    cache = tmp_path / "caches" / "timing.cache"
    data = trt_build.polygraphy_build(tmp_path / "g.onnx", profile, workspace_bytes=1 << 30, timing_cache=cache)
    assert data == b"serialized engine" and cache.parent.is_dir()
    assert calls["network"] == ((str(tmp_path / "g.onnx"),), {"strongly_typed": True})
    config = calls["config"][1]
    assert config["memory_pool_limits"] == {"WORKSPACE": 1 << 30}
    assert config["profiling_verbosity"] == "DETAILED" and config["load_timing_cache"] is None   # no cache yet
    (p,) = config["profiles"]
    assert tuple(p["x"].min) == (1, 3, 8, 8) and tuple(p["x"].opt) == (64, 3, 8, 8)
    assert tuple(p["noise"].max) == (128, 2, 3, 8, 8)
    assert calls["engine"] == (("network-loader",), {"config": "config-loader", "save_timing_cache": str(cache)})
    cache.write_bytes(b"timings")
    trt_build.polygraphy_build(tmp_path / "g.onnx", profile, workspace_bytes=1 << 30, timing_cache=cache)
    assert calls["config"][1]["load_timing_cache"] == str(cache)


def test_shell_probe_exits_1_with_the_reason_without_tensorrt():
    import subprocess
    probe = "import sys; sys.modules['tensorrt'] = None; import runpy; " \
            "runpy.run_module('diffsmooth.engine.backends.tensorrt.runner', run_name='__main__')"
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "tensorrt is not installed" in r.stdout

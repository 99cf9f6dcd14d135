"""`diffsmooth env`: the report's keys, "not installed" for missing packages, text and JSON output,
the compile-cache folder rule."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from diffsmooth.cli import main
from diffsmooth.engine import env_report

TOP_KEYS = {"diffsmooth_engine", "python", "os", "cpu", "torch", "onnx", "onnxruntime", "tensorrt", "polygraphy",
            "timm", "diffusers", "safetensors", "torchvision", "numpy", "scipy", "torch_compile"}


def test_json_keys_and_values():
    import numpy
    import torch
    r = CliRunner().invoke(main, ["env", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert set(doc) == TOP_KEYS
    assert doc["numpy"] == numpy.__version__ and doc["torch"]["version"] == torch.__version__
    assert set(doc["torch"]) >= {"cuda", "cudnn", "cuda_available", "gpus"}
    assert doc["torch"]["cuda_available"] == torch.cuda.is_available()
    assert len(doc["torch"]["gpus"]) == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    for gpu in doc["torch"]["gpus"]:
        assert set(gpu) == {"index", "name", "memory_gib", "compute_capability"}
    assert set(doc["torch_compile"]) >= {"cpu_ready", "cuda_ready", "cxx", "cc", "triton", "cache_dir"}
    assert doc["cpu"]["usable_cores"] >= 1
    if importlib.util.find_spec("onnxruntime"):
        assert "CPUExecutionProvider" in doc["onnxruntime"]["providers"]


def test_missing_packages_say_not_installed(monkeypatch):
    """Packages absent here (or made absent) read "not installed" in JSON and text."""
    real_version, real_find = importlib.metadata.version, importlib.util.find_spec
    gone = {"timm", "tensorrt", "polygraphy", "onnxruntime", "onnxruntime-gpu"}

    def version(dist):
        if dist in gone or dist.startswith("tensorrt"):
            raise importlib.metadata.PackageNotFoundError(dist)
        return real_version(dist)

    monkeypatch.setattr(importlib.metadata, "version", version)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in gone else real_find(name, *a))
    report = env_report.collect_env()
    for key in ("timm", "tensorrt", "polygraphy", "onnxruntime"):
        assert report[key] == "not installed", key
    text = env_report.format_env(report)
    for key in ("timm", "tensorrt", "polygraphy", "onnxruntime"):
        assert f"\n{key}: not installed" in text
    assert report["scipy"] == real_version("scipy")         # present packages still report a version


def test_text_output_one_key_per_line():
    r = CliRunner().invoke(main, ["env"])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0].startswith("diffsmooth_engine: ")
    assert any(line.startswith("torch:") for line in lines) and any("cache_dir: " in line for line in lines)
    assert all(": " in line or line.endswith(":") or line.lstrip().startswith("- ") for line in lines)


def test_compile_cache_dir_rule(monkeypatch, tmp_path):
    from diffsmooth.engine.backends.torch.compile_cache import compile_cache_dir, use_compile_cache
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "unset-below")   # recorded, so use_compile_cache's write is undone
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert compile_cache_dir() == tmp_path / "xdg" / "diffsmooth" / "inductor"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert compile_cache_dir() == Path.home() / ".cache" / "diffsmooth" / "inductor"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    path = use_compile_cache()
    assert path.is_dir() and path == tmp_path / "xdg" / "diffsmooth" / "inductor"
    import os
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(path)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert compile_cache_dir() == tmp_path / "mine"
    doc = json.loads(CliRunner().invoke(main, ["env", "--json"]).output)
    assert doc["torch_compile"]["cache_dir"] == str(tmp_path / "mine")
    assert doc["torch_compile"]["cache_source"] == "TORCHINDUCTOR_CACHE_DIR"


def test_check_compile_reports_failure_and_timeout(monkeypatch):
    """The compile check runs in a child process: a broken one and a hung one become messages."""
    monkeypatch.setattr(env_report, "_CHECK", "import sys; sys.exit('boom')")
    assert env_report.check_compile(timeout=60)["error"].startswith("check exited with code 1")
    monkeypatch.setattr(env_report, "_CHECK", "import time; time.sleep(30)")
    assert "no result within 1 s" in env_report.check_compile(timeout=1)["error"]


@pytest.mark.slow
def test_check_compile_really_compiles_on_cpu():
    report = env_report.collect_env(compile_check=True)
    check = report["torch_compile"]["check"]
    if report["torch_compile"]["cpu_ready"]:
        assert check.get("cpu", "").startswith("ok"), check
    else:
        assert not check.get("cpu", "").startswith("ok")


def test_gpu_block_from_device_properties(monkeypatch):
    """The CUDA part, fed fake device properties (no GPU here): memory, compute capability, readiness."""
    import types

    import torch
    props = [types.SimpleNamespace(name="NVIDIA H200", total_memory=150_121_545_728, major=9, minor=0),
             types.SimpleNamespace(name="Tesla P100", total_memory=17_071_734_784, major=6, minor=0)]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props[i])
    monkeypatch.setattr(env_report, "_nvidia_driver", lambda: "570.1")
    info = env_report._torch()
    assert info["gpus"] == [
        {"index": 0, "name": "NVIDIA H200", "memory_gib": 139.8, "compute_capability": "9.0"},
        {"index": 1, "name": "Tesla P100", "memory_gib": 15.9, "compute_capability": "6.0"},
    ]
    assert info["nvidia_driver"] == "570.1"
    monkeypatch.setattr(env_report, "_compiler", lambda var, names: "/usr/bin/" + names[0])
    assert env_report._compile_readiness(info, "3.6.0")["cuda_ready"] is False      # the P100 is too old for triton
    info["gpus"] = info["gpus"][:1]
    assert env_report._compile_readiness(info, "3.6.0")["cuda_ready"] is True
    assert env_report._compile_readiness(info, "not installed")["cuda_ready"] is False
    text = env_report.format_env({"torch": info})
    assert "- index: 0" in text and "compute_capability: 9.0" in text and "memory_gib: 139.8" in text

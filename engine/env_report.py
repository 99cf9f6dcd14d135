"""`diffsmooth env`: the facts a bug report needs (versions, hardware, optional runtimes, torch.compile).

Like `torch.utils.collect_env`, but limited to what this engine uses. Versions are read from package
metadata where possible, so a missing or broken optional package shows as "not installed" instead of
failing; only onnxruntime (for its providers) and torch are imported.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

from diffsmooth.engine.backends.torch.compile_cache import compile_cache_dir, compile_cache_source
from diffsmooth.engine.machine import cpu_model, usable_cores

NOT_INSTALLED = "not installed"

# report key -> (import name, distribution names to ask the metadata for, first found wins)
PACKAGES = {
    "numpy": ("numpy", ("numpy",)),
    "scipy": ("scipy", ("scipy",)),
    "onnx": ("onnx", ("onnx",)),
    "tensorrt": ("tensorrt", ("tensorrt", "tensorrt-cu12", "tensorrt-cu11", "tensorrt_cu12_bindings")),
    "polygraphy": ("polygraphy", ("polygraphy",)),
    "timm": ("timm", ("timm",)),
    "diffusers": ("diffusers", ("diffusers",)),
    "safetensors": ("safetensors", ("safetensors",)),
    "torchvision": ("torchvision", ("torchvision",)),
    "triton": ("triton", ("triton", "pytorch-triton")),
}


def package_version(import_name: str, dists=()) -> str:
    """Installed version of a package, or "not installed" (metadata first; import only as a fallback)."""
    for dist in dists or (import_name,):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    try:
        if importlib.util.find_spec(import_name) is None:
            return NOT_INSTALLED
    except (ImportError, ValueError):
        return NOT_INSTALLED
    try:                                   # e.g. TensorRT from a system package, without pip metadata
        module = __import__(import_name)
    except Exception as exc:  # noqa: BLE001 - a broken install is reported, not raised
        return f"installed but fails to import ({type(exc).__name__})"
    return str(getattr(module, "__version__", "installed (version unknown)"))


def _engine_version() -> str:
    try:
        return importlib.metadata.version("diffsmooth-engine")
    except importlib.metadata.PackageNotFoundError:
        return NOT_INSTALLED


def _cpu() -> dict:
    return {"model": cpu_model(), "usable_cores": usable_cores(), "logical_cores": os.cpu_count(),
            "machine": platform.machine()}


def _nvidia_driver() -> str | None:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.strip().splitlines()
    return lines[0].strip() if out.returncode == 0 and lines else None


def _torch() -> dict:
    import torch
    info = {"version": torch.__version__, "cuda": torch.version.cuda, "cudnn": None,
            "cuda_available": torch.cuda.is_available(), "nvidia_driver": None, "gpus": [],
            "threads": torch.get_num_threads()}
    try:
        info["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    except Exception:  # noqa: BLE001
        info["cudnn"] = None
    if info["cuda_available"]:
        info["nvidia_driver"] = _nvidia_driver()
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            info["gpus"].append({"index": i, "name": p.name, "memory_gib": round(p.total_memory / 2**30, 1),
                                 "compute_capability": f"{p.major}.{p.minor}"})
    return info


def _onnxruntime() -> dict | str:
    version = package_version("onnxruntime", ("onnxruntime", "onnxruntime-gpu"))
    if version == NOT_INSTALLED:
        return NOT_INSTALLED
    try:
        import onnxruntime
        providers = list(onnxruntime.get_available_providers())
    except Exception as exc:  # noqa: BLE001
        return {"version": version, "providers": f"unavailable ({type(exc).__name__}: {exc})"}
    return {"version": version, "providers": providers}


def _compiler(env_var: str, names) -> str | None:
    chosen = os.environ.get(env_var)
    for name in ([chosen] if chosen else []) + list(names):
        path = shutil.which(name)
        if path:
            return path
    return None


def _compile_readiness(torch_info: dict, triton: str) -> dict:
    """Whether torch.compile's inductor can build kernels, judged from its prerequisites (no compile)."""
    cxx = _compiler("CXX", ("g++", "c++", "clang++"))
    cc = _compiler("CC", ("gcc", "cc", "clang"))
    cuda = None
    if torch_info["cuda_available"]:
        ccs = [g["compute_capability"] for g in torch_info["gpus"]]
        new_enough = all(float(c) >= 7.0 for c in ccs) and bool(ccs)
        cuda = triton != NOT_INSTALLED and cc is not None and new_enough
    return {"cpu_ready": cxx is not None, "cuda_ready": cuda, "cxx": cxx, "cc": cc, "triton": triton,
            "cache_dir": str(compile_cache_dir()), "cache_source": compile_cache_source()}


_CHECK = r"""
import json, sys, time, torch
out = {}
def f(x):
    return torch.nn.functional.gelu(x * 2 + 1).sum(dim=1)
devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
for dev in devices:
    t = time.perf_counter()
    try:
        x = torch.randn(8, 64, device=dev)
        torch._dynamo.reset()
        y = torch.compile(f, fullgraph=True)(x)
        ok = torch.allclose(y, f(x), atol=1e-5, rtol=1e-5)
        out[dev] = ("ok" if ok else "wrong result") + f" ({time.perf_counter() - t:.1f} s)"
    except Exception as exc:
        lines = str(exc).strip().splitlines()
        out[dev] = "failed: " + type(exc).__name__ + (": " + lines[0][:200] if lines else "")
print("RESULT " + json.dumps(out))
"""


def check_compile(timeout: float = 300.0) -> dict:
    """Compile and run a tiny function (CPU, and CUDA when present) in a child process with a time limit.

    A fresh temporary inductor cache is used, so the check really builds kernels.
    """
    with tempfile.TemporaryDirectory(prefix="diffsmooth-compile-check-") as cache:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
        start = time.perf_counter()
        try:
            proc = subprocess.run([sys.executable, "-c", _CHECK], capture_output=True, text=True,
                                  timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            return {"error": f"no result within {timeout:g} s"}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT "):])
            result["seconds"] = round(time.perf_counter() - start, 1)
            return result
    tail = (proc.stderr or proc.stdout).strip().splitlines()
    return {"error": f"check exited with code {proc.returncode}" + (f": {tail[-1][:200]}" if tail else "")}


def collect_env(compile_check: bool = False, compile_timeout: float = 300.0) -> dict:
    """The report as a JSON-ready dict (keys are stable: tests and bug templates rely on them)."""
    versions = {key: package_version(mod, dists) for key, (mod, dists) in PACKAGES.items()}
    torch_info = _torch()
    report = {
        "diffsmooth_engine": _engine_version(),
        "python": f"{platform.python_version()} ({platform.python_implementation()}, {sys.executable})",
        "os": platform.platform(),
        "cpu": _cpu(),
        "torch": torch_info,
        "onnx": versions["onnx"],
        "onnxruntime": _onnxruntime(),
        "tensorrt": versions["tensorrt"],
        "polygraphy": versions["polygraphy"],
        "timm": versions["timm"],
        "diffusers": versions["diffusers"],
        "safetensors": versions["safetensors"],
        "torchvision": versions["torchvision"],
        "numpy": versions["numpy"],
        "scipy": versions["scipy"],
        "torch_compile": _compile_readiness(torch_info, versions["triton"]),
    }
    if compile_check:
        report["torch_compile"]["check"] = check_compile(compile_timeout)
    return report


def _lines(value, indent: int) -> list[str]:
    pad = "  " * indent
    if isinstance(value, dict):
        out = []
        for k, v in value.items():
            inline = isinstance(v, list) and all(not isinstance(x, (dict, list)) for x in v)
            if isinstance(v, (dict, list)) and v and not inline:
                out.append(f"{pad}{k}:")
                out.extend(_lines(v, indent + 1))
            else:
                out.append(f"{pad}{k}: {_scalar(v)}")
        return out
    if isinstance(value, list):
        if all(not isinstance(v, (dict, list)) for v in value):
            return [pad + ", ".join(map(str, value))]
        out = []
        for v in value:
            sub = _lines(v, indent + 1)
            out.append(pad + "- " + sub[0].strip())
            out.extend(sub[1:])
        return out
    return [pad + _scalar(value)]


def _scalar(v) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, list):
        return ", ".join(map(str, v)) if v else "none"
    return str(v)


def format_env(report: dict) -> str:
    """Plain text for pasting into an issue: one `key: value` per line, nested blocks indented."""
    return "\n".join(_lines(report, 0))

"""What the benchmark ran on (CPU model, cores, load, library versions, GPU) and the peak FLOP/s
its achieved rate is compared with: --peak-tflops, a table of known GPUs, or on CPU a measured
sgemm rate (a practical peak of this machine, not a datasheet figure)."""

from __future__ import annotations

import os
import platform
import time
from typing import Optional, Tuple

import torch

from diffsmooth.engine.machine import cpu_model, usable_cores  # noqa: F401 - part of this module's API

# Dense (no sparsity) datasheet peaks in TFLOP/s, by precision. "tf32" is what fp32 convolutions
# get on Ampere+ when cuDNN allows TF32 (torch's default for convolutions).
GPU_PEAK_TFLOPS = {
    "H200": {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4},
    "H100 PCIe": {"fp32": 51.2, "tf32": 378.0, "fp16": 756.5, "bf16": 756.5},
    "H100": {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4},   # SXM
    "A100": {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0},
    "RTX A6000": {"fp32": 38.7, "tf32": 77.4, "fp16": 154.8, "bf16": 154.8},
    "L40S": {"fp32": 91.6, "tf32": 183.0, "fp16": 362.0, "bf16": 362.0},
    "L4": {"fp32": 30.3, "tf32": 60.0, "fp16": 121.0, "bf16": 121.0},
    "A10": {"fp32": 31.2, "tf32": 62.5, "fp16": 125.0, "bf16": 125.0},
    "RTX 4090": {"fp32": 82.6, "tf32": 82.6, "fp16": 165.2, "bf16": 165.2},
    "V100": {"fp32": 15.7, "tf32": 15.7, "fp16": 125.0},
    "T4": {"fp32": 8.1, "tf32": 8.1, "fp16": 65.0},
}


def load_average() -> Optional[Tuple[float, float, float]]:
    try:
        return tuple(round(v, 2) for v in os.getloadavg())
    except OSError:
        return None


def gpu_name(device) -> Optional[str]:
    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name(dev)


def machine_info(device="cpu") -> dict:
    """Everything needed to interpret a timing later: hardware, load and library versions."""
    info = {
        "cpu_model": cpu_model(),
        "cpu_cores": usable_cores(),
        "torch_threads": torch.get_num_threads(),
        "load_average": load_average(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "onnxruntime": None,
        "cuda": torch.version.cuda,
        "gpu": gpu_name(device),
    }
    try:
        import onnxruntime
        info["onnxruntime"] = onnxruntime.__version__
    except ImportError:
        pass
    return info


def gpu_peak(name: str, precision: str) -> Optional[Tuple[float, str]]:
    """(peak FLOP/s, label) for a known GPU name; longest matching table key wins."""
    matches = [k for k in GPU_PEAK_TFLOPS if k.lower() in name.lower()]
    if not matches:
        return None
    key = max(matches, key=len)
    table = GPU_PEAK_TFLOPS[key]
    used = precision
    if precision == "fp32" and torch.backends.cudnn.allow_tf32 and "tf32" in table:
        used = "tf32"
    if used not in table:
        return None
    return table[used] * 1e12, f"{key} {used} dense datasheet peak"


def measure_sgemm(seconds: float = 1.0, size: int = 1024) -> float:
    """FLOP/s of fp32 matrix multiplication on the CPU with torch's current threads."""
    a = torch.randn(size, size)
    b = torch.randn(size, size)
    torch.mm(a, b)
    calls, start = 0, time.perf_counter()
    while True:
        torch.mm(a, b)
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            break
    return 2.0 * size ** 3 * calls / elapsed


def peak_flops(device, precision: str, peak_tflops: Optional[float] = None,
               measure_cpu: bool = True) -> Tuple[Optional[float], str]:
    """(peak FLOP/s or None, where it comes from) for the fraction-of-peak column."""
    if peak_tflops:
        return float(peak_tflops) * 1e12, "--peak-tflops"
    dev = torch.device(device)
    if dev.type == "cuda":
        name = gpu_name(dev) or "unknown GPU"
        found = gpu_peak(name, precision)
        if found is None:
            return None, f"{name} not in the built-in table: give --peak-tflops"
        return found
    if measure_cpu:
        return measure_sgemm(), "measured fp32 sgemm rate of this CPU (1024^3, torch threads)"
    return None, "no peak (CPU; give --peak-tflops)"


def reset_gpu_peak_memory(device: str) -> None:
    """Start a new peak-memory window on a CUDA device (nothing elsewhere)."""
    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats(torch.device(device))


def gpu_peak_memory(device: str) -> dict:
    """Peak GPU memory since the last reset, GiB: torch.cuda.max_memory_allocated / max_memory_reserved
    (empty off CUDA)."""
    if torch.device(device).type != "cuda":
        return {}
    dev = torch.device(device)
    return {"max_allocated_gib": torch.cuda.max_memory_allocated(dev) / 2 ** 30,
            "max_reserved_gib": torch.cuda.max_memory_reserved(dev) / 2 ** 30}

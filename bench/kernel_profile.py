"""Where a pipeline's time goes, kernel by kernel: torch.profiler over a few static batches.

`diffsmooth bench --profile DIR` runs this after the timed measurement, on the stages it has just
warmed (compiled graphs are reused; CUDA graph replays are bypassed so each kernel is visible), and
writes DIR/<run>.kernels.txt (profiler table) and DIR/<run>.kernels.json (top kernels, share of the
device time by kind: convolution, matmul, attention, fused elementwise/normalisation, other).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Dict, List

import torch
from torch.profiler import ProfilerActivity, profile

from diffsmooth.engine.certify.monte_carlo import MonteCarloPipeline

# Substrings of kernel names, first match wins (cuDNN/cuBLAS/CUTLASS/flash/Triton naming).
KINDS = (
    ("attention", ("flash", "fmha", "attention", "attn")),
    ("convolution", ("conv", "implicit_gemm", "xmma_fprop", "fprop", "winograd", "cudnn")),
    ("matmul", ("gemm", "cutlass", "cublas", "matmul", "bmm", "addmm", "fused_mm", "nvjet")),
    ("fused elementwise / normalisation (inductor)", ("triton",)),
)


FUSED = KINDS[-1][0]


def kind_of(name: str) -> str:
    """The kind of a kernel from its name (see KINDS); 'other' when nothing matches. inductor's generated
    pointwise / reduction kernels (triton_poi_, triton_red_, triton_per_) are fused elementwise work whatever
    their names list: they carry the aten ops they were fused from, and `convolution` there is a conv's bias
    add (the H200 profile of 2026-11-27 counted GroupNorm kernels as convolutions that way). Its templates
    (triton_tem_: autotuned convolutions and matmuls) are read by the rest of the name."""
    lowered = name.lower()
    if lowered.startswith("triton_") and not lowered.startswith("triton_tem"):
        return FUSED
    for kind, needles in KINDS:
        if any(n in lowered for n in needles):
            return kind
    return "other"


def _uncaptured(stage):
    """The compiled stage inside a CUDA graph wrapper (a replay hides its kernels from the profiler)."""
    return getattr(stage, "stage", stage)


def _device_time_us(event, device_type: str) -> float:
    """Self time of an averaged profiler event on the device (us); CPU time for CPU runs."""
    if device_type == "cuda":
        for attr in ("self_device_time_total", "self_cuda_time_total"):
            if hasattr(event, attr):
                return float(getattr(event, attr))
        return 0.0
    return float(event.self_cpu_time_total)


def _is_kernel(event, device_type: str) -> bool:
    """CUDA: device-side events only (an aten op also carries its kernels' time: counting both
    would count it twice). CPU: the aten / inductor ops, whose self times do not overlap."""
    if device_type == "cuda":
        return str(getattr(event, "device_type", "")).upper().endswith(("CUDA", "PRIVATEUSE1"))
    return event.key.startswith(("aten::", "cpp_fused", "graph_"))


def profile_pipeline(stages, sigma: float, x: torch.Tensor, batch: int, out_dir, label: str,
                     batches: int = 3, static_batch: bool = True, compiled_noise: bool = False,
                     top: int = 40) -> Dict:
    """Profile `batches` batches of one image through `stages`; writes the table and JSON, returns the JSON."""
    inner = dataclasses.replace(stages, purify=_uncaptured(stages.purify) if stages.purify is not None else None,
                                score=_uncaptured(stages.score))
    pipe = MonteCarloPipeline(inner, sigma, 0, static_batch=static_batch, compiled_noise=compiled_noise)
    device = inner.device
    pipe.count(x, 0, 0, batch, batch)                       # warm (shapes, autotuning, allocator)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        pipe.count(x, 0, batch, batches * batch, batch)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    events = prof.key_averages()
    rows: List[Dict] = []
    for e in events:
        t = _device_time_us(e, device.type)
        if t > 0 and _is_kernel(e, device.type):
            rows.append({"name": e.key, "calls": int(e.count), "self_us": t})
    total = sum(r["self_us"] for r in rows) or 1.0
    rows.sort(key=lambda r: -r["self_us"])
    by_kind: Dict[str, float] = {}
    for r in rows:
        r["share"] = r["self_us"] / total
        r["kind"] = kind_of(r["name"])
        by_kind[r["kind"]] = by_kind.get(r["kind"], 0.0) + r["share"]
    samples = batches * batch
    report = {"label": label, "device": str(device), "batch": batch, "batches": batches,
              "device_us_per_sample": total / samples, "share_by_kind": by_kind, "top": rows[:top],
              "note": "self device time of each kernel over the profiled batches (CUDA graphs bypassed); "
                      "on CPU, self CPU time of aten/inductor ops"}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    table = None
    keys = ("self_device_time_total", "self_cuda_time_total") if device.type == "cuda" else ()
    for sort_key in (*keys, "self_cpu_time_total"):       # the device key's name changed across torch versions
        try:
            table = events.table(sort_by=sort_key, row_limit=top)
            break
        except (AttributeError, KeyError, ValueError, TypeError):
            continue
    (out / f"{label}.kernels.txt").write_text((table or "(no profiler table)") + "\n")
    (out / f"{label}.kernels.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


def summary_lines(report: Dict) -> List[str]:
    """A few lines for the bench report: device time per sample and the share by kind."""
    kinds = ", ".join(f"{k} {100 * v:.0f}%" for k, v in sorted(report["share_by_kind"].items(), key=lambda kv: -kv[1]))
    return [f"kernel profile ({report['batches']} batches of {report['batch']}): "
            f"{report['device_us_per_sample']:.1f} us of kernel time per sample; {kinds}"]

"""ONNX Runtime backend: an exported graph (diffsmooth.export) as a Stage, with the session options
and execution providers for a device; onnxruntime is imported lazily so `import diffsmooth` works
without it. Which graphs a method needs is decided beside it, in stages.py."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

from diffsmooth.engine.choices import GRAPH_PRECISIONS
from diffsmooth.engine.errors import UserError, first_line

ORT_PRECISIONS = GRAPH_PRECISIONS
GPU_PROVIDERS = {"cuda": "CUDAExecutionProvider", "tensorrt": "TensorrtExecutionProvider"}


def _ort():
    try:
        import onnxruntime
    except ImportError:
        raise UserError("`backend` onnxruntime needs the onnxruntime package "
                        "(pip install 'diffsmooth-engine[onnx]', or onnxruntime-gpu for CUDA)") from None
    return onnxruntime


def physical_cores() -> int:
    """Physical cores usable by this process (hyper-threads do not help these dense kernels)."""
    try:
        usable = set(os.sched_getaffinity(0))
    except AttributeError:
        usable = set(range(os.cpu_count() or 1))
    cores = set()
    try:
        cpu, phys = None, "0"
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, val = line.partition(":")
                key, val = key.strip(), val.strip()
                if key == "processor":
                    cpu = int(val)
                elif key == "physical id":
                    phys = val
                elif key == "core id" and cpu in usable:
                    cores.add((phys, val))
    except (OSError, ValueError):
        pass
    return max(1, min(len(cores) or len(usable), len(usable)))


def session_options(threads: Optional[int] = None):
    """Threads = physical cores (or $DIFFSMOOTH_ORT_THREADS), sequential, ORT_ENABLE_ALL, no spinning
    (spinning workers starve the torch work between calls: 61 vs 85 samples/s; $DIFFSMOOTH_ORT_SPIN=1)."""
    ort = _ort()
    so = ort.SessionOptions()
    if not threads and os.environ.get("DIFFSMOOTH_ORT_THREADS", "").strip():
        try:
            threads = int(os.environ["DIFFSMOOTH_ORT_THREADS"])
        except ValueError:
            raise UserError(f"DIFFSMOOTH_ORT_THREADS must be an integer, got {os.environ['DIFFSMOOTH_ORT_THREADS']!r}") from None
    so.intra_op_num_threads = int(threads or physical_cores())
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    spin = os.environ.get("DIFFSMOOTH_ORT_SPIN", "0").strip() == "1"
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    return so


def providers_for(device: torch.device, provider: Optional[str] = None,
                  cache_dir: Optional[str] = None) -> List:
    """The execution-provider list for `device`; UserError when the needed one is not installed."""
    ort = _ort()
    available = ort.get_available_providers()
    if device.type == "cpu":
        if provider not in (None, "cpu"):
            raise UserError(f"execution provider {provider!r} needs `device` cuda")
        return ["CPUExecutionProvider"]
    if device.type != "cuda":
        raise UserError(f"`backend` onnxruntime runs on cpu or cuda, not {device.type}")
    provider = provider or "cuda"
    if provider not in GPU_PROVIDERS:
        raise UserError(f"execution provider must be one of {', '.join(GPU_PROVIDERS)}, got {provider!r}")
    name = GPU_PROVIDERS[provider]
    if name not in available:
        raise UserError(f"{name} is not available in this onnxruntime (have: {', '.join(available)}); "
                        "install onnxruntime-gpu (and TensorRT for the tensorrt provider)")
    index = device.index if device.index is not None else 0
    cuda = ("CUDAExecutionProvider", {"device_id": index, "cudnn_conv_algo_search": "EXHAUSTIVE",
                                      "do_copy_in_default_stream": True})
    if provider == "cuda":
        return [cuda, "CPUExecutionProvider"]
    trt = ("TensorrtExecutionProvider", {
        "device_id": index,
        "trt_engine_cache_enable": True,
        "trt_engine_cache_path": cache_dir or ".",
        "trt_timing_cache_enable": True,
        # Precision comes from the graph itself (fp16 graphs are explicitly typed); no fp16 flag.
    })
    return [trt, cuda, "CPUExecutionProvider"]


@dataclass(frozen=True)
class OrtSession:
    """How ONNX Runtime runs a graph: the execution provider (None: the device's) and intra-op threads (None: cores)."""

    provider: Optional[str] = None
    threads: Optional[int] = None


class OrtStage:
    """One ONNX graph as a Stage (fp32 torch tensors in/out on `device`). CPU goes through numpy
    without copies; CUDA binds device buffers with IO binding (where it has run: docs/status.md)."""

    def __init__(self, path, name: str, device="cpu", precision: str = "fp32",
                 provider: Optional[str] = None, threads: Optional[int] = None):
        ort = _ort()
        self.path = Path(path)
        self.name = name
        self.device = torch.device(device)
        self.precision = precision
        cache = self.path.parent / "trt_cache"
        requested = providers_for(self.device, provider, cache_dir=str(cache))
        if provider == "tensorrt":
            cache.mkdir(exist_ok=True)
        try:
            self.session = ort.InferenceSession(str(self.path), session_options(threads), providers=requested)
        except Exception as exc:  # onnxruntime raises its own exception types
            raise UserError(f"onnxruntime cannot load {self.path.name}: {first_line(exc)}") from None
        wanted = requested[0] if isinstance(requested[0], str) else requested[0][0]
        got = self.session.get_providers()
        if not got or got[0] != wanted:
            raise UserError(f"onnxruntime did not start {wanted} for {self.path.name} "
                            f"(session providers: {', '.join(got)}); refusing to fall back silently")
        self.providers = got
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_name = self.session.get_outputs()[0].name
        self._out_shape = [d if isinstance(d, int) else None for d in self.session.get_outputs()[0].shape]

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        if len(inputs) != len(self.input_names):
            raise UserError(f"{self.name} takes {len(self.input_names)} input(s) "
                            f"({', '.join(self.input_names)}), got {len(inputs)}")
        if self.device.type == "cuda":
            return self._run_cuda(inputs)
        feeds = {n: t.detach().to("cpu", torch.float32).contiguous().numpy()
                 for n, t in zip(self.input_names, inputs)}
        out = self.session.run([self.output_name], feeds)[0]
        return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32))

    def _output_shape(self, batch: int) -> Tuple[int, ...]:
        shape = list(self._out_shape)
        if shape and shape[0] is None:
            shape[0] = batch
        if any(d is None for d in shape):
            raise UserError(f"{self.path.name}: output shape {self._out_shape} is not static apart from the batch")
        return tuple(shape)

    def _run_cuda(self, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
        """IO binding of torch CUDA buffers (needs onnxruntime-gpu and a GPU)."""
        index = self.device.index if self.device.index is not None else 0
        tensors = [t.detach().to(self.device, torch.float32).contiguous() for t in inputs]
        out = torch.empty(self._output_shape(tensors[0].shape[0]), dtype=torch.float32, device=self.device)
        binding = self.session.io_binding()
        for name, t in zip(self.input_names, tensors):
            binding.bind_input(name, "cuda", index, np.float32, tuple(t.shape), t.data_ptr())
        binding.bind_output(self.output_name, "cuda", index, np.float32, tuple(out.shape), out.data_ptr())
        torch.cuda.current_stream(self.device).synchronize()   # inputs written by torch are ready
        self.session.run_with_iobinding(binding)              # ORT synchronises its stream at the end
        return out


# --------------------------------------------------------------------------------------------
# Picking graphs by manifest

"""TensorRT backend: a built engine file as a Stage, run with TensorRT's raw Python API (10.x):
`execute_async_v3` on torch's current CUDA stream, with torch-owned input/output buffers. torch
stays the CUDA layer (memory, streams, events, RNG), so no pycuda. `import tensorrt` happens only
in this module and in diffsmooth.export.trt_build, inside functions. Written to TensorRT's
documented API; where it has run: docs/status.md."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Tuple

import torch

from diffsmooth.engine.errors import UserError

INSTALL_HINT = "pip install 'diffsmooth-engine[tensorrt]' (TensorRT 10.x wheels need NVIDIA's package index)"


def tensorrt_available() -> Tuple[bool, str]:
    """(True, "tensorrt X on <GPU>") when TensorRT imports and a CUDA device is present; else
    (False, why). Used by bench/gpu_check.sh to decide whether to run the TensorRT checks."""
    try:
        import tensorrt as trt
    except ImportError as exc:
        return False, f"tensorrt is not installed ({exc})"
    except Exception as exc:  # noqa: BLE001 - a broken install (missing libnvinfer) raises OSError etc.
        return False, f"tensorrt fails to import: {type(exc).__name__}: {str(exc).strip().splitlines()[0]}"
    if not torch.cuda.is_available():
        return False, f"tensorrt {getattr(trt, '__version__', '?')} is installed but there is no CUDA device"
    return True, f"tensorrt {getattr(trt, '__version__', '?')} on {torch.cuda.get_device_name(0)}"


def import_tensorrt():
    """The tensorrt module, or a one-line UserError saying how to get it."""
    try:
        import tensorrt as trt
    except ImportError:
        raise UserError(f"TensorRT engine files need TensorRT: {INSTALL_HINT}") from None
    except Exception as exc:  # noqa: BLE001 - see tensorrt_available
        raise UserError(f"tensorrt fails to import ({type(exc).__name__}: "
                        f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}); check the install") from None
    return trt


def cuda_device(device) -> torch.device:
    """The CUDA device a TensorRT stage runs on; UserError on a CPU-only machine or a CPU device."""
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise UserError(f"unknown device {device!r}: use cuda or cuda:N") from None
    if dev.type != "cuda":
        raise UserError(f"`backend` tensorrt runs on a CUDA device; use `device` cuda (not {device!r})")
    if not torch.cuda.is_available():
        raise UserError("`backend` tensorrt needs a CUDA GPU, and this machine has none")
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    if dev.index >= torch.cuda.device_count():
        raise UserError(f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return dev


def gpu_identity(device: torch.device) -> Tuple[str, str]:
    """(GPU name, compute capability 'major.minor'): the part of an engine file's key that names the GPU."""
    props = torch.cuda.get_device_properties(device)
    return str(props.name), f"{props.major}.{props.minor}"


def _logger(trt):
    return trt.Logger(trt.Logger.WARNING)


def deserialize(trt, serialized: bytes, what: str):
    """ICudaEngine from an engine file's bytes; UserError when TensorRT refuses them (other version/GPU, damage)."""
    runtime = trt.Runtime(_logger(trt))
    try:
        engine = runtime.deserialize_cuda_engine(serialized)
    except Exception as exc:  # noqa: BLE001 - TensorRT raises plain RuntimeError/TypeError
        engine = None
        why = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    else:
        why = "TensorRT returned no engine"
    if engine is None:
        raise UserError(f"TensorRT cannot deserialize {what} ({why}); rebuild it with `diffsmooth build-engine`")
    return engine, runtime


class TrtStage:
    """One engine file as a Stage: fp32 tensors in/out on `device`. Each call enqueues on the stream that
    is current at call time (the pipeline may run stages inside `torch.cuda.stream(s)` blocks) and
    never synchronizes. One execution context per stream this stage has been called on: a context
    holds its activations, so two streams must not share one."""

    def __init__(self, engine_file_path, name: str, device, precision: str, trt=None):
        self.trt = trt or import_tensorrt()
        self.path = Path(engine_file_path)
        self.name = name
        self.device = torch.device(device)
        self.precision = precision
        self.engine, self._runtime = deserialize(self.trt, self.path.read_bytes(), self.path.name)
        io = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        mode_input = self.trt.TensorIOMode.INPUT
        self.input_names: List[str] = [n for n in io if self.engine.get_tensor_mode(n) == mode_input]
        outputs = [n for n in io if self.engine.get_tensor_mode(n) != mode_input]
        if len(outputs) != 1:
            raise UserError(f"{self.path.name} has {len(outputs)} outputs; a stage has exactly one")
        self.output_name = outputs[0]
        for n in io:
            if self.engine.get_tensor_dtype(n) != self.trt.DataType.FLOAT:
                raise UserError(f"{self.path.name}: tensor {n} is {self.engine.get_tensor_dtype(n)}, "
                                "stages take and return float32 (re-export the graph)")
        self.profile: Dict[str, Tuple[Tuple[int, ...], ...]] = {
            n: tuple(tuple(int(d) for d in s) for s in self.engine.get_tensor_profile_shape(n, 0))
            for n in self.input_names}
        self._contexts: Dict[int, object] = {}

    def _context(self, stream_handle: int):
        ctx = self._contexts.get(stream_handle)
        if ctx is None:
            ctx = self.engine.create_execution_context()
            if ctx is None:
                raise UserError(f"TensorRT could not create an execution context for {self.path.name} "
                                "(out of GPU memory?)")
            self._contexts[stream_handle] = ctx
        return ctx

    def check_inputs(self, inputs) -> None:
        """UserError unless the inputs fit the engine file's profile (count, batch range, static dims). An input whose
        profile fixes its first dimension (a reverse step's timestep and coefficients) is static: it is not a
        batch, and must have exactly the profile's shape."""
        if len(inputs) != len(self.input_names):
            raise UserError(f"{self.name} takes {len(self.input_names)} input(s) "
                            f"({', '.join(self.input_names)}), got {len(inputs)}")
        batched = [(n, t) for n, t in zip(self.input_names, inputs) if self.profile[n][0][0] != self.profile[n][2][0]]
        batch = {int(t.shape[0]) if t.dim() else -1 for _, t in batched}
        if len(batch) > 1:
            raise UserError(f"{self.name}: inputs have different batch sizes {sorted(batch)}")
        for n, t in zip(self.input_names, inputs):
            lo, _, hi = self.profile[n]
            shape = tuple(int(d) for d in t.shape)
            if lo == hi and shape != lo:
                raise UserError(f"{self.name}: input {n} has shape {list(shape)}, the engine file takes {list(lo)}")
            if len(shape) != len(lo) or shape[1:] != lo[1:]:
                raise UserError(f"{self.name}: input {n} has shape {list(shape)}, the engine file takes "
                                f"[batch, {', '.join(map(str, lo[1:]))}]")
            if not lo[0] <= shape[0] <= hi[0]:
                raise UserError(f"{self.name}: batch {shape[0]} is outside the engine file's profile "
                                f"[{lo[0]}, {hi[0]}]; rebuild with `diffsmooth build-engine --batch {shape[0]}`")

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        self.check_inputs(inputs)
        # Inputs made here are allocated on the current stream, so the caching allocator will not
        # hand their memory out before this stream has consumed them.
        tensors = [t.detach().to(self.device, torch.float32).contiguous() for t in inputs]
        stream = torch.cuda.current_stream(self.device)
        ctx = self._context(int(stream.cuda_stream))
        for n, t in zip(self.input_names, tensors):
            if not ctx.set_input_shape(n, tuple(t.shape)):
                raise UserError(f"{self.name}: TensorRT rejects shape {list(t.shape)} for input {n}")
            ctx.set_tensor_address(n, int(t.data_ptr()))
        out_shape = tuple(int(d) for d in ctx.get_tensor_shape(self.output_name))
        if any(d < 0 for d in out_shape):
            raise UserError(f"{self.name}: TensorRT could not infer the output shape ({list(out_shape)})")
        out = torch.empty(out_shape, dtype=torch.float32, device=self.device)
        ctx.set_tensor_address(self.output_name, int(out.data_ptr()))
        if not ctx.execute_async_v3(int(stream.cuda_stream)):
            raise RuntimeError(f"{self.name}: TensorRT execute_async_v3 failed (see TensorRT's log above)")
        return out


if __name__ == "__main__":     # `python -m diffsmooth.engine.backends.tensorrt.runner`: exit 0 iff usable
    usable, reason = tensorrt_available()
    print(reason)
    raise SystemExit(0 if usable else 1)

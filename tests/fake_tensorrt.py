"""A FAKE `tensorrt` module for CPU tests. It implements only the few calls the TensorRT stage makes
(Runtime.deserialize_cuda_engine, engine tensor queries, execution contexts, execute_async_v3) and
"runs" an engine file by reading its input buffers through their raw addresses and writing scale * x into
the output buffer. Tests using it prove the wiring (addresses, shapes, streams, errors) only, never
that real TensorRT behaves this way."""

from __future__ import annotations

import ctypes
import json
import types

import numpy as np


def _view(ptr: int, shape) -> np.ndarray:
    n = int(np.prod(shape))
    return np.ctypeslib.as_array((ctypes.c_float * n).from_address(ptr)).reshape(shape)


class FakeEngine:
    def __init__(self, spec: dict):
        self.spec = spec
        self.names = list(spec["inputs"]) + [spec["output"]]
        self.contexts = []

    @property
    def num_io_tensors(self):
        return len(self.names)

    def get_tensor_name(self, i):
        return self.names[i]

    def get_tensor_mode(self, name):
        return FAKE.TensorIOMode.INPUT if name in self.spec["inputs"] else FAKE.TensorIOMode.OUTPUT

    def get_tensor_dtype(self, name):
        return self.spec.get("dtypes", {}).get(name, FAKE.DataType.FLOAT)

    def get_tensor_profile_shape(self, name, profile_index):
        assert profile_index == 0
        return [tuple(s) for s in self.spec["inputs"][name]]

    def create_execution_context(self):
        ctx = FakeContext(self)
        self.contexts.append(ctx)
        return ctx


class FakeContext:
    def __init__(self, engine: FakeEngine):
        self.engine = engine
        self.shapes, self.addresses, self.streams = {}, {}, []

    def set_input_shape(self, name, shape):
        lo, _, hi = self.engine.spec["inputs"][name]
        ok = len(shape) == len(lo) and all(a <= s <= b for a, s, b in zip(lo, shape, hi))
        if ok:
            self.shapes[name] = tuple(shape)
        return ok

    def set_tensor_address(self, name, ptr):
        self.addresses[name] = ptr

    def get_tensor_shape(self, name):
        first = next(iter(self.engine.spec["inputs"]))
        return self.shapes.get(first, (-1,))

    def execute_async_v3(self, stream_handle):
        self.streams.append(stream_handle)
        first = next(iter(self.engine.spec["inputs"]))
        shape = self.shapes[first]
        scale = self.engine.spec.get("scale", 2.0)
        if self.engine.spec.get("gpu"):
            _gpu_scale(self.addresses[first], self.addresses[self.engine.spec["output"]], shape, scale,
                       stream_handle)
            return True
        x = _view(self.addresses[first], shape)
        out = _view(self.addresses[self.engine.spec["output"]], shape)
        out[...] = scale * x
        return True


def _gpu_scale(in_ptr: int, out_ptr: int, shape, scale: float, stream_handle: int) -> None:
    """Enqueue out = scale * x on the given CUDA stream through CuPy, from raw device pointers
    (as TensorRT would), without synchronizing."""
    import cupy
    n = int(np.prod(shape))

    def array(ptr):
        mem = cupy.cuda.UnownedMemory(ptr, n * 4, None)
        return cupy.ndarray(tuple(shape), cupy.float32, cupy.cuda.MemoryPointer(mem, 0))
    with cupy.cuda.ExternalStream(stream_handle):
        cupy.multiply(array(in_ptr), cupy.float32(scale), out=array(out_ptr))


class _Runtime:
    def __init__(self, logger):
        self.logger = logger

    def deserialize_cuda_engine(self, data: bytes):
        try:
            spec = json.loads(bytes(data).decode())
        except (UnicodeDecodeError, json.JSONDecodeError):
            return None                   # what TensorRT does with an engine file it cannot read
        return FakeEngine(spec)


class _Logger:
    WARNING = 2

    def __init__(self, severity):
        self.severity = severity


FAKE = types.ModuleType("tensorrt")
FAKE.__version__ = "10.99.0-fake"
FAKE.TensorIOMode = types.SimpleNamespace(INPUT="INPUT", OUTPUT="OUTPUT")
FAKE.DataType = types.SimpleNamespace(FLOAT="FLOAT", HALF="HALF")
FAKE.Runtime = _Runtime
FAKE.Logger = _Logger


def fake_engine_file(inputs: dict, output: str = "y", scale: float = 2.0, dtypes=None, gpu: bool = False) -> bytes:
    """Bytes the fake runtime deserializes: {input: (min, opt, max) shapes}; gpu: buffers are CUDA
    device pointers (the fake then computes with CuPy on the stream it is given)."""
    return json.dumps({"inputs": {k: [list(s) for s in v] for k, v in inputs.items()}, "output": output,
                       "scale": scale, "dtypes": dtypes or {}, "gpu": gpu}).encode()

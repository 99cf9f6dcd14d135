"""The one place a backend's name becomes its class: the backends a run builds its stages on, one folder each behind
engine/stages/base.py's `StageBackend`: `torch` (the models in eager or compiled torch), `onnxruntime` (the graphs
of `diffsmooth export`), `tensorrt` (the engine files of `diffsmooth build-engine`). A run, its fast path's defaults, the
Python API and `diffsmooth bench` all ask `stage_backend(name)`; the rest of the product asks the backend object
(`runs_modules`, `accepts_torch_options`, ...), never compares its name."""

from __future__ import annotations

from typing import Dict

from diffsmooth.engine.backends.onnxruntime.backend import OnnxRuntimeBackend
from diffsmooth.engine.backends.tensorrt.backend import TensorRTBackend
from diffsmooth.engine.backends.torch.backend import TorchBackend
from diffsmooth.engine.choices import BACKENDS
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.stages.base import StageBackend

STAGE_BACKENDS: Dict[str, StageBackend] = {b.name: b for b in (TorchBackend(), OnnxRuntimeBackend(), TensorRTBackend())}


def stage_backend(name: str) -> StageBackend:
    """The backend called `name`; an unknown one is refused in one line."""
    if name not in STAGE_BACKENDS:
        raise UserError(f"unknown backend {name!r}: choose one of {', '.join(BACKENDS)}")
    return STAGE_BACKENDS[name]

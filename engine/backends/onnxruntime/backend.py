"""The onnxruntime backend as a run sees it (engine/stages/base.py's StageBackend)."""

from __future__ import annotations

from diffsmooth.engine.backends.exported import ExportedBackend
from diffsmooth.engine.backends.onnxruntime.runner import OrtSession
from diffsmooth.engine.backends.onnxruntime.stages import build_onnx_stages


class OnnxRuntimeBackend(ExportedBackend):
    """The graphs of `diffsmooth export`, run by ONNX Runtime; its fast path: none of it (the graphs run as
    exported)."""

    name = "onnxruntime"
    needs = "graphs from `diffsmooth export`"

    def load(self, config, sources, image_shape, num_classes, build):
        return build_onnx_stages(build.onnx_dir, config, image_shape, num_classes, device=build.device,
                                 precision=build.precision, session=OrtSession(threads=build.threads),
                                 classifier=sources.classifier)

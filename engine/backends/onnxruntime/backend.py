"""The onnxruntime backend as a run sees it (engine/stages/base.py's StageBackend)."""

from __future__ import annotations

from diffsmooth.engine.backends.exported import ExportedBackend
from diffsmooth.engine.backends.onnxruntime.runner import OrtSession
from diffsmooth.engine.backends.onnxruntime.stages import graph_stages, onnx_graphs


class OnnxRuntimeBackend(ExportedBackend):
    """The graphs of `diffsmooth export`, run by ONNX Runtime; its fast path: none of it (the graphs run as
    exported)."""

    name = "onnxruntime"
    needs = "graphs from `diffsmooth export`"

    def load(self, config, sources, image_shape, num_classes, build, sweep=None):
        graphs = onnx_graphs(build.onnx_dir, build.device, build.precision, OrtSession(threads=build.threads),
                             sources.classifier)
        return graph_stages(config, image_shape, num_classes, build.precision, *graphs, sweep)

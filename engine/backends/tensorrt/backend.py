"""The tensorrt backend as a run sees it (engine/stages/base.py's StageBackend)."""

from __future__ import annotations

from diffsmooth.engine.backends.exported import ExportedBackend
from diffsmooth.engine.backends.onnxruntime.stages import graph_stages
from diffsmooth.engine.backends.tensorrt.stages import trt_graphs


class TensorRTBackend(ExportedBackend):
    """The engine files `diffsmooth build-engine` built from the exported graphs, for the run's batch."""

    name = "tensorrt"
    needs = "graphs from `diffsmooth export`, engine files from `diffsmooth build-engine`"

    def fast_path_defaults(self, cuda: bool, compile, asked: dict) -> dict:
        """Static batches (engine files are built for the run's batch) and, on CUDA, two streams."""
        return {"static_batch": True, "streams": 2 if cuda else 1}

    def load(self, config, sources, image_shape, num_classes, build, sweep=None):
        graphs = trt_graphs(build.onnx_dir, build.device, build.precision, build.batch, sources.classifier)
        return graph_stages(config, image_shape, num_classes, build.precision, *graphs, sweep)

"""Which TensorRT engine files serve a method config: the ONNX graphs are picked exactly as for ONNX
Runtime (same manifest lookup), then the engine file built from each graph for this GPU, TensorRT version
and batch; backend.py composes the stages as ONNX Runtime's (onnxruntime/stages.py's graph_stages)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from diffsmooth.engine.backends.onnxruntime.stages import exported_from
from diffsmooth.engine.backends.tensorrt.engine_files import choose_engine_file, scan_engine_files
from diffsmooth.engine.backends.tensorrt.runner import TrtStage, cuda_device, gpu_identity, import_tensorrt
from diffsmooth.engine.choices import GRAPH_PRECISIONS
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.stages.manifests import find_graph, scan_manifests

TRT_PRECISIONS = GRAPH_PRECISIONS


@dataclass(frozen=True)
class EngineFileKey:
    """What a TensorRT engine file must be built for: this TensorRT, this GPU (name, compute capability), the run's batch."""

    tensorrt_version: str
    gpu_name: str
    compute_capability: str
    batch: int


def engine_file_for(onnx_dir, role: str, want: dict, precision: str, key: EngineFileKey,
                    classifier: Optional[str] = None):
    """(engine file path, its manifest, graph manifest) for the graph of `role` matching `want` (a classifier
    graph exported from `classifier`, when given), its engine file built for `key`."""
    path, manifest = find_graph(exported_from(scan_manifests(onnx_dir), classifier), role, want, onnx_dir)
    engine_files = scan_engine_files(onnx_dir, manifest["onnx_sha256"], precision)
    engine_file, engine_file_manifest = choose_engine_file(
        engine_files, tensorrt_version=key.tensorrt_version, gpu_name=key.gpu_name,
        compute_capability=key.compute_capability, batch=key.batch, graph_name=path.name, onnx_dir=onnx_dir)
    validation = engine_file_manifest.get("validation")
    if isinstance(validation, dict) and validation.get("passed") is False:
        raise UserError(f"{engine_file.name} failed validation ({validation.get('summary', 'see its manifest')}); "
                        "rebuild it or use `backend` onnxruntime")
    return engine_file, engine_file_manifest, manifest


def trt_graphs(onnx_dir, device: str = "cuda", precision: str = "fp32", batch: int = 1000,
               classifier: Optional[str] = None):
    """(pick, load) for graph_stages: the engine files built beside the graphs in `onnx_dir` for this GPU, TensorRT and
    batch (engine_file_for), run as TrtStages."""
    if precision not in TRT_PRECISIONS:
        raise UserError(f"`backend` tensorrt runs engine files built from the fp32 or fp16 graphs, not {precision}")
    trt = import_tensorrt()
    dev = cuda_device(device)
    gpu_name, cc = gpu_identity(dev)
    key = EngineFileKey(str(trt.__version__), gpu_name, cc, int(batch))
    pick = lambda role, want: engine_file_for(onnx_dir, role, want, precision, key,
                                              classifier if role == "classifier" else None)[::2]
    return pick, lambda engine_file, label: TrtStage(engine_file, label, dev, precision, trt)


"""Base-classifier stages from exported graphs: which denoiser and classifier graph a method
config needs (manifest fields), loaded as ONNX Runtime stages and probed once."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Tuple

import torch

from diffsmooth.engine.backends.exported import SweepGraphs
from diffsmooth.engine.backends.onnxruntime.runner import ORT_PRECISIONS, OrtSession, OrtStage
from diffsmooth.engine.backends.torch.stages import method_stages
from diffsmooth.engine.base_classifier.methods import MethodConfig
from diffsmooth.engine.base_classifier.probe import probed, refuse_too_few_classes
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.hashing import sha256_file
from diffsmooth.engine.stages.base import BaseClassifierStages
from diffsmooth.engine.stages.manifests import find_graph, scan_manifests


def wanted_fields(config: MethodConfig, image_shape, precision: str) -> Tuple[dict, dict]:
    """Manifest fields the denoiser and the classifier graph must have for `config`."""
    shape = [int(s) for s in image_shape]
    denoiser = {**config.purifier.lookup(config.sigma, config.name), "image_shape": shape, "precision": precision}
    classifier = {"method": config.name, "sigma": float(config.sigma), "image_shape": shape,
                  "precision": precision}
    classifier.update({k: v for k, v in config.method.graph_fields(config).items() if v is not None})
    return denoiser, classifier


def exported_from(found: List[Tuple[Path, dict]], checkpoint: Optional[str]) -> List[Tuple[Path, dict]]:
    """The graphs, less the classifier graphs exported from another checkpoint than `checkpoint` (by
    sha256; a sweep over several classifiers picks each one's graph); all of them when None."""
    if not checkpoint:
        return found
    digest = sha256_file(checkpoint)
    return [(p, m) for p, m in found
            if m.get("role") != "classifier" or (m.get("source") or {}).get("sha256") in (None, digest)]


def onnx_graphs(onnx_dir, device: str = "cpu", precision: str = "fp32", session: OrtSession = OrtSession(),
                classifier: Optional[str] = None):
    """(pick, load) for graph_stages: the graphs in `onnx_dir` picked and hash-checked via their manifests (the
    classifier graph exported from `classifier`, when several are), run by ONNX Runtime as `session` says."""
    if precision not in ORT_PRECISIONS:
        raise UserError(f"`backend` onnxruntime runs the exported fp32 or fp16 graphs, not {precision}")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise UserError(f"unknown device {device!r}: use cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"device {device!r} requested but CUDA is not available on this machine")
    found = exported_from(scan_manifests(onnx_dir), classifier)
    return (lambda role, want: find_graph(found, role, want, onnx_dir),
            lambda path, label: OrtStage(path, label, dev, precision, session.provider, session.threads))


def build_onnx_stages(onnx_dir, config: MethodConfig, image_shape, num_classes: Optional[int] = None,
                      device: str = "cpu", precision: str = "fp32", session: OrtSession = OrtSession(),
                      classifier: Optional[str] = None) -> BaseClassifierStages:
    """Stages for `config` from the graphs in `onnx_dir` (onnx_graphs), probed once."""
    return graph_stages(config, image_shape, num_classes, precision,
                        *onnx_graphs(onnx_dir, device, precision, session, classifier))


def graph_stages(config: MethodConfig, image_shape, num_classes: Optional[int], precision: str, pick,
                 load, sweep: Optional[SweepGraphs] = None) -> BaseClassifierStages:
    """Stages for `config` from exported files, on either exported backend (the one composition ONNX Runtime and
    TensorRT share): `pick(role, want)` gives (the file, its graph's manifest) of the graph of `role` whose manifest
    has the fields `want` (ONNX Runtime: the graph; TensorRT: the engine file built from it); `load(file, label)` the stage
    that runs it; the stages are probed once and their classes checked against the data. In a sweep (`sweep`), the
    graphs it shares are picked and opened once and the stages are left for the sweep's one probe."""
    if sweep is not None:
        pick, load = sweep.pick(pick), sweep.load(load)
    want_denoiser, want_classifier = wanted_fields(config, image_shape, precision)
    purify = None
    if config.purifier.purifies:
        path, manifest = pick("denoiser", want_denoiser)
        purify = config.purifier.exported_stage(config.sigma, load(path, f"denoiser[{path.name}]"), manifest)
    path, manifest = pick("classifier", want_classifier)
    refuse_too_few_classes(path.name, manifest.get("num_classes"), num_classes)
    score = load(path, f"{config.method.head.label}[{path.name}]")
    local_shape = config.head.fresh_noise_shape(image_shape)       # the classifier's inputs fit the local-noise mode
    if len(score.input_names) != (2 if local_shape else 1):
        wanted = "the purified samples and the fresh local noises" if local_shape else "the purified samples alone"
        raise UserError(f"{path.name} takes inputs {score.input_names}, but {config.name}'s head at these settings "
                        f"feeds it {wanted}: export the classifier again with these settings")
    stages = method_stages(config, purify, score, tuple(image_shape), num_classes)
    return probed(stages, tuple(image_shape), num_classes, path.name) if sweep is None else stages

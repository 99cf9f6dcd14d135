"""TensorRT engine files vs ONNX Runtime fp32 on the pipeline's noisy real samples (the same
compare_stages as `diffsmooth validate`): output errors and >= 99.9% argmax-vote agreement;
results go into the engine file manifests. Needs TensorRT and a GPU (docs/status.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Dict, Optional, Sequence

import torch

from diffsmooth.engine.backends.onnxruntime.runner import OrtStage
from diffsmooth.engine.backends.onnxruntime.stages import wanted_fields
from diffsmooth.engine.backends.tensorrt.engine_files import read_engine_file_manifest, write_engine_file_manifest
from diffsmooth.engine.backends.tensorrt.runner import TrtStage, cuda_device
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.stages.manifests import find_graph, scan_manifests

from .validate import (
    DEFAULT_IMAGES,
    DEFAULT_SAMPLES,
    ValidationFailed,
    compare_stages,
    paired_graphs,
    validation_images,
)

MIN_SAMPLES = 1000


class _OnHost:
    """A stage whose output comes back to the CPU (the ONNX Runtime reference runs there)."""

    def __init__(self, stage):
        self.stage = stage
        self.name, self.precision = stage.name, stage.precision
        self.device = torch.device("cpu")           # where its outputs are (a chain around it works there)

    def __call__(self, *inputs):
        return self.stage(*inputs).float().cpu()


def _record(engine_file_path: Path, result: dict) -> None:
    manifest, why = read_engine_file_manifest(engine_file_path)
    if manifest is None:
        raise UserError(f"cannot record validation of {engine_file_path.name}: {why}")
    for k in ("format", "version", "plan_file"):
        manifest.pop(k, None)
    manifest["validation"] = result
    write_engine_file_manifest(engine_file_path, manifest)


def validate_engine_files(results: Sequence, onnx_dir, *, device="cuda", samples: int = DEFAULT_SAMPLES,
                          seed: int = 0, dataset: Optional[str] = None, data: Optional[str] = None,
                          threads: Optional[int] = None, stage_fn: Optional[Callable] = None,
                          reference_fn: Optional[Callable] = None,
                          echo: Callable[[str], None] = print) -> Dict[str, dict]:
    """Validate built engine files (EngineFileResults) against the fp32 ONNX graphs run by ONNX Runtime on the
    CPU; each classifier engine file is checked chained behind the denoiser's of its precision and sigma.
    Raises ValidationFailed (non-zero exit) when any engine file fails."""
    if samples < MIN_SAMPLES:
        raise UserError(f"engine file validation needs >= {MIN_SAMPLES} noisy samples, got --samples {samples}")
    if stage_fn is None:
        dev = cuda_device(device)
        stage_fn = lambda engine_file, name, precision: _OnHost(TrtStage(engine_file, name, dev, precision))  # noqa: E731
    reference_fn = reference_fn or (lambda path, name: OrtStage(path, name, "cpu", "fp32", threads=threads))
    found = scan_manifests(onnx_dir)
    out: Dict[str, dict] = {}
    failed = []
    for config, shape, den, cls in paired_graphs(results, lambda r: r.graph_manifest):
        want_den, want_cls = wanted_fields(config, shape, "fp32")
        reference = {"purify": None, "score": None}
        candidate = {"purify": None, "score": None}
        local_shape = None
        batch = 100
        if den is not None:
            ref_path, ref_manifest = find_graph(found, "denoiser", want_den, onnx_dir)
            reference["purify"] = config.purifier.exported_stage(
                config.sigma, reference_fn(ref_path, "denoiser (ONNX Runtime fp32)"), ref_manifest)
            candidate["purify"] = config.purifier.exported_stage(
                config.sigma, stage_fn(den.engine_file_path, "denoiser (TensorRT)", den.precision), den.graph_manifest)
            batch = min(batch, _max_batch(den))
        if cls is not None:
            ref_path, _ = find_graph(found, "classifier", want_cls, onnx_dir)
            reference["score"] = reference_fn(ref_path, "classifier (ONNX Runtime fp32)")
            candidate["score"] = stage_fn(cls.engine_file_path, "classifier (TensorRT)", cls.precision)
            batch = min(batch, _max_batch(cls))
            local_shape = config.head.fresh_noise_shape(shape)
        if den is not None and reference["purify"] is None:
            raise UserError(f"no fp32 denoiser graph in {onnx_dir} to validate {den.engine_file_path.name} against")
        precision = (cls or den).precision
        images, indices, desc = validation_images(shape, DEFAULT_IMAGES, dataset, data)
        res = compare_stages(precision=precision, sigma=config.sigma, image_shape=shape, reference=reference,
                             candidate=candidate, local_noise_shape=local_shape, samples=samples, seed=seed,
                             batch=batch, images=images, image_indices=indices, images_desc=desc,
                             purify_noise=den is not None and config.method.purifier.draws_noise)
        res["reference"] = "onnxruntime fp32 (cpu)"
        for r in (den, cls):
            if r is not None:
                _record(r.engine_file_path, res)
                out[str(r.engine_file_path)] = res
        state = "ok  " if res["passed"] else "FAIL"
        names = " + ".join(r.engine_file_path.name for r in (den, cls) if r is not None)
        echo(f"{state} {names}: {res['summary']}")
        if not res["passed"]:
            failed.append(f"{names}: {res['summary']}")
    if failed:
        raise ValidationFailed("TensorRT engine file validation failed (" + "; ".join(failed) + "); results are in "
                               "the engine file manifests, and --backend tensorrt refuses these engine files")
    return out


def _max_batch(r) -> int:
    profile = (r.manifest.get("key") or {}).get("profile") or {}
    batched = [p for p in profile.values() if not p.get("static")]
    return int(batched[0]["max"][0]) if batched else 1

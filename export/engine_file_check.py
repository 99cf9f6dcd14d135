"""Build or reuse TensorRT engine files, print their inspection and validate their votes: the step
`diffsmooth export --trt` and `diffsmooth build-engine` share; and the validation report lines."""

from __future__ import annotations

from pathlib import Path

from diffsmooth.engine.backends.tensorrt.engine_files import DEFAULT_WORKSPACE_BYTES
from diffsmooth.engine.errors import UserError
from diffsmooth.export.trt_build import build_engine_files
from diffsmooth.export.trt_validate import MIN_SAMPLES, validate_engine_files
from diffsmooth.export.validate import ValidationFailed


def result_lines(results) -> list:
    """One `ok  name: summary` / `FAIL name: summary` line per validated graph or engine file."""
    return [f"{'ok  ' if r['passed'] else 'FAIL'} {Path(path).name}: {r['summary']}" for path, r in results.items()]


def raise_if_failed(results) -> None:
    failed = [f"{Path(p).name}: {r['summary']}" for p, r in results.items() if not r["passed"]]
    if failed:
        raise ValidationFailed("ONNX validation failed (" + "; ".join(failed) + "); results are in the manifests")


def build_and_validate(onnx_dir, target, *, echo, err, batch, max_batch=None, precisions=None, only=None,
                       workspace_bytes=None, timing_cache=None, rebuild=False, validate=True, samples=1000,
                       seed=0, dataset=None, data=None, device="cuda"):
    """Build/reuse the engine files, print their inspection (`echo`: stdout, `err`: stderr), validate them;
    ValidationFailed on any failure. The batches were checked by the command's options."""
    if workspace_bytes is not None and workspace_bytes < (1 << 20):
        raise UserError(f"--workspace-gb must allow at least 1 MiB, got {workspace_bytes} bytes")
    if validate and samples < MIN_SAMPLES:
        raise UserError(f"engine file validation needs --samples >= {MIN_SAMPLES} (got {samples}), or --no-validate")
    results = build_engine_files(onnx_dir, target, batch=batch, max_batch=max_batch, precisions=precisions,
                                 only=only, workspace_bytes=workspace_bytes or DEFAULT_WORKSPACE_BYTES,
                                 timing_cache=timing_cache, rebuild=rebuild, echo=err)
    for r in results:
        echo(f"engine file {r.engine_file_path}")
    bad = [f"{r.engine_file_path.name}: {'; '.join(r.inspection.get('failures', []))}" for r in results
           if r.inspection and not r.inspection.get("passed", True)]
    if validate:
        validate_engine_files(results, onnx_dir, device=device, samples=samples, seed=seed, dataset=dataset,
                              data=data, echo=err)
    else:
        err("engine file validation skipped (--no-validate): engine file manifests record validation: null")
    if bad:
        raise ValidationFailed("TensorRT engine file precision is not as intended (" + " | ".join(bad) + ")")

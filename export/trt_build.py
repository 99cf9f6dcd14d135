"""Building TensorRT engine files (serialized engines) from the exported, validated ONNX graphs, with NVIDIA's
Polygraphy loaders: a strongly typed network (precision comes from the graph: fp16 graphs give fp16 engine files), one
optimisation profile (batch 1..max, opt = the run's batch), a workspace limit, a persistent timing
cache per GPU model, detailed profiling verbosity for inspection. Engine files are cached beside the graph
and rebuilt (with one line saying why) whenever their key no longer matches or they fail to load.

tensorrt and polygraphy are imported inside the functions that need them. This path is written to
the documented APIs; the cache logic around it is tested with injected build/load functions. Where
it has run: docs/status.md."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from diffsmooth.engine.backends.tensorrt.engine_files import (
    DEFAULT_WORKSPACE_BYTES,
    ENGINE_FILE_MANIFEST_FORMAT,
    cache_key,
    engine_file_manifest_path,
    engine_file_path_for,
    gpu_slug,
    profile_for,
    read_engine_file_manifest,
    reuse_decision,
    write_engine_file_manifest,
)
from diffsmooth.engine.backends.tensorrt.runner import cuda_device, gpu_identity, import_tensorrt
from diffsmooth.engine.errors import UserError, first_line
from diffsmooth.engine.hashing import sha256_file
from diffsmooth.engine.stages.manifests import scan_manifests, verify_hashes, write_json

from .manifest import package_versions
from .trt_inspect import format_report, summarize

BUILD_ROLES = ("denoiser", "classifier")       # the graphs the pipeline runs (the bare UNet is not one)


@dataclass
class Target:
    """What an engine file is built for: TensorRT version and GPU (name, compute capability)."""

    tensorrt_version: str
    gpu_name: str
    compute_capability: str


@dataclass
class EngineFileResult:
    """One engine file after `ensure_engine_file`: where it is, its manifest, whether it was (re)built and why."""

    onnx_path: Path
    engine_file_path: Path
    role: str
    precision: str
    graph_manifest: dict
    manifest: dict
    built: bool
    reason: str = ""
    inspection: dict = field(default_factory=dict)


def default_timing_cache(target: Target, cache_dir: Optional[str] = None) -> Path:
    """One persistent timing cache per GPU model and TensorRT version (tactic timings do not carry
    across either): $DIFFSMOOTH_TRT_CACHE_DIR or ~/.cache/diffsmooth/tensorrt."""
    base = Path(cache_dir or os.environ.get("DIFFSMOOTH_TRT_CACHE_DIR") or
                Path.home() / ".cache" / "diffsmooth" / "tensorrt")
    cc = target.compute_capability.replace(".", "")
    return base / f"timing-{gpu_slug(target.gpu_name)}-sm{cc}-trt{target.tensorrt_version}.cache"


def current_target(device) -> Target:
    """The Target of this machine's GPU `device` (UserError without TensorRT or CUDA)."""
    trt = import_tensorrt()
    name, cc = gpu_identity(cuda_device(device))
    return Target(str(trt.__version__), name, cc)


# --------------------------------------------------------------------------------------------
# The TensorRT calls (Polygraphy loaders; the raw inspector API)


def polygraphy_build(onnx_path, profile: Dict[str, dict], *, workspace_bytes: int, timing_cache: Path) -> bytes:
    """Serialized engine (an engine file's bytes) for `onnx_path`: Polygraphy NetworkFromOnnxPath(strongly_typed) ->
    CreateConfig(profile, workspace, timing cache, detailed verbosity; TF32 off) ->
    EngineBytesFromNetwork, which merges the new timings back into the cache file."""
    trt = import_tensorrt()
    try:
        from polygraphy.backend.trt import CreateConfig, EngineBytesFromNetwork, NetworkFromOnnxPath, Profile
        from polygraphy.exception import PolygraphyException
    except ImportError:
        raise UserError("building TensorRT engine files needs Polygraphy: pip install 'diffsmooth-engine[tensorrt]'") from None
    trt_profile = Profile()
    for name, shapes in profile.items():
        trt_profile.add(name, min=tuple(shapes["min"]), opt=tuple(shapes["opt"]), max=tuple(shapes["max"]))
    timing_cache.parent.mkdir(parents=True, exist_ok=True)
    network = NetworkFromOnnxPath(str(onnx_path), strongly_typed=True)
    config = CreateConfig(profiles=[trt_profile],
                          memory_pool_limits={trt.MemoryPoolType.WORKSPACE: int(workspace_bytes)},
                          load_timing_cache=str(timing_cache) if timing_cache.exists() else None,
                          profiling_verbosity=trt.ProfilingVerbosity.DETAILED)
    try:
        return bytes(EngineBytesFromNetwork(network, config=config, save_timing_cache=str(timing_cache))())
    except PolygraphyException as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else "see TensorRT's log above"
        raise UserError(f"TensorRT could not build an engine file from {Path(onnx_path).name}: {first}") from None


def polygraphy_load(serialized: bytes):
    """ICudaEngine from an engine file's bytes (Polygraphy EngineFromBytes); UserError when they do not load."""
    import_tensorrt()
    from polygraphy.backend.trt import EngineFromBytes
    from polygraphy.exception import PolygraphyException
    try:
        engine = EngineFromBytes(serialized)()
    except PolygraphyException as exc:
        raise UserError(f"TensorRT cannot deserialize the engine file ({str(exc).strip().splitlines()[0]})") from None
    if engine is None:
        raise UserError("TensorRT cannot deserialize the engine file")
    return engine


def inspector_json(engine, profile: Dict[str, dict]) -> dict:
    """Engine inspector JSON (detailed). Tensor formats of a dynamic-shape engine are only reported
    for concrete shapes, so an execution context is set to the profile's opt shapes first."""
    trt = import_tensorrt()
    inspector = engine.create_engine_inspector()
    context = engine.create_execution_context()
    if context is not None:
        for name, shapes in profile.items():
            context.set_input_shape(name, tuple(shapes["opt"]))
        inspector.execution_context = context
    return json.loads(inspector.get_engine_information(trt.LayerInformationFormat.JSON))


# --------------------------------------------------------------------------------------------
# The cache


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def ensure_engine_file(onnx_path, graph_manifest: dict, target: Target, *, batch: int,
                       max_batch: Optional[int] = None, workspace_bytes: int = DEFAULT_WORKSPACE_BYTES,
                       timing_cache: Optional[Path] = None, rebuild: bool = False, echo: Callable[[str], None] = print,
                       build_fn: Callable = polygraphy_build, load_fn: Callable = polygraphy_load,
                       inspect_fn: Callable = inspector_json) -> EngineFileResult:
    """The engine file of one graph for `target` and batch: reused when its key matches, its bytes are the
    recorded ones and TensorRT deserializes them; otherwise rebuilt, with one line saying why."""
    onnx_path = Path(onnx_path)
    precision = graph_manifest.get("precision")
    profile = profile_for(graph_manifest.get("inputs") or {}, batch, max_batch)
    key = cache_key(onnx_sha256=graph_manifest["onnx_sha256"], tensorrt_version=target.tensorrt_version,
                    gpu_name=target.gpu_name, compute_capability=target.compute_capability,
                    profile=profile, precision=precision)
    engine_file = engine_file_path_for(onnx_path, target.gpu_name, target.compute_capability, profile)
    reuse, why = reuse_decision(engine_file, key, sha256_file)
    if rebuild:
        reuse, why = False, "--rebuild"
    if reuse:
        try:
            load_fn(engine_file.read_bytes())
        except Exception as exc:  # noqa: BLE001 - a bad engine file is rebuilt, never a crash
            reuse, why = False, f"{engine_file.name} fails to deserialize ({first_line(exc)})"
    if reuse:
        manifest, _ = read_engine_file_manifest(engine_file)
        echo(f"reusing {engine_file.name} (key matches)")
        return EngineFileResult(onnx_path, engine_file, graph_manifest.get("role"), precision, graph_manifest,
                                manifest, False, "key matches", manifest.get("inspection") or {})
    echo(f"building {engine_file.name}: {why}")
    timing_cache = Path(timing_cache) if timing_cache else default_timing_cache(target)
    manifest_file = engine_file_manifest_path(engine_file)
    if manifest_file.exists():                # never leave an old manifest vouching for new bytes
        manifest_file.unlink()
    start = time.perf_counter()
    data = build_fn(onnx_path, profile, workspace_bytes=int(workspace_bytes), timing_cache=timing_cache)
    seconds = time.perf_counter() - start
    _atomic_write_bytes(engine_file, data)
    engine = load_fn(data)
    info = inspect_fn(engine, profile)
    inspection_file = engine_file.with_suffix(".layers.json")
    write_json(inspection_file, info, indent=1)
    output = (graph_manifest.get("output") or {}).get("name")
    inspection = summarize(info, precision, [output] if output else ())
    for line in format_report(engine_file.name, inspection):
        echo(line)
    fields = {
        "key": key,
        "onnx_file": onnx_path.name,
        "role": graph_manifest.get("role"),
        "plan_sha256": sha256_file(engine_file),
        "plan_bytes": len(data),
        "build": {"strongly_typed": True, "workspace_bytes": int(workspace_bytes), "timing_cache": str(timing_cache),
                  "profiling_verbosity": "DETAILED", "tf32": False, "seconds": round(seconds, 3),
                  "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
        "versions": package_versions(("diffsmooth-engine", "tensorrt", "polygraphy", "torch")),
        "inspector_file": inspection_file.name,
        "inspection": {k: v for k, v in inspection.items() if k != "layers"},
        "validation": None,
    }
    write_engine_file_manifest(engine_file, fields)
    return EngineFileResult(onnx_path, engine_file, graph_manifest.get("role"), precision, graph_manifest,
                            dict(fields, format=ENGINE_FILE_MANIFEST_FORMAT), True, why, inspection)


def graphs_to_build(onnx_dir, precisions: Optional[Sequence[str]] = None, only: Optional[Sequence] = None):
    """(path, manifest) of the denoiser/classifier graphs in `onnx_dir` to build engine files for: hashes
    checked, graphs that failed ONNX validation refused."""
    found = [(p, m) for p, m in scan_manifests(onnx_dir) if m.get("role") in BUILD_ROLES]
    if precisions:
        found = [(p, m) for p, m in found if m.get("precision") in precisions]
    if only is not None:
        wanted = {Path(p).resolve() for p in only}
        found = [(p, m) for p, m in found if p.resolve() in wanted]
    if not found:
        which = f" at precision {', '.join(precisions)}" if precisions else ""
        raise UserError(f"no denoiser/classifier graphs{which} in {onnx_dir} to build TensorRT engine files from")
    for p, m in found:
        verify_hashes(p, m)
        v = m.get("validation")
        if isinstance(v, dict) and v.get("passed") is False:
            raise UserError(f"{p.name} failed ONNX validation ({v.get('summary', 'see its manifest')}); "
                            "fix the export before building an engine file from it")
    return found


def build_engine_files(onnx_dir, target: Target, *, batch: int, max_batch: Optional[int] = None,
                       precisions: Optional[Sequence[str]] = None, only: Optional[Sequence] = None,
                       workspace_bytes: int = DEFAULT_WORKSPACE_BYTES, timing_cache: Optional[Path] = None,
                       rebuild: bool = False, echo: Callable[[str], None] = print, **fns) -> List[EngineFileResult]:
    """ensure_engine_file for every graph the pipeline runs in `onnx_dir`."""
    return [ensure_engine_file(p, m, target, batch=batch, max_batch=max_batch, workspace_bytes=workspace_bytes,
                               timing_cache=timing_cache, rebuild=rebuild, echo=echo, **fns)
            for p, m in graphs_to_build(onnx_dir, precisions, only)]

"""TensorRT engine file cache bookkeeping, without TensorRT: cache keys, optimisation profiles from the
batch, engine file/manifest naming, and the reuse-or-rebuild decision. An engine file (a serialized TensorRT
engine; `.plan` on disk is TensorRT's own name for one) is only valid for the exact ONNX file, TensorRT
version, GPU model/compute capability, profile and precision it was built for, so every one of those is
part of the key."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from diffsmooth.engine.errors import UserError
from diffsmooth.engine.stages.manifests import write_json

ENGINE_FILE_MANIFEST_FORMAT = "diffsmooth-trt-plan-manifest"     # on disk: unchanged, so old manifests load
ENGINE_FILE_MANIFEST_VERSION = 1
KEY_FIELDS = ("onnx_sha256", "tensorrt_version", "gpu_name", "compute_capability", "profile", "precision")
DEFAULT_WORKSPACE_BYTES = 4 << 30


def gpu_slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3' (file-name safe)."""
    slug = re.sub(r"[^a-z0-9]+", "-", str(name).lower()).strip("-")
    return slug or "gpu"


def profile_for(inputs: Dict[str, Sequence], batch: int, max_batch: Optional[int] = None) -> Dict[str, dict]:
    """One optimisation profile from a graph manifest's `inputs` ({name: ["batch", d1, ...]}):
    min batch 1 (the pipeline's probe and last partial chunk), opt = the run's batch, max = max_batch
    (default: the batch). Every other dimension is static, as is an input the manifest gives no batch axis
    (a reverse step's timestep [1] and coefficients [7]), as long as some input has one."""
    batch = int(batch)
    max_batch = int(max_batch if max_batch is not None else batch)
    if batch < 1:
        raise UserError(f"engine batch must be >= 1, got {batch}")
    if max_batch < batch:
        raise UserError(f"`max_batch` {max_batch} is smaller than the batch {batch}")
    if not inputs:
        raise UserError("the graph manifest lists no inputs; re-export it")
    if not any(dims and dims[0] == "batch" for dims in inputs.values()):
        raise UserError(f"no input of the graph has a leading batch axis ({inputs}); re-export it")
    profile = {}
    for name, dims in inputs.items():
        if not dims or dims[0] != "batch":
            fixed = [int(d) for d in dims]
            profile[name] = {"min": fixed, "opt": fixed, "max": fixed, "static": True}
            continue
        rest = [int(d) for d in dims[1:]]
        profile[name] = {"min": [1, *rest], "opt": [batch, *rest], "max": [max_batch, *rest]}
    return profile


def profile_covers(profile: Dict[str, dict], batch: int) -> bool:
    """Whether every batch size 1..batch fits the profile (the pipeline calls stages with all of them); its
    static inputs take no batch."""
    try:
        return all(int(p["min"][0]) <= 1 and int(p["max"][0]) >= int(batch) for p in profile.values()
                   if not p.get("static"))
    except (KeyError, TypeError, ValueError, IndexError, AttributeError):
        return False


def cache_key(*, onnx_sha256: str, tensorrt_version: str, gpu_name: str, compute_capability: str,
              profile: Dict[str, dict], precision: str) -> dict:
    """The fields an engine file must match exactly to be reused."""
    return {"onnx_sha256": onnx_sha256, "tensorrt_version": str(tensorrt_version), "gpu_name": str(gpu_name),
            "compute_capability": str(compute_capability), "profile": _plain(profile), "precision": precision}


def _plain(value):
    """JSON round trip: tuples become lists, so a key read back from disk compares equal."""
    return json.loads(json.dumps(value))


def engine_file_path_for(onnx_path, gpu_name: str, compute_capability: str, profile: Dict[str, dict]) -> Path:
    """`<graph>.<gpu>-sm<cc>.b<opt>-<max>.plan` beside the graph: one engine file per GPU model and profile."""
    p = Path(onnx_path)
    first = next(iter(profile.values()))
    cc = str(compute_capability).replace(".", "")
    return p.with_name(f"{p.stem}.{gpu_slug(gpu_name)}-sm{cc}.b{first['opt'][0]}-{first['max'][0]}.plan")


def engine_file_manifest_path(engine_file_path) -> Path:
    return Path(engine_file_path).with_suffix(".plan.json")


def write_engine_file_manifest(engine_file_path, fields: dict) -> Path:
    """Atomic (tmp + rename) manifest of one engine file."""
    path = engine_file_manifest_path(engine_file_path)
    data = {"format": ENGINE_FILE_MANIFEST_FORMAT, "version": ENGINE_FILE_MANIFEST_VERSION,
            "plan_file": Path(engine_file_path).name}
    data.update(fields)
    write_json(path, data, indent=2)
    return path


def read_engine_file_manifest(engine_file_path) -> Tuple[Optional[dict], str]:
    """(manifest, "") or (None, why it cannot be used)."""
    path = engine_file_manifest_path(engine_file_path)
    if not path.exists():
        return None, f"{path.name} is missing"
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        return None, f"{path.name} is not readable JSON ({type(exc).__name__})"
    if not isinstance(data, dict) or data.get("format") != ENGINE_FILE_MANIFEST_FORMAT:
        return None, f"{path.name} is not a diffsmooth TensorRT engine file manifest"
    return data, ""


def key_mismatches(manifest: dict, key: dict) -> List[str]:
    """Human-readable differences between an engine file manifest's key and the wanted key."""
    have = manifest.get("key") or {}
    bad = []
    for field in KEY_FIELDS:
        if _plain(have.get(field)) != _plain(key.get(field)):
            shown_have, shown_want = have.get(field), key.get(field)
            if field == "onnx_sha256":
                shown_have = (shown_have or "none")[:12] + "..."
                shown_want = (shown_want or "none")[:12] + "..."
            bad.append(f"{field} {shown_have} != {shown_want}")
    return bad


def reuse_decision(engine_file_path, key: dict, sha256_file) -> Tuple[bool, str]:
    """(True, "") when the engine file on disk was built for exactly `key` and is intact; otherwise
    (False, one line saying why it must be rebuilt). Deserialisation is checked separately
    (it needs TensorRT)."""
    engine_file = Path(engine_file_path)
    if not engine_file.exists():
        return False, f"no engine file {engine_file.name} yet"
    manifest, why = read_engine_file_manifest(engine_file)
    if manifest is None:
        return False, f"{engine_file.name}: {why}"
    bad = key_mismatches(manifest, key)
    if bad:
        return False, f"{engine_file.name} was built for another configuration ({'; '.join(bad)})"
    if not manifest.get("plan_sha256"):
        return False, f"{engine_file.name}: its manifest records no plan_sha256"
    if sha256_file(engine_file) != manifest["plan_sha256"]:
        return False, f"{engine_file.name} changed after it was built (sha256 differs from its manifest)"
    return True, ""


def scan_engine_files(onnx_dir, onnx_sha256: str, precision: str) -> List[Tuple[Path, dict]]:
    """(engine file path, manifest) of every engine file in `onnx_dir` built from this graph at this precision."""
    found = []
    for p in sorted(Path(onnx_dir).glob("*.plan.json")):
        engine_file = p.with_name(p.name[: -len(".json")])
        manifest, _ = read_engine_file_manifest(engine_file)
        if manifest is None:
            continue
        key = manifest.get("key") or {}
        if key.get("onnx_sha256") == onnx_sha256 and key.get("precision") == precision:
            found.append((engine_file, manifest))
    return found


def choose_engine_file(engine_files: List[Tuple[Path, dict]], *, tensorrt_version: str, gpu_name: str,
                       compute_capability: str, batch: int, graph_name: str, onnx_dir) -> Tuple[Path, dict]:
    """The engine file to run for this GPU, TensorRT and batch: its profile must cover 1..batch; among
    several, the one whose opt batch equals the run's, else the smallest max. UserError otherwise
    (an engine file is never used on a GPU or TensorRT it was not built for)."""
    build = (f"build one with `diffsmooth build-engine --onnx-dir {onnx_dir} --batch {batch}` "
             "on this machine")
    if not engine_files:
        raise UserError(f"no TensorRT engine file for {graph_name} in {onnx_dir}; {build}")
    here = [(p, m) for p, m in engine_files
            if (m.get("key") or {}).get("gpu_name") == gpu_name
            and str((m.get("key") or {}).get("compute_capability")) == str(compute_capability)]
    if not here:
        others = sorted({f"{(m.get('key') or {}).get('gpu_name')} sm{(m.get('key') or {}).get('compute_capability')}"
                         for _, m in engine_files})
        raise UserError(f"the TensorRT engine files for {graph_name} were built for another GPU ({', '.join(others)}), "
                        f"not {gpu_name} sm{compute_capability}; {build}")
    same_trt = [(p, m) for p, m in here if (m.get("key") or {}).get("tensorrt_version") == str(tensorrt_version)]
    if not same_trt:
        others = sorted({str((m.get("key") or {}).get("tensorrt_version")) for _, m in here})
        raise UserError(f"the TensorRT engine files for {graph_name} were built with TensorRT {', '.join(others)}, "
                        f"this is {tensorrt_version}; {build}")
    fits = [(p, m) for p, m in same_trt if profile_covers((m.get("key") or {}).get("profile") or {}, batch)]
    if not fits:
        sizes = sorted({_max_batch(m) for _, m in same_trt})
        raise UserError(f"the TensorRT engine files for {graph_name} take batches up to {sizes}, not {batch}; "
                        f"use `batch` <= {max(sizes)} or {build}")
    exact = [(p, m) for p, m in fits if _opt_batch(m) == int(batch)]
    return (exact or sorted(fits, key=lambda pm: _max_batch(pm[1])))[0]


def _first_profile(m: dict) -> dict:
    profile = (m.get("key") or {}).get("profile") or {}
    return next(iter(profile.values()), {"opt": [0], "max": [0]})


def _opt_batch(m: dict) -> int:
    return int(_first_profile(m)["opt"][0])


def _max_batch(m: dict) -> int:
    return int(_first_profile(m)["max"][0])

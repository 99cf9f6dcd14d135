"""The JSON manifest written next to every exported graph: what it computes, where it came from,
its hashes and its validation results. The ONNX Runtime backend picks graphs by these fields."""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path
from typing import Dict, Iterable, Optional, Sequence

from diffsmooth.engine.errors import UserError
from diffsmooth.engine.hashing import sha256_file
from diffsmooth.engine.stages.manifests import MANIFEST_FORMAT, write_json

MANIFEST_VERSION = 1


def manifest_path(onnx_path) -> Path:
    """`x.onnx` -> `x.json`, in the same folder."""
    p = Path(onnx_path)
    return p.with_suffix(".json")


GRAPH_PACKAGES = ("diffsmooth-engine", "torch", "onnx", "onnxruntime", "onnxruntime-gpu", "diffusers")


def package_versions(names: Sequence[str] = GRAPH_PACKAGES) -> Dict[str, Optional[str]]:
    """Versions of the packages that shaped a graph or engine file (None for one that is not installed)."""
    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def write_manifest(onnx_path, fields: dict) -> Path:
    """Write the manifest of `onnx_path` atomically (tmp file + rename); returns its path."""
    path = manifest_path(onnx_path)
    data = {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "onnx_file": Path(onnx_path).name}
    data.update(fields)
    write_json(path, data, indent=2)
    return path


def read_manifest(path) -> dict:
    """One manifest; UserError if it is not JSON or not ours."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"cannot read ONNX manifest {p}: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT:
        raise UserError(f"{p} is not a diffsmooth ONNX manifest")
    return data


def update_manifest(onnx_path, **fields) -> Path:
    """Merge `fields` into an existing manifest (used to record validation results)."""
    data = read_manifest(manifest_path(onnx_path))
    data.update(fields)
    data.pop("format", None), data.pop("version", None), data.pop("onnx_file", None)
    return write_manifest(onnx_path, data)


def file_hashes(onnx_path, external_files: Iterable[str] = ()) -> dict:
    """sha256 of the graph file and of each external-data file next to it."""
    p = Path(onnx_path)
    return {"onnx_sha256": sha256_file(p),
            "external_data": {name: sha256_file(p.parent / name) for name in external_files}}

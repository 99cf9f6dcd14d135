"""The manifests written next to exported graphs: their format tag, finding the graph of a role
whose manifest matches wanted fields, and checking its hashes before it is loaded. One home for
the format, used by the exporter (diffsmooth.export.manifest) and the ONNX Runtime stages; and the
one atomic JSON write of every manifest (graphs, TensorRT engine files, the demo models' MODELS.json)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import List, Sequence, Tuple

from diffsmooth.engine.errors import UserError
from diffsmooth.engine.hashing import sha256_file

MANIFEST_FORMAT = "diffsmooth-onnx-manifest"


def write_json(path, data, indent: int) -> None:
    """`data` as indented JSON at `path`, whole or not at all (a tmp file renamed over it): the manifests of graphs,
    TensorRT engine files and the demo models, which another process may read at any moment."""
    tmp = Path(path).with_name(Path(path).name + ".tmp")
    tmp.write_text(json.dumps(data, indent=indent) + "\n")
    os.replace(tmp, path)


def _close(a, b) -> bool:
    return a is not None and b is not None and abs(float(a) - float(b)) <= 1e-9 * max(1.0, abs(float(b)))


def check_external_data_paths(onnx_path: Path, manifest_names: Sequence[str] = ()) -> None:
    """UserError if the graph or its manifest points external data outside the graph's folder:
    a crafted model could otherwise make ONNX Runtime read any file on the machine."""
    import onnx
    folder = onnx_path.parent.resolve()
    try:
        model = onnx.load(str(onnx_path), load_external_data=False)
    except Exception as exc:                          # protobuf DecodeError and friends
        raise UserError(f"{onnx_path.name} is not a readable ONNX file ({type(exc).__name__}); re-export it") from None
    names = list(manifest_names)
    for tensor in model.graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            names += [entry.value for entry in tensor.external_data if entry.key == "location"]
    for name in names:
        target = (folder / name).resolve()
        if Path(name).is_absolute() or folder not in target.parents:
            raise UserError(f"{onnx_path.name}: external data {name!r} lies outside {folder}; refusing to load it")


def verify_hashes(onnx_path, manifest: dict) -> None:
    """UserError unless the graph (and its external data) still has the sha256 its manifest records."""
    p = Path(onnx_path)
    if not p.exists():
        raise UserError(f"{p.name} is named by its manifest but missing from {p.parent}")
    want = manifest.get("onnx_sha256")
    if not want:
        raise UserError(f"the manifest of {p.name} records no onnx_sha256; re-export it")
    have = sha256_file(p)
    if have != want:
        raise UserError(f"{p.name}: sha256 {have[:12]}... does not match its manifest ({want[:12]}...); "
                        "the file changed after export: re-export it")
    check_external_data_paths(p, list(manifest.get("external_data") or {}))
    for name, digest in (manifest.get("external_data") or {}).items():
        q = p.parent / name
        if not q.exists():
            raise UserError(f"{p.name}: its external data file {name} is missing from {p.parent}")
        if sha256_file(q) != digest:
            raise UserError(f"{p.name}: external data {name} does not match its manifest's sha256; re-export it")


def scan_manifests(onnx_dir, require: bool = True) -> List[Tuple[Path, dict]]:
    """(graph path, manifest) for every export manifest in `onnx_dir`, sorted by file name."""
    d = Path(onnx_dir)
    if not d.is_dir():
        raise UserError(f"`onnx_dir` {d}: no such directory (make it with `diffsmooth export --out {d}`)")
    found = []
    for p in sorted(d.glob("*.json")):
        try:
            data = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(data, dict) and data.get("format") == MANIFEST_FORMAT:
            found.append((d / data.get("onnx_file", p.with_suffix(".onnx").name), data))
    if require and not found:
        raise UserError(f"`onnx_dir` {d} holds no exported graphs (no manifests); run `diffsmooth export --out {d}`")
    return found


def _mismatches(manifest: dict, want: dict) -> List[str]:
    """Names of the fields in `want` that `manifest` does not match."""
    bad = []
    for key, value in want.items():
        have = manifest.get(key)
        if isinstance(value, float):
            if not _close(have, value):
                bad.append(f"{key}={have} (want {value})")
        elif isinstance(value, (list, tuple)):
            if list(have or []) != list(value):
                bad.append(f"{key}={have} (want {list(value)})")
        elif have != value:
            bad.append(f"{key}={have} (want {value})")
    return bad


def matches(manifest: dict, want: dict) -> bool:
    """Whether `manifest` has every field of `want` (floats to within rounding)."""
    return not _mismatches(manifest, want)


def _describe_want(role: str, want: dict) -> str:
    parts = [f"{k}={'x'.join(map(str, v)) if isinstance(v, (list, tuple)) else v}" for k, v in want.items()
             if k != "role"]
    return f"{role} graph with " + ", ".join(parts)


def find_graph(found: List[Tuple[Path, dict]], role: str, want: dict, onnx_dir) -> Tuple[Path, dict]:
    """The one graph of `role` whose manifest matches `want`; a UserError naming the closest
    candidates and their mismatching fields otherwise."""
    same_role = [(p, m) for p, m in found if m.get("role") == role]
    matches = [(p, m) for p, m in same_role if not _mismatches(m, want)]
    if not matches:
        if not same_role:
            raise UserError(f"no {role} graph in {onnx_dir} (need a {_describe_want(role, want)}); "
                            f"export it with `diffsmooth export`")
        near = sorted(same_role, key=lambda pm: len(_mismatches(pm[1], want)))[:3]
        why = "; ".join(f"{p.name}: {', '.join(_mismatches(m, want))}" for p, m in near)
        raise UserError(f"no matching {_describe_want(role, want)} in {onnx_dir} ({why})")
    if len(matches) > 1:
        raise UserError(f"several {role} graphs in {onnx_dir} match ({', '.join(p.name for p, _ in matches)}); "
                        "keep one")
    path, manifest = matches[0]
    verify_hashes(path, manifest)
    validation = manifest.get("validation")
    if isinstance(validation, dict) and validation.get("passed") is False:
        raise UserError(f"{path.name} failed validation against torch ({validation.get('summary', 'see its manifest')}); "
                        "re-export it or use `backend` torch")
    return path, manifest

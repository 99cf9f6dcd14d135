"""What TensorRT's engine inspector (JSON, detailed verbosity) says about a built engine file: which layers
run in half precision, and whether that fits the intended mixed precision (fp16 engine files: every
convolution in half; normalisation, softmax and the graph output in fp32; fp32 engine files: nothing in
half). Pure JSON parsing, so it is tested without TensorRT."""

from __future__ import annotations

import re
from collections import Counter
from typing import Dict, Iterable, List, Optional

# Datatype words that occur in "Format/Datatype" strings across TensorRT 8.5-10.x
# ("Row major linear FP32", "Channel major FP16 format where channel % 8 == 0", "Half", "Float").
_DTYPE_WORDS = [("bf16", "bf16"), ("fp16", "fp16"), ("half", "fp16"), ("fp32", "fp32"), ("float", "fp32"),
                ("fp8", "fp8"), ("int8", "int8"), ("int32", "int32"), ("int64", "int64"), ("bool", "bool")]
ROLE_WORDS = {
    "convolution": ("convolution", "deconvolution", "/conv"),
    "normalization": ("normalization", "instancenorm", "groupnorm", "layernorm"),
    "softmax": ("softmax",),
}
# Layer types that only move or reformat data: their names mention the layer they feed.
_MOVEMENT = ("reformat", "noop", "shuffle", "constant", "copy", "cast")


def datatype_of(text: str) -> Optional[str]:
    """'Channel major FP16 format where channel % 8 == 0' -> 'fp16'; None when unknown or N/A."""
    lowered = str(text or "").lower()
    for word, dtype in _DTYPE_WORDS:
        if re.search(rf"(?<![a-z0-9]){word}(?![a-z0-9])", lowered):
            return dtype
    return None


def layer_roles(layer: dict) -> List[str]:
    """Roles a layer plays, from its parameter/layer type and (for fused layers) its name."""
    kinds = " ".join(str(layer.get(k, "")) for k in ("ParameterType", "LayerType")).lower()
    name = str(layer.get("Name", "")).lower()
    if any(k in kinds for k in _MOVEMENT):   # "Reformatting CopyNode for Input Tensor 0 to /conv/Conv"
        name = ""
    roles = []
    for role, words in ROLE_WORDS.items():
        if any(w in kinds for w in words if not w.startswith("/")) or any(w in name for w in words):
            roles.append(role)
    return roles


def _tensor_types(tensors: Iterable) -> List[Optional[str]]:
    return [datatype_of(t.get("Format/Datatype", "")) if isinstance(t, dict) else None for t in tensors or ()]


def layer_precision(layer: dict) -> Optional[str]:
    """The precision a layer computes in: its first input's type for convolutions (the math follows
    the input), its first output's type otherwise."""
    ins, outs = _tensor_types(layer.get("Inputs")), _tensor_types(layer.get("Outputs"))
    if "convolution" in layer_roles(layer):
        return next((t for t in ins if t), None) or next((t for t in outs if t), None)
    return next((t for t in outs if t), None) or next((t for t in ins if t), None)


def summarize(info: dict, precision: str, output_names: Iterable[str] = ()) -> dict:
    """Inspection record for an engine file's manifest: per-layer type/precision, counts, and checks."""
    layers = info.get("Layers") if isinstance(info, dict) else None
    if not layers or not all(isinstance(layer, dict) for layer in layers):
        return {"detailed": False, "passed": False, "layers": [], "counts": {},
                "failures": ["the inspector gave no detailed layer information "
                             "(engine file not built with ProfilingVerbosity.DETAILED?)"],
                "summary": "no detailed layer information"}
    rows, failures, unverified = [], [], []
    outputs = set(output_names) or set(_bindings_outputs(info, layers))
    for layer in layers:
        roles = layer_roles(layer)
        prec = layer_precision(layer)
        rows.append({"name": str(layer.get("Name", "")), "type": str(layer.get("LayerType", "")),
                     "roles": roles, "precision": prec})
        name = str(layer.get("Name", ""))[:80]
        if len(roles) > 1:                     # e.g. a Myelin ForeignNode fusing conv + softmax
            unverified.append(name)
            continue
        if prec is None:
            if roles:
                unverified.append(name)
            continue
        if precision == "fp16":
            if roles == ["convolution"] and prec != "fp16":
                failures.append(f"convolution {name} runs in {prec}, not fp16")
            if roles and roles[0] in ("normalization", "softmax") and prec in ("fp16", "bf16", "fp8"):
                failures.append(f"{roles[0]} {name} runs in {prec}, must be fp32")
        elif prec in ("fp16", "bf16", "fp8"):
            failures.append(f"layer {name} runs in {prec} in an fp32 engine file")
    for layer in layers:
        for t in layer.get("Outputs") or ():
            if isinstance(t, dict) and t.get("Name") in outputs:
                dtype = datatype_of(t.get("Format/Datatype", ""))
                if dtype not in (None, "fp32"):
                    failures.append(f"graph output {t['Name']} is {dtype}, must be fp32")
    counts = Counter(r["precision"] or "unknown" for r in rows)
    half = [r["name"] for r in rows if r["precision"] == "fp16"]
    by_role: Dict[str, Dict[str, int]] = {}
    for r in rows:
        for role in r["roles"]:
            by_role.setdefault(role, Counter())[r["precision"] or "unknown"] += 1
    summary = (f"{len(rows)} layers: " + ", ".join(f"{n} {p}" for p, n in sorted(counts.items()))
               + "; " + ", ".join(f"{role} {dict(c)}" for role, c in sorted(by_role.items())))
    if unverified:
        summary += f"; {len(unverified)} fused/untyped layer(s) not checked"
    return {"detailed": True, "passed": not failures, "failures": failures, "summary": summary,
            "counts": dict(counts), "by_role": {k: dict(v) for k, v in by_role.items()},
            "half_layers": half, "unverified": unverified, "layers": rows}


def _bindings_outputs(info: dict, layers: List[dict]) -> List[str]:
    """Graph outputs: bindings that no layer consumes."""
    bindings = [b for b in info.get("Bindings") or () if isinstance(b, str)]
    consumed = {t.get("Name") for layer in layers for t in layer.get("Inputs") or () if isinstance(t, dict)}
    return [b for b in bindings if b not in consumed]


def format_report(name: str, inspection: dict) -> List[str]:
    """Lines printed after a build."""
    state = "ok  " if inspection.get("passed") else "FAIL"
    lines = [f"{state} {name} precision: {inspection.get('summary', '')}"]
    lines += [f"     {f}" for f in inspection.get("failures", [])]
    return lines

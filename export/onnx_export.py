"""ONNX export (opset 17, dynamic batch, no Einsum, fp32 + mixed fp16, JSON manifest each) of the
method's purify stage (its purifier's `graph`: the one-shot purifier at one sigma, or DensePure's reverse step),
the plain UNet and the classifier head (score_module)."""

from __future__ import annotations

import dataclasses
import datetime
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import onnx
import torch
from onnx.external_data_helper import load_external_data_for_model
from torch import nn

from diffsmooth.engine.backends.torch.stages import score_module
from diffsmooth.engine.base_classifier.denoise import DiffusionDenoiser
from diffsmooth.engine.base_classifier.methods import MethodConfig
from diffsmooth.engine.base_classifier.purifier_graph import example_batch
from diffsmooth.engine.choices import GRAPH_PRECISIONS
from diffsmooth.engine.errors import UserError, first_line
from diffsmooth.engine.hashing import sha256_file
from diffsmooth.engine.models.diffusers_folder import denoiser_identity, is_diffusers_folder

from .fp16 import convert_mixed_fp16
from .graph_passes import check_structure, fuse_affine_chains, initializer_bytes, op_counts, optimize
from .manifest import file_hashes, package_versions, write_manifest

OPSET = 17
# Protobuf cannot serialise a message over 2 GiB; keep a margin for the graph structure itself.
EXTERNAL_DATA_THRESHOLD = (2 << 30) - (64 << 20)


# --------------------------------------------------------------------------------------------
# torch -> ONNX -> passes -> file


def trace_to_onnx(module: nn.Module, example_inputs: Tuple[torch.Tensor, ...], input_names: Sequence[str],
                  output_names: Sequence[str], opset: int = OPSET,
                  batch_inputs: Optional[Sequence[str]] = None) -> onnx.ModelProto:
    """TorchScript exporter (dynamo=False; the dynamo exporter only if that is gone), dynamic batch on the
    outputs and `batch_inputs` (None: every input), then the graph passes and the opset/Einsum check."""
    module = module.eval()
    batched = list(input_names) if batch_inputs is None else [n for n in input_names if n in batch_inputs]
    dynamic_axes = {n: {0: "batch"} for n in batched + list(output_names)}
    tmp = Path(tempfile.mkdtemp(prefix="diffsmooth-export-"))
    try:
        path = tmp / "graph.onnx"
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            try:
                torch.onnx.export(module, tuple(example_inputs), str(path), dynamo=False, opset_version=opset,
                                  input_names=list(input_names), output_names=list(output_names),
                                  dynamic_axes=dynamic_axes, do_constant_folding=True)
            except (TypeError, NotImplementedError, RuntimeError) as exc:
                if "dynamo" not in str(exc) and "TorchScript" not in str(exc):
                    raise
                batch = torch.export.Dim("batch", min=1)
                shapes = {n: ({0: batch} if n in batched else {}) for n in input_names}
                program = torch.onnx.export(module, tuple(example_inputs), dynamo=True, opset_version=opset,
                                            input_names=list(input_names), output_names=list(output_names),
                                            dynamic_shapes=shapes, optimize=True)
                program.save(str(path))
        model = onnx.load(str(path))       # pulls in external data if the exporter wrote any
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    model = optimize(model)
    fuse_affine_chains(model)
    check_structure(model, opset)
    return model


def save_graph(model: onnx.ModelProto, path, external_data_threshold: int = EXTERNAL_DATA_THRESHOLD) -> dict:
    """Write `model` (weights in `<name>.data` when over the threshold), run onnx.checker on the file;
    returns hashes and sizes for the manifest."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data_name = path.with_suffix(".data").name
    size = initializer_bytes(model)
    external = size > external_data_threshold
    # Written into a temporary sibling folder, checked, then renamed into place (data file first,
    # graph last), so a crash never leaves a half-written graph under the final name.
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        staged = staging / path.name
        if external:
            onnx.save_model(model, str(staged), save_as_external_data=True, all_tensors_to_one_file=True,
                            location=data_name, size_threshold=1024, convert_attribute=False)
        else:
            onnx.save_model(model, str(staged))
        try:
            onnx.checker.check_model(str(staged), full_check=True)
        except onnx.checker.ValidationError as exc:
            raise UserError(f"onnx.checker rejects {path.name}: {first_line(exc)}") from None
        stale_data = path.with_suffix(".data")
        if external:
            os.replace(staging / data_name, stale_data)
        elif stale_data.exists():
            stale_data.unlink()
        os.replace(staged, path)
        if external:
            # Saving as external data empties the in-memory initializers; refill them from the final
            # file so the same proto can still be converted (the fp16 variant is made from it next).
            load_external_data_for_model(model, str(path.parent))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    facts = file_hashes(path, [data_name] if external else [])
    facts.update(weights_bytes=size, external_data_threshold=int(external_data_threshold),
                 op_counts=dict(sorted(op_counts(model).items())))
    return facts


def _variants(model: onnx.ModelProto, precisions: Sequence[str]):
    """(precision, model) for each requested precision; fp16 is converted from a copy of fp32."""
    for p in precisions:
        if p not in GRAPH_PRECISIONS:
            raise UserError(f"export precision must be one of {', '.join(GRAPH_PRECISIONS)}, got {p!r}")
    for p in precisions:
        if p == "fp32":
            yield p, model
        else:
            half = onnx.ModelProto()
            half.CopyFrom(model)
            yield p, convert_mixed_fp16(half)


# --------------------------------------------------------------------------------------------
# Manifest pieces


def shape_tag(image_shape) -> str:
    return "x".join(str(int(s)) for s in image_shape)


def _jsonable(value):
    if dataclasses.is_dataclass(value):
        value = dataclasses.asdict(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) or isinstance(value, (int, str, bool)) or value is None:
        return value
    return str(value)


def checkpoint_source(path: Optional[str], **how) -> dict:
    """Where a model came from: checkpoint path + sha256 and how to read it (None for in-memory). A
    diffusers folder records its format and the sha256 of its weights and configs instead."""
    if path and is_diffusers_folder(path):
        scheduler = how.pop("scheduler", None)
        identity = denoiser_identity(path, scheduler)
        return {"path": str(Path(path).resolve()), "sha256": None, **identity,
                "scheduler": str(Path(scheduler).resolve()) if scheduler else None, **_jsonable(how)}
    if path:
        p = Path(path).resolve()
        return {"path": str(p), "sha256": sha256_file(p), **_jsonable(how)}
    return {"path": None, "sha256": None, **_jsonable(how)}


def _base_fields(role: str, precision: str, image_shape, inputs: Dict[str, list], output: Tuple[str, list],
                 source: Optional[dict]) -> dict:
    return {
        "role": role,
        "precision": precision,
        "opset": OPSET,
        "image_shape": [int(s) for s in image_shape],
        "inputs": inputs,
        "output": {"name": output[0], "shape": output[1], "dtype": "float32"},
        "dynamic_axes": {"batch": 0},
        "source": source or {"path": None, "sha256": None},
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "versions": package_versions(),
        "validation": None,
    }


# Every manifest carries the same keys; those that do not apply to a role are None.
_METHOD_KEYS = ("sigma", "t_star", "model_timestep", "method", "m", "local_sigma", "local_noise",
                "local_noise_seed", "num_classes", "preset", "unet_config", "schedule")


def _write_graphs(model: onnx.ModelProto, precisions: Sequence[str], role: str, path_of: Callable[[str], Path],
                  base: tuple, fields: dict, external_data_threshold: int) -> List[ExportedGraph]:
    """Each precision's graph saved at path_of(precision) with its manifest: the base fields (shape, inputs, output,
    source), the role's `fields`, the saved file's facts."""
    written = []
    for precision, variant in _variants(model, precisions):
        path = path_of(precision)
        facts = save_graph(variant, path, external_data_threshold)
        manifest = {**_base_fields(role, precision, *base), **fields, **facts}
        for key in _METHOD_KEYS:                   # every manifest names the method's fields, None where unused
            manifest.setdefault(key, None)
        write_manifest(path, manifest)
        written.append(ExportedGraph(path, role, precision, manifest))
    return written


def _denoiser_facts(denoiser: DiffusionDenoiser) -> dict:
    config = getattr(denoiser.unet, "config", None)
    return {"unet_config": _jsonable(config) if config is not None else None,
            "schedule": _jsonable(denoiser.schedule)}


# --------------------------------------------------------------------------------------------
# The three graphs


@dataclass
class ExportedGraph:
    """One written graph: its path, role, precision and manifest fields."""

    path: Path
    role: str
    precision: str
    manifest: dict = field(default_factory=dict)


def export_denoiser(config: MethodConfig, denoiser: DiffusionDenoiser, image_shape, out_dir, *,
                    precisions: Sequence[str] = ("fp32",), source: Optional[dict] = None,
                    preset: Optional[str] = None,
                    external_data_threshold: int = EXTERNAL_DATA_THRESHOLD) -> List[ExportedGraph]:
    """The method's purify stage as its graph (its purifier's `graph`): for the one-shot methods x_rs [B,C,H,W] in
    [0,1] -> purified x_hat [B,C,H,W] in [0,1] at one sigma."""
    graph = config.purifier.graph(config.sigma, denoiser, image_shape, config.name)
    names = list(graph.input_names)
    batched = list(graph.batch_inputs or names)
    model = trace_to_onnx(graph.module, graph.inputs, names, [graph.output_name], batch_inputs=batched)
    shape = [int(s) for s in image_shape]
    fields = {**{k: _jsonable(v) for k, v in graph.fields.items()}, "preset": preset, **_denoiser_facts(denoiser)}
    return _write_graphs(model, precisions, "denoiser", lambda p: Path(out_dir) / f"{graph.stem}_{shape_tag(shape)}_{p}.onnx",
                         (shape, graph.input_shapes(), (graph.output_name, ["batch", *shape]), source), fields,
                         external_data_threshold)


class _UNetIO(nn.Module):
    """The plain UNet (x_t, t) -> out, with float timesteps [B]."""

    def __init__(self, unet: nn.Module):
        super().__init__()
        self.unet = unet

    def forward(self, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return self.unet(x_t, t)


def export_unet(denoiser: DiffusionDenoiser, image_shape, out_dir, *, precisions: Sequence[str] = ("fp32",),
                source: Optional[dict] = None, preset: Optional[str] = None,
                external_data_threshold: int = EXTERNAL_DATA_THRESHOLD) -> List[ExportedGraph]:
    """The bare UNet: x_t [B,C,H,W], t [B] float -> model output [B,C_out,H,W] (eps first)."""
    unet = denoiser.unet.eval()
    x = example_batch(image_shape) * 2 - 1
    t = torch.tensor([10.0, 500.0])
    with torch.no_grad():
        out_channels = int(unet(x, t).shape[1])
    model = trace_to_onnx(_UNetIO(unet), (x, t), ["x_t", "t"], ["out"])
    shape = [int(s) for s in image_shape]
    return _write_graphs(model, precisions, "unet", lambda p: Path(out_dir) / f"unet_{shape_tag(shape)}_{p}.onnx",
                         (shape, {"x_t": ["batch", *shape], "t": ["batch"]}, ("out", ["batch", out_channels, *shape[1:]]),
                          source), {"preset": preset, **_denoiser_facts(denoiser)}, external_data_threshold)


def classifier_file_name(config: MethodConfig, image_shape, precision: str) -> str:
    name = f"classifier_{config.name}_s{config.sigma:g}{config.method.graph_tag(config)}"
    return f"{name}_{shape_tag(image_shape)}_{precision}.onnx"


def export_classifier(config: MethodConfig, classifier: nn.Module, image_shape, out_dir, *,
                      precisions: Sequence[str] = ("fp32",), source: Optional[dict] = None,
                      external_data_threshold: int = EXTERNAL_DATA_THRESHOLD) -> List[ExportedGraph]:
    """score_module(config): x [B,C,H,W] (+ noise [B,m,C,H,W] when fresh) -> [B,K]
    (mean softmax for DiffSmooth, logits for rs/dds)."""
    head = score_module(config, classifier.eval(), tuple(image_shape)).eval()
    shape = [int(s) for s in image_shape]
    scored = list(config.purifier.purified_shape(tuple(shape)) or shape)    # what its classifier reads
    x = example_batch(scored)
    args: Tuple[torch.Tensor, ...] = (x,)
    names = ["x"]
    inputs = {"x": ["batch", *scored]}
    if getattr(head, "takes_noise", False):
        fresh = [int(d) for d in config.head.fresh_noise_shape(tuple(shape))]
        args = (x, torch.randn((x.shape[0], *fresh), generator=torch.Generator().manual_seed(1)))
        names.append("noise")
        inputs["noise"] = ["batch", *fresh]
    with torch.no_grad():
        num_classes = int(head(*args).shape[1])
    output = config.method.head.output_name
    model = trace_to_onnx(head, args, names, [output])
    fields = {"method": config.name, "sigma": float(config.sigma), "num_classes": num_classes,
              "scores": config.method.head.scores}
    fields.update(config.method.graph_fields(config))
    fields["method_config"] = config.as_dict()
    return _write_graphs(model, precisions, "classifier", lambda p: Path(out_dir) / classifier_file_name(config, shape, p),
                         (shape, inputs, (output, ["batch", num_classes]), source), fields, external_data_threshold)


def export_models(config: MethodConfig, image_shape, out_dir, *, denoiser: Optional[DiffusionDenoiser] = None,
                  classifier: Optional[nn.Module] = None, fp16: bool = False, also_unet: bool = False,
                  denoiser_source: Optional[dict] = None, classifier_source: Optional[dict] = None,
                  preset: Optional[str] = None,
                  external_data_threshold: int = EXTERNAL_DATA_THRESHOLD) -> List[ExportedGraph]:
    """Every graph `config` needs from the given models (fp32, plus fp16 when asked)."""
    if denoiser is None and classifier is None:
        raise UserError("nothing to export: give a denoiser and/or a classifier")
    os.makedirs(out_dir, exist_ok=True)
    precisions = ("fp32", "fp16") if fp16 else ("fp32",)
    written: List[ExportedGraph] = []
    if denoiser is not None:
        if config.purifier.denoises:
            written += export_denoiser(config, denoiser, image_shape, out_dir, precisions=precisions,
                                       source=denoiser_source, preset=preset,
                                       external_data_threshold=external_data_threshold)
        if also_unet:
            written += export_unet(denoiser, image_shape, out_dir, precisions=precisions, source=denoiser_source,
                                   preset=preset, external_data_threshold=external_data_threshold)
    if classifier is not None:
        written += export_classifier(config, classifier, image_shape, out_dir, precisions=precisions,
                                     source=classifier_source, external_data_threshold=external_data_threshold)
    return written

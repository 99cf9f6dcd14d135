"""Loading and saving checkpoints, treating every file as untrusted input.

Files are read with torch.load(weights_only=True), so a checkpoint can never run code; every
problem a user can fix (wrong path, corrupt file, wrong architecture) becomes a one-line UserError.
"""

from __future__ import annotations

import os
import pickle
import re
import warnings
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
from torch import nn

from diffsmooth.engine.errors import UserError, first_line
from diffsmooth.engine.models.resnet import (
    ARCHITECTURES,
    DATASET_STATS,
    DEFAULT_NORMALIZATION,
    NORMALIZATION_MODES,
    NormalizedClassifier,
    NormalizeLayer,
    _dataset_key,
    build_classifier_net,
    normalization_layer,
)
from diffsmooth.engine.models.timm_models import (
    adapt_timm_state_dict,
    create_timm_net,
    is_timm_arch,
    timm_input_stats,
    timm_module_key,
)
from diffsmooth.engine.models.unet import PRESETS, UNetConfig, UNetModel, unet_config

__all__ = [
    "read_checkpoint",
    "extract_state_dict",
    "load_weights",
    "load_unet",
    "load_classifier",
    "save_cohen_checkpoint",
    "save_unet_state",
]

_STATE_DICT_KEYS = ("state_dict", "model", "model_state_dict")
_SHOW = 3  # how many offending keys an error message lists per kind


def _numpy_safe_globals() -> list:
    """numpy scalar/dtype constructors: data-only, found in some checkpoints' metadata (e.g. a best accuracy)."""
    out: list = [np.dtype]
    for mod_name in ("numpy._core.multiarray", "numpy.core.multiarray"):
        try:
            mod = __import__(mod_name, fromlist=["scalar"])
            out.append(mod.scalar)
            break
        except (ImportError, AttributeError):
            continue
    for code in ("f8", "f4", "f2", "i8", "i4", "i2", "i1", "u1", "?"):
        out.append(type(np.dtype(code)))
    return out


def read_checkpoint(path, mmap: bool = False) -> object:
    """torch.load(path, map_location="cpu", weights_only=True) with one-line UserErrors for bad files;
    `mmap`: map a zip-format file instead of reading it (its tensors' bytes are read only when touched)."""
    p = Path(path)
    if not p.exists():
        raise UserError(f"checkpoint not found: {p}")
    if p.is_dir():
        raise UserError(f"checkpoint path {p} is a directory; pass the .pt/.pth file inside it")
    try:
        size = p.stat().st_size
    except OSError as exc:
        raise UserError(f"cannot read checkpoint {p}: {exc.strerror or exc}") from None
    if size == 0:
        raise UserError(f"checkpoint {p} is empty (0 bytes); download or copy it again")
    try:
        with open(p, "rb") as fh:
            head = fh.read(4)
    except OSError as exc:
        raise UserError(f"cannot read checkpoint {p}: {exc.strerror or exc}") from None
    is_zip = head.startswith(b"PK\x03\x04")
    options = {"mmap": True} if mmap and is_zip else {}

    allow = getattr(torch.serialization, "safe_globals", None)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            if allow is None:  # older torch: no allowlist context
                return torch.load(p, map_location="cpu", weights_only=True, **options)
            with allow(_numpy_safe_globals()):
                return torch.load(p, map_location="cpu", weights_only=True, **options)
    except pickle.UnpicklingError as exc:
        msg = str(exc)
        glob = re.search(r"Unsupported global: GLOBAL ([\w.]+)", msg)
        if glob:
            raise UserError(
                f"refusing to load {p}: it would call '{glob.group(1)}', which weights-only loading forbids "
                f"because it could run code; "
                f"if you trust its source, re-save only its tensors (torch.save(model.state_dict(), ...)) and load that"
            ) from None
        if "Weights only load failed" in msg:
            raise UserError(
                f"refusing to load {p}: it is not a plain PyTorch weights file (a generic pickle or code-carrying object); "
                f"save the checkpoint with torch.save(state_dict) from a trusted environment"
            ) from None
        raise UserError(f"{p} is not a PyTorch checkpoint ({first_line(exc)}); check the path") from None
    except EOFError:
        raise UserError(f"checkpoint {p} ends early (truncated); download or copy it again") from None
    except RuntimeError as exc:
        msg = str(exc)
        if "central directory" in msg or "unexpected EOF" in msg or "failed reading" in msg:
            raise UserError(f"checkpoint {p} is truncated or corrupted ({first_line(exc)[:80]}); "
                            f"download or copy it again") from None
        if is_zip:
            raise UserError(f"{p} is a zip archive but not a PyTorch checkpoint; check the path") from None
        raise UserError(f"cannot read checkpoint {p}: {first_line(exc)}") from None
    except (KeyError, ValueError, IndexError, TypeError, AttributeError, UnicodeDecodeError) as exc:
        raise UserError(f"{p} is not a PyTorch checkpoint ({type(exc).__name__}: {first_line(exc)}); check the path") from None
    except OSError as exc:
        raise UserError(f"cannot read checkpoint {p}: {exc.strerror or first_line(exc)}") from None
    except MemoryError:
        raise UserError(f"not enough memory to load checkpoint {p}") from None


def _looks_like_state_dict(obj) -> bool:
    return isinstance(obj, Mapping) and len(obj) > 0 and all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items()
    )


def _strip_prefix(sd: Mapping[str, torch.Tensor], prefix: str) -> Mapping[str, torch.Tensor]:
    if sd and all(k.startswith(prefix) for k in sd):
        return OrderedDict((k[len(prefix):], v) for k, v in sd.items())
    return sd


def extract_state_dict(obj) -> tuple[OrderedDict, str | None]:
    """Find the network's state dict (and 'arch' if recorded) in a loaded checkpoint; strip `1.`/`module.` prefixes."""
    if not isinstance(obj, Mapping):
        raise UserError(f"checkpoint holds a {type(obj).__name__}, not a state dict or a dict with 'state_dict'")
    arch = obj.get("arch") if isinstance(obj.get("arch"), str) else None
    sd = None
    for key in _STATE_DICT_KEYS:
        if isinstance(obj.get(key), Mapping):
            sd = obj[key]
            break
    if sd is None:
        sd = obj
    if not _looks_like_state_dict(sd):
        keys = ", ".join(map(str, list(obj.keys())[:8]))
        raise UserError(f"checkpoint has no state dict of tensors (top-level keys: {keys or 'none'})")
    sd = OrderedDict(sd)
    # Sequential(normalisation, net): drop buffers some forks register on the normalisation layer (index 0).
    if any(k.startswith("1.") for k in sd) and all(k.startswith(("0.", "1.")) for k in sd):
        sd = OrderedDict((k, v) for k, v in sd.items() if k.startswith("1."))
    sd = _strip_prefix(sd, "1.")
    sd = _strip_prefix(sd, "module.")
    return OrderedDict(sd), arch


def refuse_non_finite(state_dict: Mapping[str, torch.Tensor], path) -> None:
    """A NaN or inf weight turns every vote into noise (or one constant class): refuse the file before
    any vote is counted, naming the first such parameter."""
    for name, value in state_dict.items():
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            finite = torch.isfinite(value)
            if not bool(finite.all()):
                bad = int((~finite).sum())
                raise UserError(f"checkpoint {path} holds {bad} NaN/inf value(s) in parameter '{name}' "
                                f"{_fmt_shape(value.shape)}: the model is broken (a diverged training run?); "
                                f"use another checkpoint")


def _describe(value) -> str:
    """A parameter's shape, or the type of a non-tensor entry."""
    return _fmt_shape(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__


def _fmt_shape(shape) -> str:
    return "[" + ", ".join(str(int(s)) for s in shape) + "]"


def load_weights(module: nn.Module, state_dict: Mapping[str, torch.Tensor], what: str, *, assign: bool = False) -> None:
    """Strictly load state_dict into module; a mismatch raises a UserError naming `what` and the first bad keys."""
    expected = module.state_dict()
    bad_values = [k for k, v in state_dict.items() if not isinstance(v, torch.Tensor)]
    # BatchNorm fills in num_batches_tracked itself for checkpoints from old PyTorch versions.
    missing = [k for k in expected if k not in state_dict and not k.endswith("num_batches_tracked")]
    unexpected = [k for k in state_dict if k not in expected]
    misshaped = [
        k for k in expected
        if k in state_dict and isinstance(state_dict[k], torch.Tensor) and tuple(state_dict[k].shape) != tuple(expected[k].shape)
    ]
    if missing or unexpected or misshaped or bad_values:
        parts = [
            f"checkpoint does not match {what}: {len(missing)} missing, {len(unexpected)} unexpected, "
            f"{len(misshaped)} mis-shaped key(s)"
        ]
        if missing:
            parts.append("missing " + ", ".join(f"{k} {_fmt_shape(expected[k].shape)}" for k in missing[:_SHOW]))
        if unexpected:
            parts.append(
                "unexpected "
                + ", ".join(
                    f"{k} {_describe(state_dict[k])}" for k in unexpected[:_SHOW]
                )
            )
        if misshaped:
            parts.append(
                "mis-shaped "
                + ", ".join(
                    f"{k} checkpoint {_fmt_shape(state_dict[k].shape)} vs model {_fmt_shape(expected[k].shape)}"
                    for k in misshaped[:_SHOW]
                )
            )
        if bad_values:
            parts.append("non-tensor values at " + ", ".join(bad_values[:_SHOW]))
        raise UserError("; ".join(parts))
    if assign:      # assigned tensors become the parameters: one with overlapping memory (an expanded
        # tensor, stride 0) could never be written in place, as a table's next run copies its weights
        state_dict = {k: v if v.is_contiguous() else v.contiguous() for k, v in state_dict.items()}
    try:
        module.load_state_dict(state_dict, strict=True, assign=assign)
    except RuntimeError as exc:  # e.g. a dtype that cannot be copied
        raise UserError(f"checkpoint does not load into {what}: {first_line(exc)}") from None


def _describe_unet(preset: str | None, config: UNetConfig) -> str:
    name = f"UNet preset '{preset}'" if preset else "UNet"
    return (
        f"{name} (image {config.image_size}, {config.in_channels}->{config.out_channels} channels, "
        f"{config.model_channels} base channels, mult {config.channel_mult}, {config.num_res_blocks} res blocks)"
    )


def _matching_presets(state_dict: Mapping[str, torch.Tensor]) -> list[str]:
    """Presets whose parameter names and shapes equal the checkpoint's (for a helpful hint)."""
    shapes = {k: tuple(v.shape) for k, v in state_dict.items() if isinstance(v, torch.Tensor)}
    w_in, w_out = shapes.get("input_blocks.0.0.weight"), shapes.get("out.2.weight")
    found = []
    for name, cfg in PRESETS.items():
        try:
            if w_in and w_out:
                cfg = unet_config(name, in_channels=w_in[1], learn_sigma=w_out[0] == 2 * w_in[1])
            with torch.device("meta"):
                model = UNetModel(cfg)
        except UserError:
            continue
        if {k: tuple(v.shape) for k, v in model.state_dict().items()} == shapes:
            found.append(name)
    return found


def load_unet(path, preset: str | None = "cifar10", **config_overrides) -> UNetModel:
    """Load an official (or project-trained) UNet state dict into the preset's architecture, in eval mode."""
    config = unet_config(preset, **config_overrides)
    state_dict, _ = extract_state_dict(read_checkpoint(path))
    refuse_non_finite(state_dict, path)
    with torch.device("meta"):  # skip random initialisation: every tensor comes from the checkpoint
        model = UNetModel(config)
    try:
        load_weights(model, state_dict, _describe_unet(preset, config), assign=True)
    except UserError as exc:
        hint = [p for p in _matching_presets(state_dict) if p != preset]
        if hint:
            raise UserError(f"{exc}; the checkpoint fits preset '{hint[0]}'") from None
        raise
    return model.float().eval()


def load_classifier(
    path,
    arch: str | None = None,
    dataset: str = "cifar10",
    normalization: str | None = None,
    num_classes: int | None = None,
    in_channels: int | None = None,
    model_kwargs: Mapping | None = None,
) -> NormalizedClassifier:
    """Load a Cohen/SmoothAdv/DiffSmooth classifier checkpoint as Sequential(normalisation, net) in eval mode.

    timm architectures (`beit_large_patch16_224`, `timm:<name>`) take `model_kwargs` for timm.create_model,
    else the checkpoint's own 'model_kwargs' entry.
    """
    if normalization is not None and normalization not in NORMALIZATION_MODES:
        raise UserError(f"unknown normalization {normalization!r}; choose one of {', '.join(NORMALIZATION_MODES)}")
    checkpoint = read_checkpoint(path)
    state_dict, ckpt_arch = extract_state_dict(checkpoint)
    refuse_non_finite(state_dict, path)
    arch = arch or ckpt_arch
    if arch is None:
        raise UserError(f"checkpoint {path} does not record its architecture; pass arch= one of {_known_archs()}")
    if is_timm_arch(arch):
        if model_kwargs is None and isinstance(checkpoint, Mapping) and isinstance(checkpoint.get("model_kwargs"), Mapping):
            model_kwargs = checkpoint["model_kwargs"]
        return _load_timm_classifier(state_dict, arch, dataset, normalization, num_classes, in_channels, model_kwargs)
    if arch not in ARCHITECTURES:
        raise UserError(f"unknown classifier architecture {arch!r}; known: {_known_archs()}")
    fc, conv1 = state_dict.get("fc.weight"), state_dict.get("conv1.weight")
    if num_classes is None and isinstance(fc, torch.Tensor) and fc.dim() == 2:
        num_classes = int(fc.shape[0])
    if in_channels is None:
        in_channels = int(conv1.shape[1]) if isinstance(conv1, torch.Tensor) and conv1.dim() == 4 else 3

    key = _dataset_key(dataset) if dataset is not None else None
    if normalization is None:
        if key not in DEFAULT_NORMALIZATION:
            raise UserError(f"unknown dataset {dataset!r}; known: {', '.join(DEFAULT_NORMALIZATION)} "
                            f"(or pass normalization='none')")
        normalization = DEFAULT_NORMALIZATION[key]
    norm = normalization_layer(normalization, dataset)
    if normalization != "none" and len(DATASET_STATS[key][0]) != in_channels:
        raise UserError(
            f"dataset {dataset!r} statistics have {len(DATASET_STATS[key][0])} channel(s) but the classifier takes "
            f"{in_channels}; pick the matching dataset or normalization='none'"
        )
    net = build_classifier_net(arch, num_classes, in_channels)
    n_cls = num_classes if num_classes is not None else ARCHITECTURES[arch][1]
    load_weights(net, state_dict, f"classifier '{arch}' ({n_cls} classes, {in_channels} input channels)")
    return NormalizedClassifier(norm, net).eval()


def _known_archs() -> str:
    return ", ".join([*ARCHITECTURES, "beit_large_patch16_224", "timm:<model name>"])


def _load_timm_classifier(state_dict, arch, dataset, normalization, num_classes, in_channels, model_kwargs):
    """A timm classifier behind its input normalisation: the model's own mean/std unless one is asked for."""
    head = state_dict.get(f"{timm_module_key(arch, 'classifier') or 'head'}.weight")
    if num_classes is None and isinstance(head, torch.Tensor) and head.dim() == 2:
        num_classes = int(head.shape[0])
    first = timm_module_key(arch, "first_conv")
    stem = state_dict.get(f"{first}.weight") if first else None
    if in_channels is None and isinstance(stem, torch.Tensor) and stem.dim() == 4:
        in_channels = int(stem.shape[1])
    net = create_timm_net(arch, num_classes, in_channels, model_kwargs)
    if normalization is None:
        mean, std = timm_input_stats(arch, net)
        norm = NormalizeLayer(mean, std)
    else:
        norm = normalization_layer(normalization, dataset)
    state_dict = adapt_timm_state_dict(net, state_dict)
    n_cls = getattr(net, "num_classes", num_classes)
    load_weights(net, state_dict, f"timm classifier '{arch}' ({n_cls} classes)")
    return NormalizedClassifier(norm, net).eval()


def _atomic_save(obj, path) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, p)


def _cpu_state(module: nn.Module, prefix: str = "") -> OrderedDict:
    return OrderedDict((prefix + k, v.detach().cpu()) for k, v in module.state_dict().items())


def save_cohen_checkpoint(path, net: nn.Module, arch: str, **extra) -> None:
    """Write {'arch', 'state_dict' (keys prefixed `1.`), **extra} like Cohen et al.'s training script."""
    if arch not in ARCHITECTURES and not is_timm_arch(arch):
        raise UserError(f"unknown classifier architecture {arch!r}; known: {_known_archs()}")
    clash = {"arch", "state_dict"} & set(extra)
    if clash:
        raise UserError(f"save_cohen_checkpoint: extra fields may not override {', '.join(sorted(clash))}")
    state = _cpu_state(net) if isinstance(net, NormalizedClassifier) else _cpu_state(net, "1.")
    _atomic_save({"arch": arch, "state_dict": state, **extra}, path)


def save_unet_state(path, unet: UNetModel) -> None:
    """Write the UNet's plain state dict, the format of the official improved/guided-diffusion files."""
    _atomic_save(_cpu_state(unet), path)

"""timm classifiers (BEiT-L/16 of the paper's best ImageNet rows, or any `timm:<name>`), built and loaded
without ever downloading weights.

timm is an optional extra, imported only when such an architecture is asked for. Every timm release
(0.9.x-1.0.x) imports torchvision at import time, for names the models never call (FrozenBatchNorm2d,
data transforms); when torchvision is not installed, `import_timm` satisfies those imports with inert
placeholders for the duration of `import timm` only (see `_TorchvisionPlaceholders`).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings
from collections import OrderedDict
from collections.abc import Mapping

import torch
from torch import nn

from diffsmooth.engine.errors import UserError, first_line

__all__ = [
    "TIMM_PREFIX",
    "TIMM_ARCHITECTURES",
    "INSTALL_HINT",
    "is_timm_arch",
    "timm_model_name",
    "import_timm",
    "create_timm_net",
    "timm_input_stats",
    "adapt_timm_state_dict",
    "timm_module_key",
]

TIMM_PREFIX = "timm:"

# Bare architecture names recorded by the official DiffSmooth checkpoints that are timm models, with the
# normalisation the official code put in front of them (its ViT layer: mean 0.5, std 0.5 per channel).
TIMM_ARCHITECTURES: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "beit_large_patch16_224": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
}

INSTALL_HINT = "pip install 'diffsmooth-engine[timm]' (or: pip install --no-deps timm)"


def is_timm_arch(arch: str | None) -> bool:
    """True for `timm:<name>` and for the bare timm names official checkpoints record."""
    return isinstance(arch, str) and (arch.startswith(TIMM_PREFIX) or arch in TIMM_ARCHITECTURES)


def timm_model_name(arch: str) -> str:
    """The timm model name of an architecture string (`timm:` prefix removed)."""
    name = arch[len(TIMM_PREFIX):] if arch.startswith(TIMM_PREFIX) else arch
    if not name:
        raise UserError(f"architecture {arch!r} names no timm model; use timm:<model name>, e.g. timm:beit_large_patch16_224")
    return name


class _Placeholder(type):
    """Metaclass of the stand-ins: any attribute is another stand-in; instantiating one fails clearly."""

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{cls.__qualname__}.{name}")


def _placeholder(qualname: str) -> type:
    def _refuse(self, *args, **kwargs):
        raise ImportError(f"{qualname} needs torchvision, which is not installed")
    return _Placeholder(qualname.rsplit(".", 1)[-1], (), {"__init__": _refuse, "__qualname__": qualname})


class _PlaceholderModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = _placeholder(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _TorchvisionPlaceholders(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers `import torchvision[.x]` with placeholder modules; installed only around `import timm`.

    Hand-written because no package offers this: timm's model code (BEiT, ViT, ResNet...) does not use
    torchvision, and torchvision must match the installed torch build exactly, so it is not pulled in
    just to satisfy timm's module-level imports.
    """

    def find_spec(self, fullname, path, target=None):
        if fullname == "torchvision" or fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return _PlaceholderModule(spec.name)

    def exec_module(self, module):
        module.__path__ = []


def _torchvision_installed() -> bool:
    try:
        return importlib.util.find_spec("torchvision") is not None
    except (ImportError, ValueError):
        return False


def import_timm(arch: str = "timm"):
    """`import timm` (lazily), without requiring torchvision; a one-line UserError when timm is missing."""
    if "timm" in sys.modules:
        return sys.modules["timm"]
    if importlib.util.find_spec("timm") is None:
        raise UserError(f"architecture {arch!r} needs timm, which is not installed: {INSTALL_HINT}")
    if _torchvision_installed():
        try:
            return importlib.import_module("timm")
        except Exception as exc:  # noqa: BLE001 - typically a torchvision built for another torch
            if "torchvision" not in _traceback_modules(exc):
                raise UserError(f"timm is installed but cannot be imported ({_one_line(exc)}); {INSTALL_HINT}") from None
            _forget_modules(("timm", "torchvision"))   # retry as if torchvision were absent
    finder = _TorchvisionPlaceholders()
    sys.meta_path.insert(0, finder)
    try:
        return importlib.import_module("timm")
    except Exception as exc:  # noqa: BLE001 - any failure to import timm is one line for the user
        _forget_modules(("timm",))
        raise UserError(f"timm is installed but cannot be imported ({_one_line(exc)}); {INSTALL_HINT}") from None
    finally:
        sys.meta_path.remove(finder)
        # Nothing outside timm's own module globals keeps the placeholders: others see no torchvision.
        _forget_modules(("torchvision",))


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


def _forget_modules(roots) -> None:
    for name in [n for n in sys.modules if n.split(".", 1)[0] in roots]:
        del sys.modules[name]


def _traceback_modules(exc: BaseException) -> set:
    """Top-level package names of the files in an exception's traceback (and its message)."""
    found = set()
    tb = exc.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_globals.get("__name__", "")
        found.add(name.split(".", 1)[0])
        tb = tb.tb_next
    if "torchvision" in str(exc):
        found.add("torchvision")
    return found


def _check_kwargs(model_kwargs) -> dict:
    if model_kwargs is None:
        return {}
    if not isinstance(model_kwargs, Mapping) or not all(isinstance(k, str) for k in model_kwargs):
        raise UserError(f"timm model keyword arguments must be a dict with string keys, got {type(model_kwargs).__name__}")
    return dict(model_kwargs)


def create_timm_net(arch: str, num_classes: int | None = None, in_channels: int | None = None,
                    model_kwargs: Mapping | None = None, device: str | torch.device | None = None) -> nn.Module:
    """timm.create_model(name, pretrained=False, ...) in eval mode: random weights, never a download."""
    name = timm_model_name(arch)
    timm = import_timm(arch)
    kwargs = _check_kwargs(model_kwargs)
    for key in ("pretrained", "checkpoint_path", "pretrained_cfg_overlay"):
        if key in kwargs:
            raise UserError(f"timm keyword {key!r} is not allowed: weights come only from the classifier checkpoint")
    if num_classes is not None:
        kwargs["num_classes"] = int(num_classes)
    if in_channels is not None:
        kwargs["in_chans"] = int(in_channels)
    if not timm.is_model(name):
        close = timm.list_models(f"*{name.split('_')[0]}*")[:5]
        hint = f"; similar: {', '.join(close)}" if close else ""
        raise UserError(f"timm {timm.__version__} has no model {name!r}{hint}")
    try:
        with torch.device(device) if device is not None else contextlib.nullcontext():
            net = timm.create_model(name, pretrained=False, **kwargs)
    except (TypeError, ValueError, AssertionError, RuntimeError) as exc:
        raise UserError(f"timm cannot build {name!r} with {kwargs}: {first_line(exc)}") from None
    return net.eval()


def _pretrained_cfg(net: nn.Module) -> Mapping:
    cfg = getattr(net, "pretrained_cfg", None) or getattr(net, "default_cfg", None) or {}
    return cfg if isinstance(cfg, Mapping) else {}


def timm_input_stats(arch: str, net: nn.Module) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(mean, std) the classifier expects: the reference's layer for its architectures, else timm's config."""
    if arch in TIMM_ARCHITECTURES:
        return TIMM_ARCHITECTURES[arch]
    cfg = _pretrained_cfg(net)
    mean, std = cfg.get("mean"), cfg.get("std")
    if mean is None or std is None:
        raise UserError(f"timm model {timm_model_name(arch)!r} records no input mean/std; pass `normalization` and `stats`")
    return tuple(float(v) for v in mean), tuple(float(v) for v in std)


def timm_module_key(arch: str, role: str) -> str | None:
    """Module name of the model's `role` ('classifier': its head, 'first_conv': its stem) from timm's config,
    without building the model; None where the config does not say."""
    timm = import_timm(arch)
    try:
        cfg = timm.models.get_pretrained_cfg(timm_model_name(arch))
    except Exception:  # noqa: BLE001 - older timm or unregistered names: the caller's fallback
        return None
    key = getattr(cfg, role, None)
    return key if isinstance(key, str) else None


def _filter_fn(net: nn.Module):
    module = sys.modules.get(type(net).__module__)
    fn = getattr(module, "checkpoint_filter_fn", None)
    return fn if callable(fn) else None


def adapt_timm_state_dict(net: nn.Module, state_dict: Mapping[str, torch.Tensor]) -> OrderedDict:
    """Remap a checkpoint from another timm version with the model module's own checkpoint_filter_fn.

    Only renames and drops are accepted: a tensor whose shape the filter changes (timm resamples
    position embeddings / patch kernels for another image size) would change the classifier, so
    that key is refused by name instead.
    """
    expected = net.state_dict()
    state_dict = OrderedDict(state_dict)
    if set(state_dict) == set(expected) and all(tuple(state_dict[k].shape) == tuple(expected[k].shape) for k in expected):
        return state_dict
    fn = _filter_fn(net)
    if fn is None:
        return state_dict
    # Keys of modules this model does not have (another depth, another head) bypass the filter, which
    # would trip over them; the strict load afterwards names them.
    foreign = OrderedDict((k, v) for k, v in state_dict.items() if not _has_owner(net, k))
    try:
        with warnings.catch_warnings():      # resampling warnings: such a key is refused just below
            warnings.simplefilter("ignore")
            out = fn(OrderedDict((k, v) for k, v in state_dict.items() if k not in foreign), net)
    except Exception as exc:  # noqa: BLE001 - any failure of timm's remapping is a checkpoint that does not fit
        raise UserError(f"checkpoint does not fit timm model {type(net).__name__}: timm's checkpoint filter failed "
                        f"({first_line(exc)})") from None
    for key, value in out.items():
        if key in state_dict and isinstance(value, torch.Tensor) and tuple(value.shape) != tuple(state_dict[key].shape):
            raise UserError(
                f"checkpoint key {key} has shape {list(state_dict[key].shape)} but the model needs {list(value.shape)}; "
                f"timm would resample it, which changes the classifier: build the model at the checkpoint's size"
            )
    out = OrderedDict(out)
    out.update(foreign)
    return out


def _has_owner(net: nn.Module, key: str) -> bool:
    owner = key.rpartition(".")[0]
    if not owner:
        return True
    try:
        net.get_submodule(owner)
    except AttributeError:
        return False
    return True

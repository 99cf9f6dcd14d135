"""The built stages of a table, one per model architecture: a later run whose module has a held
stage's architecture gets that stage with the new weights copied into it in place, instead of a new
build (and torch.compile, and CUDA graph captures).

Why the held graphs stay valid and correct: the copy writes into the same parameter and buffer
tensors (same device, shape, dtype, strides), which compiled graphs and CUDA graphs read at run time,
and everything that differs between sigmas is such a tensor (the purifier's t* and scale factors,
the local-smoothing head's sigma'; base_classifier/). Two modules have the same architecture when
their module trees, parameter and buffer shapes and every other attribute are equal, so nothing a
graph could have baked in differs.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Dict, Optional

import torch
from torch import nn

from diffsmooth.engine.backends.torch.recompile_limit import compiled_graphs

__all__ = ["ModelSet", "architecture", "copy_weights"]


def _plain(value):
    """A comparable stand-in for a module attribute. Parameters and buffers are not attributes (their
    values are copied); a tensor kept as a plain attribute is not copied, so it only matches itself."""
    if isinstance(value, torch.Tensor):
        return ("tensor", id(value))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_plain(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted((repr(k), _plain(v)) for k, v in value.items())))
    if value is None or isinstance(value, (bool, int, float, str, torch.dtype, torch.device)):
        return value
    if dataclasses.is_dataclass(value):
        return repr(value)
    state = getattr(value, "__dict__", None)
    if state is not None and not state and not getattr(type(value), "__slots__", ()):
        # an object without instance state (diffusers' attention processors): its type says all it does
        return (type(value).__module__, type(value).__qualname__, "no state")
    return (type(value).__qualname__, id(value))       # anything else only matches itself: never reused wrongly


def architecture(module: nn.Module) -> tuple:
    """What a compiled graph of `module` may depend on besides its tensors' values: every submodule's
    type and plain attributes, and every parameter's and buffer's name, shape and dtype."""
    tree = []
    for name, sub in module.named_modules(remove_duplicate=False):
        attributes = tuple(sorted((k, _plain(v)) for k, v in vars(sub).items()
                                  if not k.startswith("_") and k != "training"))
        tree.append((name, type(sub).__module__, type(sub).__qualname__, attributes))
    tensors = tuple((name, tuple(t.shape), str(t.dtype)) for name, t in _tensors(module))
    return tuple(tree), tensors


def _tensors(module: nn.Module):
    return itertools.chain(module.named_parameters(remove_duplicate=False), module.named_buffers(remove_duplicate=False))


def copy_weights(source: nn.Module, target: nn.Module) -> None:
    """Copy every parameter and buffer of `source` into the same-named tensor of `target`, in place
    (target's tensors keep their device, layout and identity). Under inference mode, which may write
    both normal tensors and tensors made in inference mode."""
    targets = dict(_tensors(target))
    with torch.inference_mode():
        for name, tensor in _tensors(source):
            targets[name].copy_(tensor)


class _Reusing:
    """A TorchRunner whose `stage` hands back a held stage of the same architecture, weights copied in."""

    def __init__(self, runner, held: "ModelSet"):
        self._runner, self._held = runner, held

    def __getattr__(self, name):
        return getattr(self._runner, name)

    def stage(self, module: nn.Module, name: str):
        return self._held.stage(self._runner, module, name)

    def for_classifier(self) -> "_Reusing":
        """The runner's classifier backend (TorchRunner.for_classifier), its stages drawn from the same set."""
        return _Reusing(self._runner.for_classifier(), self._held)


class ModelSet:
    """A table's built stages by architecture and backend settings; counts real builds and compiles."""

    def __init__(self):
        self.held: Dict[tuple, tuple] = {}      # key -> (stage, the module it runs)
        self.builds = 0                         # stages built (moved to the device, wrapped, compiled when asked)
        self.reuses = 0                         # stages handed back with new weights copied in
        self._graphs_at_start = compiled_graphs()

    @property
    def compiles(self) -> int:
        """Graphs torch.compile compiled since this set was made (recompilations and graph breaks count)."""
        return compiled_graphs() - self._graphs_at_start

    def backend(self, runner):
        """`runner` (a TorchRunner) with its stages drawn from this set."""
        return _Reusing(runner, self)

    def stage(self, runner, module: nn.Module, name: str):
        options = tuple(sorted((getattr(runner, "compile_options", None) or {}).items()))
        settings = (str(runner.device), runner.precision, runner.channels_last, runner.compile, runner.cuda_graphs,
                    options)
        key = (name, settings, architecture(module))
        held: Optional[tuple] = self.held.get(key)
        if getattr(runner, "freezing", False):
            # a frozen graph holds the weights (and a purifier's sigma constants) it was compiled with:
            # weights copied in later would not reach it, so every run builds its own stage
            self.builds += 1
            return runner.stage(module, name)
        if held is None:
            stage = runner.stage(module, name)
            self.held[key] = (stage, module)
            self.builds += 1
            return stage
        stage, target = held
        copy_weights(module, target)
        self.reuses += 1
        return stage

    def note_built(self, stages) -> None:
        """Count the stages of a backend that builds every run (ONNX Runtime graphs, TensorRT engine files)."""
        heads = getattr(stages.score, "heads", None)
        self.builds += (stages.purify is not None) + (len(heads) if heads else 1)

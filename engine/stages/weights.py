"""What a module computes with, marked so that a later change can be seen: each parameter's and buffer's
identity, storage address, version counter, device, dtype and shape.

A compiled graph or a captured CUDA graph reads its weights where they lay when it was built. A weight
that was moved (`.to`), re-allocated (a new Parameter, `load_state_dict(assign=True)`) or written in place
(an optimizer step, `load_state_dict`) afterwards would silently change what a run certifies, or leave a
CUDA graph reading freed memory. The marks see all of these. They cannot see writes that bypass the
tensor's version counter: through `.data` or another alias, or by a foreign kernel.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass
from typing import Dict, Iterable, Optional, Tuple

import torch
from torch import nn

from diffsmooth.engine.errors import UserError, first_line


@dataclass(frozen=True)
class TensorMark:
    """One tensor's identity and place; two marks differ when the tensor was replaced, moved or written."""

    identity: int
    pointer: int
    version: Optional[int]          # None for tensors made under inference mode (they keep no counter)
    device: str
    dtype: str
    shape: Tuple[int, ...]

    @classmethod
    def of(cls, tensor: torch.Tensor) -> "TensorMark":
        try:
            version = tensor._version
        except RuntimeError:        # an inference tensor
            version = None
        return cls(id(tensor), tensor.data_ptr(), version, str(tensor.device), str(tensor.dtype), tuple(tensor.shape))


Marks = Dict[str, TensorMark]


def named_tensors(module: nn.Module) -> Iterable[Tuple[str, torch.Tensor]]:
    """Every parameter and buffer of `module` by name (shared ones under each of their names)."""
    return itertools.chain(module.named_parameters(remove_duplicate=False), module.named_buffers(remove_duplicate=False))


def mark_module(module: nn.Module, prefix: str = "") -> Marks:
    """The marks of every parameter and buffer of `module`, names prefixed with `prefix`."""
    return {prefix + name: TensorMark.of(t) for name, t in named_tensors(module)}


def first_change(before: Marks, after: Marks) -> Optional[str]:
    """How `after` differs from `before`, in a phrase naming the first tensor that changed; None if alike."""
    for name in before.keys() | after.keys():
        if name not in after:
            return f"{name} is gone"
        if name not in before:
            return f"{name} is new"
    for name, old in before.items():
        new = after[name]
        if new == old:
            continue
        if (new.device, new.dtype, new.shape) != (old.device, old.dtype, old.shape):
            return (f"{name} became {new.dtype.replace('torch.', '')} {list(new.shape)} on {new.device} "
                    f"(was {old.dtype.replace('torch.', '')} {list(old.shape)} on {old.device})")
        if new.identity != old.identity or new.pointer != old.pointer:
            return f"{name} was re-allocated"
        return f"{name} was written in place"
    return None


_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def value_fingerprint(module: nn.Module) -> str:
    """A digest of every parameter's and buffer's name, dtype, shape and value, equal on every machine that
    holds the same weights (the ranks compare it before summing votes: certify/agreement.py). Each tensor's
    bits are summed with a per-position multiplier in int64, where the sum wraps: exact in any order, on the
    tensor's own device, so a model is read once at device speed."""
    parts, sums = [], []
    for name, tensor in sorted(named_tensors(module), key=lambda item: item[0]):
        flat = tensor.detach().contiguous().reshape(-1)
        if flat.is_complex() or flat.element_size() not in _BITS:
            flat = flat.view(torch.uint8)
        bits = flat.view(_BITS[flat.element_size()]).to(torch.int64)
        position = torch.arange(bits.numel(), device=bits.device, dtype=torch.int64)
        sums.append((bits * (position * 0x9E3779B1 + 0x7F4A7C15)).sum())
        parts.append(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}")
    values = torch.stack(sums).cpu().tolist() if sums else []
    return ";".join(f"{p}={v}" for p, v in zip(parts, values))


def same_values(given: nn.Module, copy_: nn.Module) -> Optional[str]:
    """None when every parameter and buffer of `given` equals the same-named one of `copy_` (dtype, shape
    and value, wherever each lies), else the first name that differs."""
    copies = dict(named_tensors(copy_))
    for name, tensor in named_tensors(given):
        other = copies.get(name)
        if other is None or other.dtype != tensor.dtype or other.shape != tensor.shape:
            return name
        if not torch.equal(tensor.detach().cpu(), other.detach().cpu()):
            return name
    return None if len(copies) == len(dict(named_tensors(given))) else "a tensor"


class OwnedModule:
    """A caller's module and the private eval-mode copy that runs in its place (the Python API owns what it
    runs: building stages moves and converts modules in place, and a CUDA graph keeps reading where the
    weights lay). `refuse_if_changed` tells when the caller's module no longer holds the copy's weights."""

    def __init__(self, name: str, given: nn.Module):
        self.name, self.given = name, given
        try:
            self.copy = copy.deepcopy(given).eval()
        except Exception as exc:        # a module holding something deepcopy cannot copy (an open file, a lock)
            raise UserError(f"cannot copy the {name} ({type(given).__name__}: {first_line(exc)}); "
                            f"the Python API certifies a copy of each module it is given") from None
        self.marks = mark_module(given)

    def refuse_if_changed(self, owner: str) -> None:
        """A UserError when the caller's module holds other weights than the copy. A move to another device
        or any write is first seen by its marks, then judged by value, so a move alone passes."""
        marks = mark_module(self.given)
        change = first_change(self.marks, marks)
        if change is None:
            return
        differs = same_values(self.given, self.copy)
        if differs is None:
            self.marks = marks
            return
        raise UserError(f"the {self.name} given to this {owner} changed after it was built ({change}); it certifies "
                        f"the weights it was built with: build a new {owner}(...) to certify the changed {self.name}")

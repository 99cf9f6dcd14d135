"""FLOPs per sample, counted from the models themselves: one forward pass on the meta device
(no arithmetic, no memory) under torch's FlopCounterMode.

Convention: one multiply-add = 2 FLOPs; counted ops are convolution (Conv1d/2d), linear
(addmm/mm), matmul/bmm/baddbmm; elementwise work (norms, activations, softmax) is not counted.
"""

from __future__ import annotations

from typing import Dict, Tuple

import torch
from torch import nn
from torch.func import functional_call
from torch.utils.flop_counter import FlopCounterMode

CONVENTION = ("FLOPs = 2 x multiply-accumulates of conv, linear, matmul and bmm ops "
              "(elementwise ops not counted); counted with torch FlopCounterMode on meta tensors")


def _meta(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(t, device="meta")


def count_flops(module: nn.Module, *inputs: torch.Tensor) -> Tuple[int, Dict[str, int]]:
    """(total FLOPs, FLOPs per aten op) of module(*inputs), run on meta copies of every tensor."""
    state = {k: _meta(v) for k, v in module.named_parameters()}
    state.update({k: _meta(v) for k, v in module.named_buffers() if v is not None})
    args = tuple(_meta(x) for x in inputs)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        functional_call(module, state, args)
    by_op = {str(op).replace("aten.", ""): int(v) for op, v in counter.get_flop_counts()["Global"].items()}
    return int(counter.get_total_flops()), by_op


def stage_flops(module: nn.Module, image_shape, extra_shapes=(), batch: int = 2) -> Tuple[int, Dict[str, int]]:
    """FLOPs per sample of a stage module taking [B, *image_shape] (+ [B, *extra] inputs)."""
    inputs = [torch.zeros((batch, *image_shape), device="meta")]
    inputs += [torch.zeros((batch, *s), device="meta") for s in extra_shapes]
    total, by_op = count_flops(module, *inputs)
    return total // batch, {k: v // batch for k, v in by_op.items()}

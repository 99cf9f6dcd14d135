"""GPU memory a stage needs, estimated on the CPU: one forward pass on the meta device (no arithmetic, no
memory) while a dispatch mode counts the bytes of every tensor alive, as an eager run on a GPU would hold
them (the caching allocator's rounding, cuDNN workspaces and compiled code aside). The question was why
the ImageNet run at batch 32 showed 115 GiB of peak allocated memory on an H200: the estimates here are
what its tensors need; docs/performance.md, "ImageNet memory", says where the rest came from.

    python -m studies.memory --models imagenet --batch 32,64 --precision fp16
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Dict, Optional, Sequence

import click
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["LiveBytes", "forward_peak", "stage_memory", "MemoryEstimate"]

GIB = 2 ** 30


class LiveBytes(TorchDispatchMode):
    """Counts the bytes of the storages that dispatched ops create and that are still referenced; `peak`
    is the most alive at once. Inputs and weights made before the mode are not counted."""

    def __init__(self):
        super().__init__()
        self.live = 0
        self.peak = 0
        self._sizes: Dict[int, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                key = id(storage)
                if key in self._sizes:          # a view of a storage already counted
                    continue
                self._sizes[key] = storage.nbytes()
                self.live += storage.nbytes()
                self.peak = max(self.peak, self.live)
                weakref.finalize(storage, self._free, key)
        return out

    def _free(self, key: int) -> None:
        self.live -= self._sizes.pop(key)


def _meta_copy(module: nn.Module, dtype: torch.dtype) -> nn.Module:
    """`module` with every parameter and buffer on the meta device, floating ones in `dtype`."""
    copy_ = module.to("meta")
    for sub in copy_.modules():
        for name, p in list(sub.named_parameters(recurse=False)):
            if p.is_floating_point():
                setattr(sub, name, nn.Parameter(p.to(dtype), requires_grad=False))
        for name, b in list(sub.named_buffers(recurse=False)):
            if b is not None and b.is_floating_point() and b.dim() > 0:
                sub._buffers[name] = b.to(dtype)
    return copy_


def forward_peak(module: nn.Module, *inputs: torch.Tensor) -> int:
    """Peak bytes alive during module(*inputs) (inputs and weights excluded), on meta tensors."""
    counter = LiveBytes()
    with torch.inference_mode(), counter:
        out = module(*inputs)
        del out
    return counter.peak


def weight_bytes(module: nn.Module) -> int:
    seen, total = set(), 0
    for t in list(module.parameters()) + [b for b in module.buffers() if b is not None]:
        if id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total


@dataclass
class MemoryEstimate:
    """Bytes of one stage at one batch: its weights and the most of its activations alive at once."""

    stage: str
    batch: int
    dtype: str
    weights: int
    activations: int

    def line(self) -> str:
        return (f"{self.stage:<32} batch {self.batch:>5} {self.dtype:<8} weights {self.weights / GIB:6.2f} GiB, "
                f"activations at peak {self.activations / GIB:7.2f} GiB")


def stage_memory(name: str, module: nn.Module, shapes: Sequence[tuple], batch: int,
                 dtype: torch.dtype) -> MemoryEstimate:
    """The estimate for a stage taking [batch, *shape] inputs in `dtype` (its module moved to meta)."""
    meta = _meta_copy(module, dtype)
    inputs = [torch.zeros((batch, *s), device="meta", dtype=dtype) for s in shapes]
    return MemoryEstimate(name, batch, str(dtype).replace("torch.", ""), weight_bytes(meta), forward_peak(meta, *inputs))


def model_set_memory(models: str, batches: Sequence[int], precision: str = "fp16", m: int = 5,
                     fused_attention: bool = True, reference_batch: Optional[int] = 50) -> list:
    """Estimates for a bench model set: its denoiser and its local-smoothing classifier (B x m images in
    one call) at each batch in `precision` (fp16 / bf16 stand for autocast: every op in that dtype, the
    UNet's GroupNorm in fp32 as it runs), and the reference-equivalent baseline (fp32, legacy attention,
    m classifier calls of `reference_batch`)."""
    from diffsmooth.bench.models import SET_SPECS
    from diffsmooth.engine.backends.torch.stages import score_module
    from diffsmooth.engine.base_classifier.diffusion_denoiser import DiffusionDenoiser, schedule_for
    from diffsmooth.engine.base_classifier.methods import MethodConfig
    from diffsmooth.engine.models.resnet import NormalizedClassifier, build_classifier_net, normalization_layer
    from diffsmooth.engine.models.unet import UNetModel, unet_config
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[precision]
    spec = SET_SPECS[models]
    shape = tuple(spec["shape"])
    with torch.device("meta"):
        denoiser = DiffusionDenoiser(UNetModel(unet_config(spec["preset"])).eval(), schedule_for(spec["preset"]))
        classifier = NormalizedClassifier(normalization_layer("normalize", spec["stats"]),
                                          build_classifier_net(spec["arch"], spec["classes"], shape[0])).eval()
    config = MethodConfig("diffsmooth", 0.5, m=m, local_sigma=0.25)
    estimates = []
    for batch in batches:
        estimates.append(stage_memory("denoiser (UNet)", denoiser.purifier(0.5, fused_attention), [shape], batch, dtype))
        head = score_module(config, classifier, shape)
        estimates.append(stage_memory(f"classifier ({spec['arch']}, x{m} images)", head, [shape], batch, dtype))
    if reference_batch:
        estimates.append(stage_memory("reference denoiser (fp32)", denoiser.purifier(0.5), [shape],
                                      reference_batch, torch.float32))
        estimates.append(stage_memory(f"reference classifier ({spec['arch']}, fp32)", classifier, [shape],
                                      reference_batch, torch.float32))
    return estimates


@click.command()
@click.option("--models", type=click.Choice(["demo", "cifar10", "imagenet"]), default="imagenet", show_default=True)
@click.option("--batch", "batches", default="32", show_default=True, help="Comma list of batch sizes.")
@click.option("--precision", type=click.Choice(["fp32", "fp16", "bf16"]), default="fp16", show_default=True)
@click.option("--m", type=int, default=5, show_default=True)
def main(models, batches, precision, m):
    """Weights and peak activations of each stage, counted on meta tensors (no GPU needed)."""
    for estimate in model_set_memory(models, [int(b) for b in batches.split(",") if b.strip()], precision, m):
        click.echo(estimate.line())


if __name__ == "__main__":
    main()

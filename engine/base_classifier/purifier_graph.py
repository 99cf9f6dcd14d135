"""What `diffsmooth export` traces for a method's purify stage (its purifier's `graph`): the module, example
inputs and names, which inputs carry the batch, the file name's stem and the manifest fields that pick the graph
again. The default is the one-shot purifier at one sigma, its UNet timestep a constant the exporter folds away."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Tuple

import torch
from torch import nn


class ConstantTimestepUNet(nn.Module):
    """The UNet at one fixed timestep: exported with a [1] constant timestep so the whole embedding
    path folds away (eagerly [B], as the UNet checks); the purifier's own `t` is ignored."""

    def __init__(self, unet: nn.Module, model_timestep: float):
        super().__init__()
        self.unet = unet
        self.config = getattr(unet, "config", None)
        self.register_buffer("timestep", torch.tensor([float(model_timestep)], dtype=torch.float32),
                             persistent=False)

    def forward(self, x: torch.Tensor, t: Optional[torch.Tensor] = None) -> torch.Tensor:
        exporting = torch.onnx.is_in_onnx_export() or torch.jit.is_tracing()
        return self.unet(x, self.timestep if exporting else self.timestep.expand(x.shape[0]))


@dataclass
class PurifierGraph:
    """A purify stage to export: `module(*inputs)` -> its output [B, C, H, W] (the image's shape); `batch_inputs`
    name the inputs whose first dimension is the batch (the others keep their example's shape); `fields`: what
    its manifest records, of which the purifier's `lookup` picks it for a run."""

    module: nn.Module
    inputs: Tuple[torch.Tensor, ...]
    input_names: Tuple[str, ...]
    output_name: str
    stem: str                           # the file name before `_CxHxW_PRECISION.onnx`
    batch_inputs: Tuple[str, ...] = ()  # empty: every input
    fields: dict = field(default_factory=dict)

    def input_shapes(self) -> dict:
        """Each input's shape as a manifest records it ("batch" where it is dynamic)."""
        batched = set(self.batch_inputs or self.input_names)
        return {name: (["batch"] if name in batched else [int(x.shape[0])]) + [int(s) for s in x.shape[1:]]
                for name, x in zip(self.input_names, self.inputs)}


def example_batch(image_shape, batch: int = 2, seed: int = 0) -> torch.Tensor:
    """Images in [0, 1] to trace an export with."""
    g = torch.Generator().manual_seed(seed)
    return torch.rand((batch, *map(int, image_shape)), generator=g)


def one_shot_graph(denoiser, sigma: float, image_shape) -> PurifierGraph:
    """The one-shot purifier at `sigma` (a OneStepModule, in its epsilon form for the engine UNet), x_rs -> x_hat,
    its UNet's timestep constant."""
    coefficients = denoiser.schedule.coefficients(sigma)
    purifier = denoiser.purifier(sigma)
    purifier.unet = ConstantTimestepUNet(denoiser.unet, coefficients.model_timestep)
    fields = {"sigma": float(sigma), "t_star": coefficients.t, "model_timestep": coefficients.model_timestep,
              "coefficients": coefficients}
    return PurifierGraph(purifier.eval(), (example_batch(image_shape),), ("x_rs",), "x_hat", f"denoiser_s{sigma:g}",
                         fields=fields)

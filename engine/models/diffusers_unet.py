"""A diffusers `UNet2DModel` built from its folder's config and strictly loaded from safetensors.

The network is diffusers' own class (the optional `diffusers` extra), so its numerics are the ones
the model was trained with; this module only builds it, loads every tensor by name and shape (one
line naming the first mismatches, as for the engine's own checkpoints) and wraps it so that
`unet(x, t)` returns a tensor like the engine's UNet.
"""

from __future__ import annotations

import inspect
import logging
from collections import OrderedDict

import torch
from torch import nn

from diffsmooth.engine.errors import UserError, first_line
from diffsmooth.engine.models.checkpoints import load_weights, refuse_non_finite
from diffsmooth.engine.models.diffusers_folder import DiffusersFolder

__all__ = ["DiffusersUNet", "load_diffusers_unet", "import_diffusers", "INSTALL_HINT"]

INSTALL_HINT = "pip install 'diffsmooth-engine[diffusers]' (diffusers and safetensors)"


def import_diffusers():
    """The diffusers package, or a one-line UserError saying how to install it."""
    try:
        import diffusers
        import safetensors  # noqa: F401
    except ImportError as exc:
        raise UserError(f"a diffusers denoiser folder needs the diffusers and safetensors packages "
                        f"({first_line(exc)}): {INSTALL_HINT}") from None
    logging.getLogger("diffusers").setLevel(logging.ERROR)   # its config notices would print on every load
    return diffusers


class DiffusersUNet(nn.Module):
    """diffusers' UNet2DModel as `unet(x, t) -> tensor`; t is a float [B] (a long one for a learned
    timestep embedding, which indexes a table)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.config = dict(model.config)
        self.integer_timesteps = self.config.get("time_embedding_type") == "learned"

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        if self.integer_timesteps:
            t = t.round().long()
        return self.model(x, t, return_dict=False)[0]


def unknown_fields(cls, config: dict) -> list:
    """The fields of a diffusers config (its `_` entries aside) that `cls` does not take: another diffusers'."""
    accepted = set(inspect.signature(cls.__init__).parameters) - {"self"}
    return sorted(k for k in config if not k.startswith("_") and k not in accepted)


def _read_safetensors(folder: DiffusersFolder) -> OrderedDict:
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    state = OrderedDict()
    for path in folder.weights:
        try:
            part = load_file(str(path), device="cpu")
        except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
            raise UserError(f"{path} is not a readable safetensors file ({first_line(exc)[:120]}); "
                            f"copy or save it again") from None
        clash = sorted(set(part) & set(state))
        if clash:
            raise UserError(f"{path} repeats tensor {clash[0]} of another shard: the shards do not belong together")
        state.update(part)
    return state


def load_diffusers_unet(folder: DiffusersFolder) -> DiffusersUNet:
    """Build the folder's UNet2DModel from its config and load its safetensors weights strictly (eval, fp32, CPU)."""
    diffusers = import_diffusers()
    cls = diffusers.UNet2DModel
    unknown = unknown_fields(cls, folder.unet_config)
    if unknown:
        raise UserError(f"{folder.unet_dir / 'config.json'} has field(s) {', '.join(unknown[:5])} that diffusers "
                        f"{diffusers.__version__} does not know: upgrade diffusers, or fix the config")
    config = {k: v for k, v in folder.unet_config.items() if not k.startswith("_")}
    try:
        with torch.device("meta"):      # every tensor comes from the weights file: skip the random init
            model = cls(**config)
    except (TypeError, ValueError, KeyError, AssertionError, AttributeError, RuntimeError) as exc:
        raise UserError(f"{folder.unet_dir / 'config.json'}: diffusers cannot build {cls.__name__} from it "
                        f"({type(exc).__name__}: {first_line(exc)[:160]})") from None
    state = _read_safetensors(folder)
    refuse_non_finite(state, folder.unet_dir)
    load_weights(model, state, f"the {cls.__name__} of {folder.unet_dir / 'config.json'}", assign=True)
    left = [name for name, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise UserError(f"{folder.unet_dir}: tensor(s) {', '.join(left[:3])} are not in the weights file")
    return DiffusersUNet(model.float().eval()).eval()

"""Named fast-path variants (the time-per-sample options) that `diffsmooth bench --variants` measures side by side and
`bench.agreement --variants` judges against eager fp32: one spec is tokens joined by '+', each token a
change from the default CUDA path, e.g. `lean-unet+freezing+batch=64`. `default` is today's path.

| token | what it changes |
|---|---|
| default | nothing (today's path) |
| lean-unet | the UNet's eps-only copy, t*'s embedding once per call (`--lean-unet`) |
| max-autotune | torch.compile mode max-autotune-no-cudagraphs (`--compile-mode`) |
| classifier-max-autotune | that mode for the classifier stage alone (`--classifier-compile-mode`) |
| coordinate-descent, freezing, no-epilogue-fusion, epilogue-fusion-first | inductor knobs (`--inductor`) |
| fused-conv | BatchNorm folded, cuDNN fused conv + add + ReLU (`--fused-conv`) |
| triton-conv | BatchNorm folded, Triton convolutions (`--triton-conv`) |
| triton-blocks | the same, each stride-1 BasicBlock one Triton kernel (`--triton-conv --triton-blocks`) |
| classifier-batch=N | at most N samples per classifier call (`--classifier-batch`) |
| pack-images=K | a CIFAR ResNet's first stage on K (2 or 4) images per tensor (`--pack-images`) |
| batch=N | the Monte Carlo batch (the UNet's) |
"""

from __future__ import annotations

from typing import Dict, Tuple

from diffsmooth.engine.backends.torch.compile_options import INDUCTOR_KNOBS
from diffsmooth.engine.backends.torch.stages import check_classifier_rewrites
from diffsmooth.engine.choices import MAX_BATCH
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.models.packed_resnet import packing

__all__ = ["DEFAULT", "TOKENS", "parse_variant", "parse_variants", "variant_flags"]

DEFAULT = "default"
FLAG_TOKENS: Dict[str, Dict[str, object]] = {
    "lean-unet": {"lean_unet": True},
    "max-autotune": {"compile_mode": "max-autotune-no-cudagraphs"},
    "classifier-max-autotune": {"classifier_compile_mode": "max-autotune-no-cudagraphs"},
    "fused-conv": {"fused_conv": True},
    "triton-conv": {"triton_conv": True},
    "triton-blocks": {"triton_conv": True, "triton_blocks": True},
    **{knob: {"inductor": (knob,)} for knob in INDUCTOR_KNOBS},
}
NUMBER_TOKENS = {"classifier-batch": "classifier_batch", "batch": "batch", "pack-images": "pack_images"}
TOKENS = (DEFAULT, *FLAG_TOKENS, *(f"{t}=N" for t in NUMBER_TOKENS))


def parse_variant(spec: str) -> Dict[str, object]:
    """'lean-unet+freezing+batch=64' -> the settings it changes ({} for 'default'); a UserError naming
    the tokens when one is unknown, repeated or contradicts another."""
    tokens = [t.strip() for t in str(spec).split("+") if t.strip()]
    if not tokens:
        raise UserError(f"empty variant {spec!r}")
    if tokens == [DEFAULT]:
        return {}
    changes: Dict[str, object] = {}
    for token in tokens:
        name, _, value = token.partition("=")
        if name in NUMBER_TOKENS and value:
            field = NUMBER_TOKENS[name]
            try:
                number = int(value)
            except ValueError:
                number = 0
            if name == "pack-images":
                try:
                    if packing(number) is None:
                        raise UserError("pack-images=1 is the default: give 2 or 4")
                except UserError as exc:
                    raise UserError(f"variant {spec!r}: {exc}") from None
            if not 1 <= number <= MAX_BATCH:
                raise UserError(f"variant {spec!r}: {name} needs an integer 1..{MAX_BATCH:,}, got {value!r}")
            new = {field: number}
        elif token in FLAG_TOKENS and not value:
            new = dict(FLAG_TOKENS[token])
        else:
            raise UserError(f"variant {spec!r}: unknown token {token!r}; tokens: {', '.join(TOKENS)} (joined by '+')")
        for key, v in new.items():
            if key == "inductor":
                if token in changes.get("inductor", ()):
                    raise UserError(f"variant {spec!r} names {token} twice")
                changes["inductor"] = tuple(changes.get("inductor", ())) + tuple(v)
            elif key in changes and changes[key] != v:
                raise UserError(f"variant {spec!r} sets {key} twice")
            else:
                changes[key] = v
    try:
        check_classifier_rewrites(changes.get("fused_conv", False), changes.get("triton_conv", False),
                                  changes.get("pack_images"))
    except UserError as exc:
        raise UserError(f"variant {spec!r}: {exc}") from None
    return changes


def parse_variants(text) -> Tuple[str, ...]:
    """'default,lean-unet,freezing' -> the specs, each checked, each once, spaces dropped."""
    specs = tuple(s.strip().replace(" ", "") for s in (text.split(",") if isinstance(text, str) else text) if s.strip())
    for spec in specs:
        parse_variant(spec)
    if len(set(specs)) != len(specs):
        raise UserError(f"a variant is named twice: {','.join(specs)}")
    return specs


def variant_flags(spec: str) -> Dict[str, object]:
    """The FastPath.resolve keywords of a variant (its batch left out: that is the run's, not the path's)."""
    return {k: v for k, v in parse_variant(spec).items() if k != "batch"}

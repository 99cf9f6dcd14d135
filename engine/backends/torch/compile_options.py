"""How the torch backend compiles its stages: torch.compile's mode and inductor knobs, as one options
dict handed to `torch.compile(options=...)`, which inductor applies to that compile only (no process-wide
config change, so two stages or two runs in one process can compile differently).

Modes that capture CUDA graphs themselves (`reduce-overhead`, `max-autotune`) are refused: the engine
captures its own graphs (engine/backends/torch/cuda_graphs.py). `freezing` makes inductor treat parameters and
buffers as constants (BatchNorm folds into the convolutions); a frozen graph no longer reads them, so it
cannot follow weights copied in later (a table's model set) or another sigma's purifier constants.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

from diffsmooth.engine.errors import UserError

__all__ = ["COMPILE_MODES", "INDUCTOR_KNOBS", "Compilation", "compile_options", "parse_inductor_knobs", "freezes"]

# torch.compile modes the engine accepts; "default" is torch's own default (what runs when none is given).
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs")
# Each knob: the inductor config it sets, and one line of what it does.
INDUCTOR_KNOBS: Dict[str, Tuple[Dict[str, object], str]] = {
    "coordinate-descent": ({"coordinate_descent_tuning": True},
                           "tune each generated kernel's block sizes by coordinate descent"),
    "freezing": ({"freezing": True},
                 "weights as constants: BatchNorm folded into convolutions, constant subgraphs precomputed"),
    "no-epilogue-fusion": ({"epilogue_fusion": False}, "do not fuse pointwise epilogues into matmul templates"),
    "epilogue-fusion-first": ({"epilogue_fusion_first": True}, "fuse epilogues before other fusions"),
}


@dataclass(frozen=True)
class Compilation:
    """How compiled stages compile: torch.compile's mode, the inductor knobs, the classifier stage's own mode."""

    mode: Optional[str] = None                  # None: torch's default
    inductor: Tuple[str, ...] = ()              # knob names of INDUCTOR_KNOBS
    classifier_mode: Optional[str] = None       # None: `mode`


def parse_inductor_knobs(value) -> Tuple[str, ...]:
    """'coordinate-descent,freezing' (or a sequence of names) -> a tuple of known knob names, each once,
    in a fixed order (the order never changes what is compiled)."""
    if value is None or value == "" or value == ():
        return ()
    names = [v.strip() for v in (value.split(",") if isinstance(value, str) else value)]
    names = [n for n in names if n]
    unknown = [n for n in names if n not in INDUCTOR_KNOBS]
    if unknown:
        raise UserError(f"unknown inductor knob(s) {', '.join(unknown)}: choose from {', '.join(INDUCTOR_KNOBS)}")
    if len(set(names)) != len(names):
        raise UserError(f"`inductor` names a knob twice: {','.join(names)}")
    return tuple(k for k in INDUCTOR_KNOBS if k in names)


def check_compile_mode(mode: Optional[str]) -> Optional[str]:
    """The mode, or a UserError naming the accepted ones."""
    if mode is None or mode in COMPILE_MODES:
        return mode
    raise UserError(f"`compile_mode` must be one of {', '.join(COMPILE_MODES)}, got {mode!r} (modes that "
                    f"capture CUDA graphs themselves are left out: the engine captures its own)")


def compile_options(mode: Optional[str], knobs: Sequence[str] = ()) -> Optional[dict]:
    """The inductor options of `mode` (torch's list for it) with the knobs' settings on top; None when
    nothing differs from torch.compile's default (so the default path compiles exactly as before)."""
    check_compile_mode(mode)
    options: dict = {}
    if mode not in (None, "default"):
        import torch._inductor
        options.update(torch._inductor.list_mode_options(mode))
        options["triton.cudagraphs"] = False
    for knob in parse_inductor_knobs(tuple(knobs)):
        options.update(INDUCTOR_KNOBS[knob][0])
    return options or None


def freezes(knobs: Sequence[str]) -> bool:
    """Whether compiled graphs hold the weights as constants (the `freezing` knob)."""
    return "freezing" in tuple(knobs)

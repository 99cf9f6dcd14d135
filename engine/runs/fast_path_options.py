"""The GPU fast path's settings, each declared once (FAST_PATH_OPTIONS): FastPath's fields (engine/runs/fast_path.py),
the command-line options of certify / predict / table and bench, and what a run asks (AskedFastPath, each value
checked here once) all come from this table. Loads no torch, so `--help` stays light."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Optional, Tuple

from diffsmooth.engine.backends.torch.compile_options import (
    COMPILE_MODES,
    INDUCTOR_KNOBS,
    check_compile_mode,
    parse_inductor_knobs,
)
from diffsmooth.engine.choices import MAX_BATCH
from diffsmooth.engine.errors import UserError


@dataclass(frozen=True)
class FastPathOption:
    """One setting of the fast path: its name (a FastPath field, a keyword, the option `--name-with-dashes`), type
    (bool, int or str), the value a run asks when not given (`default`; None: the backend's rule for the device,
    FastPath.resolve), FastPath's value with it off (`off`), the values it takes (`choices`, or `low`..`high`, or
    `parse`: text or a value -> the value kept) and help. `asked`: False for a field FastPath derives (a user never
    sets it). `variant`: a time-per-sample variant (off until a GPU has measured it; for the torch backend only;
    recorded only when set). `optional`: recorded in settings files only when on (files written before it existed
    still resume). `single`: refused in a sweep (sweeps run the classifiers as they are)."""

    name: str
    kind: type
    help: str = ""
    default: Any = None
    off: Any = False
    choices: Tuple = ()
    low: Optional[int] = None
    high: Optional[int] = None
    parse: Optional[Callable[[Any], Any]] = None
    metavar: Optional[str] = None
    asked: bool = True
    variant: bool = False
    optional: bool = False
    single: bool = False

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def check(self, value):
        """`value` as the run keeps it (None: not given), or one line saying why not."""
        if value is None:
            return None
        if self.parse is not None:
            return self.parse(value)
        if self.kind is bool:
            if not isinstance(value, bool):
                raise UserError(f"`{self.name}` must be true or false, got {value!r}")
            return value
        bad = isinstance(value, bool) or not isinstance(value, int)
        if self.choices and (bad or value not in self.choices):
            raise UserError(f"`{self.name}` must be one of {', '.join(map(str, self.choices))}, got {value!r}")
        if bad or (self.low is not None and value < self.low):
            raise UserError(f"`{self.name}` must be an integer >= {self.low}, got {value!r}")
        if self.high is not None and value > self.high:
            raise UserError(f"`{self.name}` must be <= {self.high:,}, got {value!r}")
        return value


FAST_PATH_OPTIONS = (
    FastPathOption("compile", bool, "torch.compile the stages at one static batch shape [default: on for CUDA]."),
    FastPathOption("cuda_graphs", bool,
                   "Replay each compiled stage from a CUDA graph [default: on with --compile on CUDA]."),
    FastPathOption("streams", int, "2: denoise batch k+1 while classifying batch k on two CUDA streams [default: 2 on "
                   "CUDA].", off=1, choices=(1, 2)),
    FastPathOption("static_batch", bool, asked=False),          # compiled stages and graphs: one batch shape a run
    FastPathOption("compiled_noise", bool, asked=False),        # the noise drawn by a compiled kernel (CUDA)
    FastPathOption("fused_attention", bool, "Run the UNet's attention through scaled_dot_product_attention (flash "
                   "kernels) [default: on with --compile on CUDA].", optional=True),
    FastPathOption("fused_conv", bool, "ResNet classifiers with BatchNorm folded into the convolutions and conv + add "
                   "+ ReLU as one cuDNN call on CUDA [default: off; see docs/status.md].", default=False,
                   optional=True, single=True),
    FastPathOption("lean_unet", bool, "The UNet computes only its noise estimate (not the learned-sigma channels) and "
                   "t*'s time embedding once per batch; the same maths [default: off; never run on a GPU].",
                   variant=True),
    FastPathOption("compile_mode", str, "torch.compile mode of the stages; max-autotune-no-cudagraphs autotunes "
                   "conv/matmul kernels (a much longer first compile) [default: torch's default].", off=None,
                   choices=COMPILE_MODES, parse=check_compile_mode, variant=True),
    FastPathOption("inductor", tuple, "Inductor knobs for the compiled stages: " + ", ".join(INDUCTOR_KNOBS) +
                   " [default: none].", off=(), parse=parse_inductor_knobs, metavar="KNOB[,KNOB]", variant=True),
    FastPathOption("classifier_batch", int, "Most samples per classifier call (x m images with local smoothing), apart "
                   "from the UNet's --batch [default: the whole batch when it fits half the free GPU memory].",
                   off=None, low=1, high=MAX_BATCH, variant=True),
    FastPathOption("triton_conv", bool, "ResNet classifiers with BatchNorm folded and each conv + bias + add + ReLU one "
                   "Triton kernel on CUDA [default: off; never run on a GPU].", default=False, variant=True,
                   single=True),
    FastPathOption("triton_blocks", bool, "With --triton-conv: each stride-1 residual block one Triton kernel, its "
                   "intermediate kept on chip [default: off; never run on a GPU].", default=False, variant=True),
    FastPathOption("pack_images", int, "CIFAR ResNets' 16-channel first stage on K images per tensor (block-diagonal "
                   "weights, the same maths) [default: 1; never run on a GPU].", off=None, choices=(1, 2, 4),
                   variant=True, single=True),
    FastPathOption("classifier_compile_mode", str, "The classifier stage's own torch.compile mode, e.g. "
                   "max-autotune-no-cudagraphs for the classifier alone [default: --compile-mode's].", off=None,
                   choices=COMPILE_MODES, parse=check_compile_mode, variant=True, single=True),
)
OPTIONS = {o.name: o for o in FAST_PATH_OPTIONS}

# What a user may ask of the fast path (command-line options, RunRequest and bench settings of these names).
ASKED = tuple(o.name for o in FAST_PATH_OPTIONS if o.asked)

# FastPath fields recorded only when on / set (result files written without them still resume).
OPTIONAL_KEYS = tuple(o.name for o in FAST_PATH_OPTIONS if o.optional or o.variant)


def _post_init(self):
    for name in ASKED:
        object.__setattr__(self, name, OPTIONS[name].check(getattr(self, name)))


def _given(self) -> dict:
    """The settings asked for (None: not given, left to the backend's default)."""
    return {name: getattr(self, name) for name in ASKED if getattr(self, name) is not None}


def _replace(self, **changes) -> "AskedFastPath":
    return dataclasses.replace(self, **changes)


# What a run asks of the fast path: each setting of ASKED as given (None: the default), checked once when made.
AskedFastPath = dataclasses.make_dataclass(
    "AskedFastPath", [(o.name, Any, dataclasses.field(default=o.default)) for o in FAST_PATH_OPTIONS if o.asked],
    frozen=True, namespace={"__post_init__": _post_init, "given": _given, "replace": _replace,
                            "__doc__": "What a run asks of the fast path (FAST_PATH_OPTIONS), each value checked once."})
AskedFastPath.__module__ = __name__

# FastPath's fields (engine/runs/fast_path.py adds its rules): each setting off.
FastPathFields = dataclasses.make_dataclass(
    "FastPathFields", [(o.name, Any, dataclasses.field(default=o.off)) for o in FAST_PATH_OPTIONS], frozen=True)
FastPathFields.__module__ = __name__

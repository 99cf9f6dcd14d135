"""Torch backend: stages are nn.Modules run under inference_mode, on CPU or CUDA, in fp32 or
autocast fp16/bf16 (GroupNorm statistics and softmax stay fp32 inside the models).

The fast path (default on CUDA): channels_last, `torch.compile` at one static batch shape,
cudnn.benchmark, and each stage replayed from a CUDA graph (engine/backends/torch/cuda_graphs.py). The compile's
mode and inductor knobs, when asked for, are that compile's own options (engine/backends/torch/compile_options.py).
"""

from __future__ import annotations

import contextlib
import copy
import sys
from typing import Optional

import torch
from torch import nn

from diffsmooth.engine.backends.torch.compile_cache import use_compile_cache
from diffsmooth.engine.backends.torch.compile_options import Compilation, check_compile_mode, compile_options, freezes
from diffsmooth.engine.backends.torch.cuda_graphs import CudaGraphStage
from diffsmooth.engine.backends.torch.recompile_limit import is_recompile_limit_hit, reserve_compiled_stage
from diffsmooth.engine.errors import UserError

# a run's precision (choices.RUN_PRECISIONS) -> the dtype torch.autocast runs the stages at (fp32: no autocast)
AUTOCAST_DTYPES = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}


def resolve_device(device: str) -> torch.device:
    """torch.device from a user string; a CUDA device that is not there is a UserError."""
    try:
        dev = torch.device(device)
    except RuntimeError as exc:
        raise UserError(f"unknown device {device!r}: use cpu, cuda or cuda:N") from exc
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError(f"device {device!r} requested but CUDA is not available on this machine")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise UserError(f"device {device!r} requested but this machine has {torch.cuda.device_count()} GPU(s)")
    return dev


class _ChannelsLast(nn.Module):
    """Feeds the wrapped module its 4-D inputs in channels_last layout (what cuDNN/inductor like)."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module.to(memory_format=torch.channels_last)

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        converted = [t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t for t in inputs]
        return self.module(*converted)


class TorchStage:
    """A module as a Stage: fp32 tensors in, fp32 tensor out. The stage takes the module over: it moves
    it to the device (and to channels_last) in place; `weights` is that module, for engine/stages/weights.py."""

    def __init__(self, module: nn.Module, name: str, device: torch.device, precision: str = "fp32",
                 channels_last: bool = False, compile: bool = False, log=None, options: Optional[dict] = None):
        if precision not in AUTOCAST_DTYPES:
            raise UserError(f"precision must be one of {', '.join(AUTOCAST_DTYPES)}, got {precision!r}")
        if precision != "fp32" and device.type != "cuda":
            raise UserError(f"precision {precision} is for CUDA devices; use fp32 on {device.type}")
        self.name, self.device, self.precision = name, device, precision
        self.compiled = bool(compile)
        module = module.eval().to(device)
        self.weights = module
        # The uncompiled stage: for one-off calls (shape probes) that must not compile a new graph.
        self.eager = TorchStage(module, name, device, precision) if (compile or channels_last) else self
        if channels_last:
            module = _ChannelsLast(module)          # converts `weights` in place
        self.log = log or (lambda message: print(message, file=sys.stderr))
        self._uncompiled = module
        if compile:
            reserve_compiled_stage()
        # dynamic=False: the pipeline feeds one static batch shape, so one graph serves the run. `options`:
        # inductor settings for this compile only (mode and knobs; None compiles as torch's default).
        self.options = dict(options) if (compile and options) else None
        if not compile:
            self.module = module
        elif self.options:
            self.module = torch.compile(module, dynamic=False, options=self.options)
        else:
            self.module = torch.compile(module, dynamic=False)

    def _autocast(self):
        dtype = AUTOCAST_DTYPES[self.precision]
        if dtype is None:
            return contextlib.nullcontext()
        # No weight-cast cache: a CUDA graph must capture the casts, not reuse tensors made outside it.
        return torch.autocast(device_type=self.device.type, dtype=dtype, cache_enabled=False)

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode(), self._autocast():
            try:
                return self.module(*inputs).float()
            except Exception as exc:
                if not (self.compiled and is_recompile_limit_hit(exc)):
                    raise
            self._fall_back_to_eager()
            return self.module(*inputs).float()

    def _fall_back_to_eager(self) -> None:
        """dynamo's recompile limit was hit: run this stage uncompiled from now on, and say so."""
        import torch._dynamo.config as config
        self.module, self.compiled = self._uncompiled, False
        self.log(f"# {self.name}: torch.compile's recompile limit ({config.recompile_limit}) was reached; "
                 f"this stage runs eager (uncompiled) from now on")


class TorchRunner:
    """Builds TorchBackend on one device and precision, eager or compiled (+ CUDA graphs); `compilation`: how
    compiled stages compile (their mode and inductor knobs, the classifier stage's own mode)."""

    name = "torch"

    def __init__(self, device: str = "cpu", precision: str = "fp32", channels_last: Optional[bool] = None,
                 compile: bool = False, cuda_graphs: bool = False, log=None,
                 compilation: Compilation = Compilation()):
        compile_mode, inductor = compilation.mode, compilation.inductor
        classifier_compile_mode = compilation.classifier_mode
        self.device = resolve_device(device)
        self.precision = precision
        if (compile_mode not in (None, "default") or classifier_compile_mode not in (None, "default") or inductor) \
                and not compile:
            raise UserError("`compile_mode`, `classifier_compile_mode` and `inductor` set how stages compile: they "
                            "need `compile`")
        self.compile_mode, self.inductor = compile_mode, tuple(inductor)
        self.compile_options = compile_options(compile_mode, self.inductor) if compile else None
        # the classifier stage's own mode (for_classifier); None: the same as every stage's
        check_compile_mode(classifier_compile_mode)
        self.classifier_compile_mode = None if classifier_compile_mode in (None, "default") else classifier_compile_mode
        self._classifier_options = (compile_options(self.classifier_compile_mode, self.inductor)
                                    if compile and self.classifier_compile_mode else None)
        self.freezing = bool(compile) and freezes(self.inductor)     # compiled graphs hold the weights as constants
        # channels_last pays off for compiled CUDA convolutions; elsewhere it only reorders memory.
        self.channels_last = (compile and self.device.type == "cuda") if channels_last is None else channels_last
        self.compile = compile
        self.cuda_graphs = bool(cuda_graphs) and self.device.type == "cuda"
        self.log = log or (lambda message: print(message, file=sys.stderr))
        if compile:
            use_compile_cache()
        if self.device.type == "cuda" and (compile or channels_last):
            torch.backends.cudnn.benchmark = True      # one static shape: autotune its convolutions once

    def for_classifier(self) -> "TorchRunner":
        """The backend the classifier stage is built with: this one, or, with `classifier_compile_mode`, a copy whose
        stages compile in that mode (the inductor knobs kept), so autotuning spends its time on the classifier only."""
        if self.classifier_compile_mode is None:
            return self
        twin = copy.copy(self)
        twin.compile_mode, twin.classifier_compile_mode = self.classifier_compile_mode, None
        twin.compile_options = self._classifier_options
        return twin

    def stage(self, module: nn.Module, name: str):
        stage = TorchStage(module, name, self.device, self.precision, self.channels_last, self.compile, self.log,
                           self.compile_options)
        if self.cuda_graphs:
            return CudaGraphStage(stage, log=self.log)
        return stage

"""A Stage replayed from CUDA graphs: one graph per input shape, captured after warm-up.

Each capture is checked once: the replay's output must match the uncaptured call on the same
input, else that shape falls back to the plain stage with one message. Replays write into
static buffers, so the output is cloned: the next replay must not overwrite a batch still being
read on another stream.
"""

from __future__ import annotations

from typing import Callable, Dict, Optional, Tuple

import torch

from diffsmooth.engine.errors import first_line

WARMUP_CALLS = 2        # the first call compiles/autotunes; the second runs the steady state


def replay_matches(replayed: torch.Tensor, expected: torch.Tensor) -> Tuple[bool, float]:
    """(close enough, max |difference|): bit-identical is the rule, 1e-3 relative the limit."""
    if replayed.shape != expected.shape:
        return False, float("inf")
    diff = float((replayed - expected).abs().max()) if replayed.numel() else 0.0
    scale = float(expected.abs().max()) if expected.numel() else 0.0
    return diff <= 1e-3 * (1.0 + scale), diff


class CudaGraphStage:
    """Wraps a Stage; calls with a new input shape capture a graph, later calls replay it."""

    def __init__(self, stage, log: Optional[Callable[[str], None]] = None):
        self.stage = stage
        self.name, self.device, self.precision = stage.name, stage.device, stage.precision
        self.eager = getattr(stage, "eager", stage)
        self.log = log or (lambda message: None)
        self.graphs: Dict[tuple, tuple] = {}
        self.fallback: Dict[tuple, str] = {}

    @staticmethod
    def _key(inputs) -> tuple:
        return tuple((tuple(t.shape), t.dtype) for t in inputs)

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        key = self._key(inputs)
        if key in self.fallback:
            return self.stage(*inputs)
        entry = self.graphs.get(key) or self._capture(key, inputs)
        if entry is None:
            return self.stage(*inputs)
        static_inputs, graph, static_output = entry
        for buffer, value in zip(static_inputs, inputs):
            buffer.copy_(value)
        graph.replay()
        return static_output.clone()

    def _capture(self, key: tuple, inputs) -> Optional[tuple]:
        shapes = ", ".join(str(list(s)) for s, _ in key)
        try:
            static_inputs = [t.detach().clone() for t in inputs]
            current = torch.cuda.current_stream(self.device)
            side = torch.cuda.Stream(self.device)
            side.wait_stream(current)
            with torch.cuda.stream(side):
                for _ in range(WARMUP_CALLS):
                    expected = self.stage(*static_inputs)
            current.wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_output = self.stage(*static_inputs)
            graph.replay()
            ok, diff = replay_matches(static_output, expected)
        except Exception as exc:        # capture is an optimisation: any failure means "run uncaptured"
            self.fallback[key] = first_line(exc)
            self.log(f"# CUDA graph capture failed for {self.name} at {shapes} ({first_line(exc)}); running uncaptured")
            torch.cuda.synchronize(self.device)
            return None
        if not ok:
            self.fallback[key] = f"replay differs by {diff:.3g}"
            self.log(f"# CUDA graph replay of {self.name} at {shapes} differs from the uncaptured call by "
                     f"{diff:.3g}; running uncaptured")
            return None
        self.log(f"# CUDA graph of {self.name} at {shapes}: replay checked against the uncaptured call "
                 f"(max |diff| {diff:.3g})")
        self.graphs[key] = (static_inputs, graph, static_output)
        return self.graphs[key]

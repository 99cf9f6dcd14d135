"""A Stage replayed from CUDA graphs: one graph per input shape, captured after warm-up.

Each capture is checked once: the replay's output must match the uncaptured call on the same
input, else that shape falls back to the plain stage with one message. A failed capture discards
the graph and its memory pool and checks that the stream still works before running uncaptured. Replays write into
static buffers, so the output is cloned: the next replay must not overwrite a batch still being
read on another stream.
"""

from __future__ import annotations

from typing import Callable, Dict, Optional, Tuple

import torch

from diffsmooth.engine.errors import UserError, first_line

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
        self.weights = getattr(stage, "weights", None)      # what the captured graphs read (backends/weights.py)
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
        graph = None
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
            static_inputs = static_output = expected = None
            self._discard(graph)
            graph = None
            problem = stream_problem(self.device)
            if problem is not None:
                raise UserError(f"CUDA graph capture of {self.name} at {shapes} failed ({first_line(exc)}) and left "
                                f"the GPU unusable ({problem}); rerun with `cuda_graphs` off") from exc
            self.log(f"# CUDA graph capture failed for {self.name} at {shapes} ({first_line(exc)}); the graph and "
                     f"its memory pool were discarded and the stream checked usable; running uncaptured")
            return None
        if not ok:
            self.fallback[key] = f"replay differs by {diff:.3g}"
            self._discard(graph)
            self.log(f"# CUDA graph replay of {self.name} at {shapes} differs from the uncaptured call by "
                     f"{diff:.3g}; running uncaptured")
            return None
        self.log(f"# CUDA graph of {self.name} at {shapes}: replay checked against the uncaptured call "
                 f"(max |diff| {diff:.3g})")
        self.graphs[key] = (static_inputs, graph, static_output)
        return self.graphs[key]

    def _discard(self, graph) -> None:
        """Free a graph and its private memory pool (best effort: a failed capture may have half-built it)."""
        if graph is not None:
            try:
                graph.reset()
            except Exception:
                pass
        try:
            torch.cuda.synchronize(self.device)
        except Exception:
            pass                        # stream_problem reports it
        torch.cuda.empty_cache()

    def release(self) -> None:
        """Drop every captured graph and its pool (the stage stops replaying, e.g. after out-of-memory)."""
        graphs, self.graphs = self.graphs, {}
        for _, graph, _ in graphs.values():
            self._discard(graph)


def stream_problem(device) -> Optional[str]:
    """None when the device's current stream still runs work and synchronises (checked with a tiny
    kernel); else the error, e.g. a capture that left the context in an error state."""
    try:
        if torch.cuda.is_current_stream_capturing():
            return "the stream is still capturing"
        probe = torch.ones(4, device=device)
        probe.add_(1)
        torch.cuda.current_stream(device).synchronize()
        if float(probe.sum()) != 8.0:
            return "a test kernel computed a wrong result"
    except Exception as exc:
        return first_line(exc)
    return None

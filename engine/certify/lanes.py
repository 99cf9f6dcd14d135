"""Two-lane scheduling of the base classifier: lane 1 makes noisy samples and denoises them,
lane 2 classifies and counts. On CUDA the lanes are two streams, so the denoiser of batch k+1
(compute-bound UNet) overlaps the classifier of batch k (memory-bound ResNet); elsewhere both
lanes are the current stream and the same code runs in order.
"""

from __future__ import annotations

import contextlib
from typing import List

import torch


class SerialLanes:
    """Both lanes on the current stream: CPU, or CUDA with --streams 1."""

    overlapping = False

    def begin(self) -> None:
        pass

    def producer(self):
        return contextlib.nullcontext()

    def consumer(self):
        return contextlib.nullcontext()

    def handoff(self, tensors: List[torch.Tensor]):
        """Mark producer output ready; returns a token `accept` takes on the consumer lane."""
        return None

    def accept(self, token, tensors: List[torch.Tensor]) -> None:
        pass

    def end(self) -> None:
        pass


class CudaStreamLanes:
    """Two CUDA streams ordered by events; tensors crossing lanes are recorded on the consumer
    stream so the caching allocator never hands their memory to the producer too early."""

    overlapping = True

    def __init__(self, device: torch.device):
        self.device = device
        self.produce_stream = torch.cuda.Stream(device)
        self.consume_stream = torch.cuda.Stream(device)

    def begin(self) -> None:
        current = torch.cuda.current_stream(self.device)
        self.produce_stream.wait_stream(current)
        self.consume_stream.wait_stream(current)

    def producer(self):
        return torch.cuda.stream(self.produce_stream)

    def consumer(self):
        return torch.cuda.stream(self.consume_stream)

    def handoff(self, tensors: List[torch.Tensor]):
        event = torch.cuda.Event()
        event.record(self.produce_stream)
        return event

    def accept(self, token, tensors: List[torch.Tensor]) -> None:
        self.consume_stream.wait_event(token)
        for t in tensors:
            if t is not None and t.is_cuda:
                t.record_stream(self.consume_stream)

    def end(self) -> None:
        current = torch.cuda.current_stream(self.device)
        current.wait_stream(self.produce_stream)
        current.wait_stream(self.consume_stream)


def lanes_for(device: torch.device, streams: int):
    """CudaStreamLanes for streams=2 on CUDA, else SerialLanes."""
    if device.type == "cuda" and streams >= 2:
        return CudaStreamLanes(device)
    return SerialLanes()

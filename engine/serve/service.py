"""What the server answers, without the web framework: metadata, readiness and infer (checked request -> the model's
worker -> results -> response bytes), on the models, their workers, the noise key and the limits."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from typing import Awaitable, Callable, Dict, List, Optional, Tuple

import numpy as np

from diffsmooth.engine.serve.batcher import ModelWorker, result_of
from diffsmooth.engine.serve.limits import BadRequest, Limits
from diffsmooth.engine.serve.model_registry import ServedModel
from diffsmooth.engine.serve.noise_key import IndexCounter, NoiseKey
from diffsmooth.engine.serve.protocol import INPUT, OUTPUTS, InferRequest, encode_infer, parse_infer

SERVER_NAME = "diffsmooth"
EXTENSIONS = ["binary_tensor_data", "model_repository"]


POLL_SECONDS = 0.25        # how often a waiting request checks its client is still there


async def _never() -> bool:
    return False


class ClientGone(Exception):
    """The client disconnected before its answer: nothing is sent (499 in the log line)."""

    status = 499


class DeadlineExceeded(Exception):
    """The request's deadline passed before its images were answered: 504, its samples freed."""

    status = 504


@dataclass
class Answer:
    """An infer response: its body and headers, and what the request log line says of it."""

    body: bytes
    headers: Dict[str, str]
    request_id: str
    images: int
    mode: str


class Service:
    """The models by name, each with its worker; ready once started, not ready once stopping."""

    def __init__(self, models: List[ServedModel], key: NoiseKey, limits: Limits, log=print):
        self.models = {m.name: m for m in models}
        self.key, self.limits, self.log = key, limits, log
        self.counter = IndexCounter()
        self.workers: Dict[str, ModelWorker] = {}
        self.ready = False

    def start(self) -> None:
        for name, model in self.models.items():
            self.workers[name] = ModelWorker(model.pipeline(), model.batch, self.limits.max_queue, self.counter,
                                             self.log).start()
        self.ready = True

    def stop(self) -> None:
        self.ready = False
        for worker in self.workers.values():
            worker.close()
        for worker in self.workers.values():
            worker.thread.join(timeout=30)

    def model(self, name: str) -> ServedModel:
        if name not in self.models:
            raise BadRequest(f"unknown model `{name[:60]}`; served: {', '.join(self.models)}")
        return self.models[name]

    def server_metadata(self) -> dict:
        from diffsmooth import __version__
        return {"name": SERVER_NAME, "version": __version__, "extensions": EXTENSIONS}

    def index(self) -> list:
        return [{"name": name, "version": "1", "state": "READY" if self.ready else "UNAVAILABLE"} for name in self.models]

    def described(self, model: ServedModel) -> dict:
        """What every response and the metadata say of a model: method, sigma, digests, the noise generator."""
        described = {"method": model.method, "sigma": model.sigma, "noise": self.key.generator,
                     "seeded": self.key.generator == "seeded"}
        described.update({f"{part}_sha256": digest for part, digest in model.digests.items()})
        return described

    def model_metadata(self, name: str) -> dict:
        model = self.model(name)
        return {"name": name, "versions": ["1"], "platform": SERVER_NAME,
                "inputs": [{"name": INPUT, "datatype": "FP32", "shape": [-1, *model.image_shape]}],
                "outputs": [{"name": out, "datatype": kind, "shape": [-1]} for out, kind in OUTPUTS.items()],
                "parameters": {**self.described(model),
                               **{k: v for k, v in model.settings.items() if k not in ("method", "sigma")},
                               "device": str(model.smoothed.device), "precision": model.smoothed.precision,
                               "checked_against_eager_fp32": model.smoothed.checks_against_eager}}

    async def infer(self, name: str, body: bytes, header_length: Optional[str],
                    gone: Callable[[], Awaitable[bool]] = _never) -> Answer:
        """Check the request, queue its images on the model's worker, wait (up to its deadline, while the client
        is there: `gone`), answer."""
        model = self.model(name)
        request = await asyncio.to_thread(parse_infer, body, header_length, model.image_shape, self.limits)
        request.id = request.id or uuid.uuid4().hex[:16]
        ticket = self.workers[name].submit(request.images, request.asked)
        waiting = asyncio.wrap_future(ticket.future)
        ends = time.monotonic() + request.asked.deadline
        try:
            while not waiting.done():
                await asyncio.wait([waiting], timeout=min(POLL_SECONDS, max(0.0, ends - time.monotonic())))
                if waiting.done():
                    break
                if time.monotonic() >= ends:
                    raise DeadlineExceeded(f"the deadline of {request.asked.deadline:g} s passed; the request's "
                                           f"samples were freed")
                if await gone():
                    raise ClientGone(f"request {request.id}: the client disconnected; its samples were freed")
            results = waiting.result()
        except (DeadlineExceeded, ClientGone, asyncio.CancelledError):
            ticket.cancelled = True             # its images stop at their next batch of samples
            raise
        values = self._values(request, [result_of(r, request.asked) for r in results], ticket.first_index)
        parameters = {**self.described(model), "mode": request.asked.mode, "n": request.asked.n}
        if request.asked.mode == "certify":
            parameters.update(n0=request.asked.n0, alpha=request.asked.alpha, sequential=request.asked.sequential)
        if self.key.generator == "seeded":
            parameters["seed"] = self.key.key
        body, headers = encode_infer(name, request, values, parameters)
        return Answer(body, headers, request.id, len(request.images), request.asked.mode)

    @staticmethod
    def _values(request: InferRequest, rows: List[Optional[Tuple[int, float, int]]], first: int) -> Dict[str, np.ndarray]:
        if any(row is None for row in rows):
            raise BadRequest("the request was cancelled")
        labels, radii, samples = (np.asarray(column) for column in zip(*rows))
        return {"label": labels, "radius": radii, "samples": samples,
                "index": np.arange(first, first + len(rows), dtype=np.int64)}

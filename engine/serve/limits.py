"""What one request may ask and how much may wait, and the refusals a client sees (one line each)."""

from __future__ import annotations

from dataclasses import dataclass

from diffsmooth.engine.errors import UserError


class BadRequest(Exception):
    """The request is malformed or asks for more than the limits: 400 and one line."""

    status = 400


class Busy(Exception):
    """The model's queue is full (or the server is stopping): 503 with Retry-After."""

    status = 503


@dataclass(frozen=True)
class Limits:
    """Per request: the body, images and samples per image; per model: images queued or in flight; the
    deadline a request gets when it names none (seconds)."""

    max_body_bytes: int = 64 * 2 ** 20
    max_images: int = 64
    max_samples: int = 200_000
    max_queue: int = 256
    deadline: float = 600.0

    def __post_init__(self):
        for name in ("max_body_bytes", "max_images", "max_samples", "max_queue"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UserError(f"the limit `{name}` must be an integer >= 1, got {value!r}")
        if not 0 < self.deadline < float("inf"):
            raise UserError(f"the default deadline must be a number of seconds > 0, got {self.deadline!r}")

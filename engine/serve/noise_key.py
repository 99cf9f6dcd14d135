"""The server's noise: a key no client chooses (the operating system's generator), image indices the server hands
out (never a request), and the start-up self-test of the Gaussian sampler that refuses a bad one."""

from __future__ import annotations

import math
import secrets
import threading
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
from scipy import stats

from diffsmooth.engine.certify.noise import STREAM_SMOOTHING, gaussian
from diffsmooth.engine.choices import MAX_SEED
from diffsmooth.engine.errors import UserError

SELF_TEST_ROWS, SELF_TEST_WIDTH = 1024, 1024      # about a million draws
SELF_TEST_LEVEL = 1e-6          # each test's false-alarm rate: a sound sampler passes, a biased one does not
SELF_TEST_IMAGE = 2 ** 32 - 1   # an index the counter never hands out: the test's draws serve no request
LAST_INDEX = 2 ** 32 - 2


@dataclass(frozen=True)
class NoiseKey:
    """The key of every model's noise and how it was made: "os-random key" (secrets, at start) or "seeded"."""

    key: int
    generator: str

    @classmethod
    def make(cls, seed: Optional[int]) -> "NoiseKey":
        if seed is None:
            return cls(secrets.randbelow(MAX_SEED + 1), "os-random key")
        return cls(int(seed), "seeded")


class IndexCounter:
    """Image indices handed out in order under a lock: no two images of this key share one, whatever clients send."""

    def __init__(self, first: int = 0):
        self._next = first
        self._lock = threading.Lock()

    def take(self, count: int) -> int:
        """The first of `count` fresh consecutive indices; a UserError once the key's 2^32 - 1 indices are spent."""
        with self._lock:
            first = self._next
            if first + count - 1 > LAST_INDEX:
                raise UserError("this server's noise key has served every image index it has; restart it for a new key")
            self._next += count
            return first


def engine_sampler(key: int) -> Callable[[], np.ndarray]:
    """The draws the self-test judges: the engine's own keyed Gaussian noise on the index no request gets."""
    return lambda: gaussian(key, STREAM_SMOOTHING, SELF_TEST_IMAGE, 0, SELF_TEST_ROWS,
                            (SELF_TEST_WIDTH,)).numpy().astype(np.float64).reshape(-1)


def self_test(draw: Callable[[], np.ndarray], level: float = SELF_TEST_LEVEL) -> str:
    """Judge about a million draws: mean 0, variance 1, no lag-1 correlation (z tests) and a Kolmogorov-Smirnov
    test against N(0, 1), each at `level`. Returns a summary line; a UserError (one line) when any fails."""
    z = draw()
    n = z.size
    if n < 1000 or not np.isfinite(z).all():
        raise UserError(f"the Gaussian sampler's self-test failed: {n} draws, finite: {bool(np.isfinite(z).all())}")
    critical = stats.norm.isf(level / 2)
    mean_z = z.mean() * math.sqrt(n)
    var_z = (z.var() - 1.0) / math.sqrt(2.0 / n)
    lag_z = float(np.dot(z[:-1], z[1:]) / math.sqrt(n - 1))
    ks = stats.kstest(z, "norm")
    failed = [name for name, bad in (("mean", abs(mean_z) > critical), ("variance", abs(var_z) > critical),
                                     ("lag-1 correlation", abs(lag_z) > critical), ("Kolmogorov-Smirnov",
                                                                                   ks.pvalue < level)) if bad]
    summary = (f"{n:,} draws: mean z {mean_z:+.2f}, variance z {var_z:+.2f}, lag-1 z {lag_z:+.2f}, "
               f"KS p {ks.pvalue:.3g} (level {level:g})")
    if failed:
        raise UserError(f"the Gaussian sampler's self-test failed ({', '.join(failed)}): {summary}; refusing to serve")
    return summary

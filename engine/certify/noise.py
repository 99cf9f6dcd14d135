"""Counter-based Gaussian noise: the noise of Monte Carlo sample j of image i depends only on
(seed, stream, image i, sample j), never on the batch size, the batch order or the device count.

Philox4x32-10 (Salmon et al., SC'11; the generator behind cuRAND and torch's CUDA RNG) written
in int64 torch ops with every product split so that nothing overflows: the integer stream is
bit-identical on CPU and CUDA. Box-Muller turns each 32-bit pair into two normals (float32).
"""

from __future__ import annotations

import math

import torch

from diffsmooth.engine.choices import FIXED_LOCAL_NOISE_SEED

MASK32 = 0xFFFFFFFF
_M0, _M1 = 0xD2511F53, 0xCD9E8D57      # Philox multipliers
_W0, _W1 = 0x9E3779B9, 0xBB67AE85      # Weyl key increments

STREAM_SMOOTHING = 0    # the randomized-smoothing noise sigma * eps added to the input
STREAM_LOCAL = 1        # DiffSmooth's local noises sigma' * delta (fresh mode)
STREAM_PURIFY = 2       # a purifier's own noises (a reverse diffusion chain's steps), drawn by RowNoise


def _mulhilo(a: torch.Tensor, m: int):
    """(hi, lo) 32-bit halves of a * m for 32-bit a and constant m, without int64 overflow."""
    m_hi, m_lo = m >> 16, m & 0xFFFF
    p_lo = a * m_lo                       # < 2^48
    p_hi = a * m_hi                       # < 2^48
    lo = (p_lo + ((p_hi & 0xFFFF) << 16)) & MASK32
    hi = (p_hi + (p_lo >> 16)) >> 16
    return hi & MASK32, lo


def philox4x32(c0, c1, c2, c3, k0, k1, rounds: int = 10):
    """Philox4x32 on int64 tensors holding uint32 values (keys: ints or 0-d tensors); returns four
    uint32 tensors."""
    for r in range(rounds):
        hi0, lo0 = _mulhilo(c0, _M0)
        hi1, lo1 = _mulhilo(c2, _M1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        if r + 1 < rounds:
            k0 = (k0 + _W0) & MASK32
            k1 = (k1 + _W1) & MASK32
    return c0, c1, c2, c3


def _box_muller(u_a: torch.Tensor, u_b: torch.Tensor):
    """Two independent N(0,1) float32 tensors from two uint32 tensors."""
    scale = 2.0 ** -32
    u1 = (u_a.to(torch.float64) + 1.0) * scale        # (0, 1]: log is finite
    u2 = u_b.to(torch.float64) * scale                # [0, 1)
    radius = torch.sqrt(-2.0 * torch.log(u1))
    angle = 2.0 * math.pi * u2
    return (radius * torch.cos(angle)).to(torch.float32), (radius * torch.sin(angle)).to(torch.float32)


def _normals(j: torch.Tensor, g: torch.Tensor, image: torch.Tensor, stream: torch.Tensor,
             k0: torch.Tensor, k1: torch.Tensor) -> torch.Tensor:
    """Philox + Box-Muller for sample indices j [S,1], image indices [S,1] (or [1,1]) and element
    groups g [1,G] -> [S, 4G] normals. Every index and key is a tensor, so one compiled kernel
    serves any image, seed and sample range, and a batch may mix samples of several images."""
    c0 = g.expand(j.shape[0], g.shape[1])
    c1 = j.expand(j.shape[0], g.shape[1])
    c2 = torch.zeros_like(c0) + image
    c3 = torch.zeros_like(c0) + stream
    x0, x1, x2, x3 = philox4x32(c0, c1, c2, c3, k0, k1)
    z0, z1 = _box_muller(x0, x1)
    z2, z3 = _box_muller(x2, x3)
    return torch.stack((z0, z1, z2, z3), dim=-1).reshape(j.shape[0], g.shape[1] * 4)


_compiled_normals = {}


def _normals_kernel(device: torch.device, compiled: bool):
    """The eager function, or (once per device type) its torch.compile'd form: on CUDA the ~250
    int64 kernels of an eager draw become one fused kernel; integer arithmetic is exact, so the
    stream stays bit-identical (tests compare against the eager CPU reference)."""
    if not compiled:
        return _normals
    if device.type not in _compiled_normals:
        _compiled_normals[device.type] = torch.compile(_normals, dynamic=False)
    return _compiled_normals[device.type]


class NoiseKeys:
    """The constant inputs of one noise stream on one device (key halves, stream id, element
    groups), made once: the per-batch path then creates no tensor from a Python value, which on
    CUDA would be a blocking host-to-device copy."""

    def __init__(self, seed: int, stream: int, device):
        self.device = torch.device(device)
        seed = int(seed) & 0xFFFFFFFFFFFFFFFF

        def scalar(v: int) -> torch.Tensor:
            return torch.full((), v, dtype=torch.int64, device=self.device)     # a fill, not a copy

        self.k0, self.k1 = scalar(seed & MASK32), scalar(seed >> 32)
        self.stream = scalar(int(stream) & MASK32)
        self._groups = {}

    def groups(self, numel: int, draw: int = 0) -> torch.Tensor:
        """The element groups [1, G] of a draw of `numel` values; draw d of a row takes the d-th block of G
        groups (counter word 0), so every draw of a row is its own noise."""
        count = (numel + 3) // 4
        if (count, draw) not in self._groups:
            first = int(draw) * count
            if first + count > MASK32 + 1:
                raise ValueError("a row's draws must fit in Philox's 32-bit element counter")
            self._groups[(count, draw)] = torch.arange(first, first + count, dtype=torch.int64,
                                                       device=self.device).unsqueeze(0)
        return self._groups[(count, draw)]


def gaussian_rows(keys: NoiseKeys, images: torch.Tensor, samples: torch.Tensor, shape,
                  compiled: bool = False, draw: int = 0) -> torch.Tensor:
    """N(0, I) noise [len(samples), *shape]: row r is sample samples[r] of image images[r]
    (int64 tensors on keys.device). The same values as `gaussian` for the same (image, sample),
    whatever else shares the batch: a packed batch of several images draws exactly their noise.
    `draw`: which of a row's draws of this shape (RowNoise)."""
    numel = 1
    for s in shape:
        numel *= int(s)
    z = _normals_kernel(keys.device, compiled)(samples.unsqueeze(1), keys.groups(numel, draw), images.unsqueeze(1),
                                                keys.stream, keys.k0, keys.k1)
    return z[:, :numel].reshape(samples.shape[0], *shape)


class RowNoise:
    """The purifier's noises of a batch's rows, drawn when asked: `normal(d, shape)` is draw d of every row's
    noise on STREAM_PURIFY, keyed by (seed, image, sample, d) alone, so a reverse chain's step noise never
    depends on the batch, the shard or the rank (d numbers a chain's (run, step), the method's choice)."""

    def __init__(self, keys: NoiseKeys, images: torch.Tensor, samples: torch.Tensor, compiled: bool = False):
        self.keys, self.images, self.samples, self.compiled = keys, images, samples, compiled

    @property
    def rows(self) -> int:
        return int(self.samples.shape[0])

    def normal(self, draw: int, shape) -> torch.Tensor:
        """N(0, I) [rows, *shape]: draw `draw` of each row."""
        return gaussian_rows(self.keys, self.images, self.samples, shape, self.compiled, draw)


def check_indices(image: int, first_sample: int, num_samples: int) -> None:
    """ValueError unless image and sample indices fit Philox's 32-bit counter words."""
    if not (0 <= image <= MASK32 and 0 <= first_sample and 0 <= num_samples
            and first_sample + num_samples <= MASK32 + 1):
        raise ValueError("image and sample indices must fit in 32 bits")


def gaussian(seed: int, stream: int, image: int, first_sample: int, num_samples: int,
             shape, device="cpu", compiled: bool = False) -> torch.Tensor:
    """N(0, I) noise of shape [num_samples, *shape] for samples first_sample.. of one image.

    Counter = (element group, sample index, image index, stream); key = the 64-bit seed.
    Four normals come from each counter, so element e of sample j is a pure function of
    (seed, stream, image, j, e). `compiled` runs the same arithmetic as one compiled kernel.
    """
    check_indices(image, first_sample, num_samples)
    keys = NoiseKeys(seed, stream, device)
    samples = torch.arange(first_sample, first_sample + num_samples, dtype=torch.int64, device=keys.device)
    images = torch.full((num_samples,), image, dtype=torch.int64, device=keys.device)
    return gaussian_rows(keys, images, samples, shape, compiled)


def fixed_local_noise(m: int, shape, seed: int = FIXED_LOCAL_NOISE_SEED) -> torch.Tensor:
    """The reference's local noises: drawn once, shape (m, *shape), torch CPU generator seeded 42 by default."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn((m, *shape), generator=generator, dtype=torch.float32)

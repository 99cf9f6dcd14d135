"""Counter-based Gaussian noise: the noise of Monte Carlo sample j of image i depends only on
(seed, stream, image i, sample j), never on the batch size, the batch order or the device count.

Philox4x32-10 (Salmon et al., SC'11; the generator behind cuRAND and torch's CUDA RNG) written
in int64 torch ops with every product split so that nothing overflows: the integer stream is
bit-identical on CPU and CUDA. Box-Muller turns each 32-bit pair into two normals (float32).
"""

from __future__ import annotations

import math

import torch

MASK32 = 0xFFFFFFFF
_M0, _M1 = 0xD2511F53, 0xCD9E8D57      # Philox multipliers
_W0, _W1 = 0x9E3779B9, 0xBB67AE85      # Weyl key increments

STREAM_SMOOTHING = 0    # the randomized-smoothing noise sigma * eps added to the input
STREAM_LOCAL = 1        # DiffSmooth's local noises sigma' * delta (fresh mode)


def _mulhilo(a: torch.Tensor, m: int):
    """(hi, lo) 32-bit halves of a * m for 32-bit a and constant m, without int64 overflow."""
    m_hi, m_lo = m >> 16, m & 0xFFFF
    p_lo = a * m_lo                       # < 2^48
    p_hi = a * m_hi                       # < 2^48
    lo = (p_lo + ((p_hi & 0xFFFF) << 16)) & MASK32
    hi = (p_hi + (p_lo >> 16)) >> 16
    return hi & MASK32, lo


def philox4x32(c0, c1, c2, c3, k0: int, k1: int, rounds: int = 10):
    """Philox4x32 on int64 tensors holding uint32 values; returns four uint32 tensors."""
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


def gaussian(seed: int, stream: int, image: int, first_sample: int, num_samples: int,
             shape, device="cpu") -> torch.Tensor:
    """N(0, I) noise of shape [num_samples, *shape] for samples first_sample.. of one image.

    Counter = (element group, sample index, image index, stream); key = the 64-bit seed.
    Four normals come from each counter, so element e of sample j is a pure function of
    (seed, stream, image, j, e).
    """
    if not (0 <= image <= MASK32 and 0 <= first_sample and 0 <= num_samples
            and first_sample + num_samples <= MASK32 + 1):
        raise ValueError("image and sample indices must fit in 32 bits")
    numel = 1
    for s in shape:
        numel *= int(s)
    groups = (numel + 3) // 4
    dev = torch.device(device)
    g = torch.arange(groups, dtype=torch.int64, device=dev).unsqueeze(0)
    j = torch.arange(first_sample, first_sample + num_samples, dtype=torch.int64, device=dev).unsqueeze(1)
    c0 = g.expand(num_samples, groups)
    c1 = j.expand(num_samples, groups)
    c2 = torch.full_like(c0, image & MASK32)
    c3 = torch.full_like(c0, stream & MASK32)
    seed = int(seed) & 0xFFFFFFFFFFFFFFFF
    x0, x1, x2, x3 = philox4x32(c0, c1, c2, c3, seed & MASK32, seed >> 32)
    z0, z1 = _box_muller(x0, x1)
    z2, z3 = _box_muller(x2, x3)
    z = torch.stack((z0, z1, z2, z3), dim=-1).reshape(num_samples, groups * 4)
    return z[:, :numel].reshape(num_samples, *shape)


def fixed_local_noise(m: int, shape, seed: int = 42) -> torch.Tensor:
    """The reference's local noises: drawn once, shape (m, *shape), torch CPU generator seeded 42."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn((m, *shape), generator=generator, dtype=torch.float32)

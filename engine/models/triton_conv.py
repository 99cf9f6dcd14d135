"""A hand-written Triton convolution for the folded ResNet classifiers: implicit GEMM over NHWC
(channels_last) activations, BatchNorm already folded into (weight, bias), and the epilogue fused:
+ bias, + residual (optional), ReLU (optional), fp32 accumulation, one write in the input's dtype.

Why: Cohen's CIFAR ResNet-110 has 16-64 channels, so its convolutions are memory-bound. On an H200
the compiled classifier ran cuDNN's implicit-GEMM kernels plus separate inductor BatchNorm/add/ReLU
kernels at 6.4% of the fp16 peak, and cuDNN's runtime-fused conv + bias + add + ReLU (`--fused-conv`,
folded_resnet.py) measured slower still (17.3k vs 25.1k samples/s). This kernel reads each input
tile and writes each output once, with tiles sized for small channel counts (autotuned per shape).

`tritonize(fold_classifier(...))` routes every folded convolution through the torch custom op
`diffsmooth::triton_conv_bias_add_relu` (a fake implementation lets torch.compile and CUDA graphs see
through it). On CUDA it launches the Triton kernel where the kernel takes the shape and falls back to
conv2d + add + relu elsewhere (`unsupported_reason` says why; TRITON_FALLBACKS counts the reasons).
Off CUDA it is the reference maths, except with TRITON_INTERPRET=1 set before this module is imported:
then the Triton interpreter runs the kernel itself on the CPU (how the tests check it).
Autotuning benchmarks on the first call per shape, so warm up before a CUDA-graph capture.

Second option, `tritonize(..., fuse_blocks=True)`: each stride-1 BasicBlock with an identity shortcut
(52 of ResNet-110's 54) runs as one `diffsmooth::triton_basic_block` call; the intermediate activation
is computed per tile with its one-pixel halo into a per-program scratch slot that stays in L2, so it is
never written to or read from DRAM. Neither kernel has run on a GPU yet: speed unmeasured.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
from typing import Dict, List, Optional

import torch
from torch import nn

from diffsmooth.engine.models.folded_resnet import FoldedBlock, FoldedConv, _output_format, _reference

try:                                            # optional: the models stay importable without triton
    import triton
    import triton.language as tl
    _TRITON_ERROR: Optional[str] = None
except Exception as exc:                        # ImportError, or a broken install raising anything else
    triton = tl = None
    _TRITON_ERROR = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".rstrip(": ")

__all__ = ["triton_conv_unavailable", "tritonize", "triton_conv_bias_add_relu", "unsupported_reason", "TritonConv",
           "TRITON_CALLS", "TRITON_FALLBACKS", "AUTOTUNE_CONFIGS", "triton_basic_block", "block_unsupported_reason",
           "TritonBlock", "TRITON_BLOCK_CALLS", "BLOCK_CONFIGS"]

# How often the Triton kernel was launched (Python calls: CUDA-graph replays are not counted); a GPU
# test reads it to know the kernel was reached.
TRITON_CALLS = {"count": 0}
# Why calls on a device that runs the kernel took the reference path instead: reason -> calls.
TRITON_FALLBACKS: Dict[str, int] = {}

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_MAX_KERNEL = 7                 # taps are unrolled at compile time: 1x1, 3x3, ..., ResNet-50's 7x7 stem
_INT32_LIMIT = 2 ** 31          # offsets are 32-bit
_FLAT_K_BELOW = 16              # fewer input channels (the RGB stem): all taps x channels as one K axis

# (BLOCK_M output pixels, BLOCK_K reduction slice, warps, pipeline stages). BLOCK_N (output channels)
# is not tuned: it is the channel count rounded up to a power of two (16..64), so one program
# computes every output channel of its pixels and each input tile is read once. Hopper's tensor
# cores need K >= 16; configs with BLOCK_K beyond the (rounded) reduction slice are pruned.
AUTOTUNE_CONFIGS = [
    (128, 16, 4, 3),
    (128, 32, 4, 3),
    (128, 64, 4, 2),
    (256, 16, 8, 3),
    (256, 32, 8, 3),
    (256, 64, 8, 2),
    (64, 32, 4, 4),
    (64, 16, 2, 4),
]


# The fused BasicBlock kernel (tritonize(..., fuse_blocks=True)): (TILE x TILE output pixels per step,
# BLOCK_M pixel rows per GEMM, BLOCK_K, warps, stages). Each program walks tiles persistently and keeps
# the tile's intermediate activation (plus its one-pixel halo, recomputed) in its own scratch slot,
# which stays in L2. Configs with BLOCK_K beyond the channels or TILE beyond the image are pruned.
BLOCK_CONFIGS = [
    (8, 64, 16, 4, 2),
    (8, 64, 32, 4, 2),
    (8, 64, 64, 4, 2),
    (16, 64, 16, 4, 2),
    (16, 64, 32, 4, 2),
    (16, 128, 16, 8, 2),
    (16, 128, 32, 8, 2),
]
_BLOCK_MAX_CHANNELS = 64        # one program holds every channel of its pixels (fp32 accumulator in registers)
_PROGRAMS_PER_SM = 4


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _block_n(c_out: int) -> int:
    return min(64, max(16, _pow2_at_least(c_out)))


def _k_slice(c_in: int, kh: int, kw: int) -> int:
    """The reduction length one program walks per step: the channels of one tap, or all taps x
    channels for the RGB stem (flat K)."""
    return c_in * kh * kw if c_in < _FLAT_K_BELOW else c_in


def _fits(config_k: int, c_in: int, kh: int, kw: int) -> bool:
    return config_k <= max(16, _pow2_at_least(_k_slice(c_in, kh, kw)))


def _prune(configs, named_args, **kwargs):
    """Drop configs whose K tile overshoots the layer's reduction slice (wasted loads and FLOPs)."""
    c_in = named_args.get("C_IN", kwargs.get("C_IN"))
    kh, kw = kwargs.get("KH", named_args.get("KH")), kwargs.get("KW", named_args.get("KW"))
    kept = [c for c in configs if _fits(c.kwargs["BLOCK_K"], c_in, kh, kw)]
    return kept or configs[:1]


def _block_fits(config, c: int, h: int, w: int) -> bool:
    tile, _, block_k, _, _ = config
    return block_k <= max(16, _pow2_at_least(c)) and (tile == 8 or tile <= _pow2_at_least(max(h, w)))


def _block_prune(configs, named_args, **kwargs):
    c, h, w = (named_args.get(k, kwargs.get(k)) for k in ("C", "H", "W"))
    kept = [cfg for cfg in configs
            if _block_fits((cfg.kwargs["TILE"], cfg.kwargs["BLOCK_M"], cfg.kwargs["BLOCK_K"], 0, 0), c, h, w)]
    return kept or configs[:1]


if triton is not None:
    @triton.jit
    def _conv_kernel(x_ptr, w_ptr, b_ptr, r_ptr, o_ptr,
                     M, H, W, OH, OW, C_IN, C_OUT,
                     sxn, sxh, sxw, sxc,            # input strides, in (n, h, w, c) order
                     swo, swi, swh, sww,            # weight strides, in (out, in, kh, kw) order
                     srn, srh, srw, src,            # residual strides (n, h, w, c)
                     son, soh, sow, soc,            # output strides (n, h, w, c)
                     KH: tl.constexpr, KW: tl.constexpr, STRIDE: tl.constexpr, PAD: tl.constexpr,
                     HAS_RES: tl.constexpr, RELU: tl.constexpr, FLAT_K: tl.constexpr,
                     DOT_FP32: tl.constexpr, PRECISION: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        """One program: BLOCK_M output pixels (flattened n, oh, ow) x BLOCK_N output channels.
        The GEMM's K axis is (kh, kw, ci): the taps are unrolled, the channels walked in BLOCK_K
        slices (or, FLAT_K, all of (kh, kw, ci) walked as one axis for few input channels)."""
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        m_ok = offs_m < M
        n_ok = offs_n < C_OUT
        ow = offs_m % OW
        t = offs_m // OW
        oh = t % OH
        nb = t // OH
        ih0 = oh * STRIDE - PAD
        iw0 = ow * STRIDE - PAD
        x_img = nb * sxn
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if FLAT_K:
            K_TOTAL = KH * KW * C_IN
            for k0 in range(0, K_TOTAL, BLOCK_K):
                k = k0 + offs_k
                k_ok = k < K_TOTAL
                ci = k % C_IN
                tap = k // C_IN
                kw = tap % KW
                kh = tap // KW
                ih = ih0[:, None] + kh[None, :]
                iw = iw0[:, None] + kw[None, :]
                a_ok = m_ok[:, None] & k_ok[None, :] & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
                a = tl.load(x_ptr + x_img[:, None] + ih * sxh + iw * sxw + ci[None, :] * sxc, mask=a_ok, other=0.0)
                b = tl.load(w_ptr + offs_n[None, :] * swo + (ci * swi + kh * swh + kw * sww)[:, None],
                            mask=k_ok[:, None] & n_ok[None, :], other=0.0)
                if DOT_FP32:
                    a = a.to(tl.float32)
                    b = b.to(tl.float32)
                acc = tl.dot(a, b, acc, input_precision=PRECISION)
        else:
            for kh in tl.static_range(KH):
                ih = ih0 + kh
                h_ok = m_ok & (ih >= 0) & (ih < H)
                for kw in tl.static_range(KW):
                    iw = iw0 + kw
                    p_ok = h_ok & (iw >= 0) & (iw < W)
                    x_pix = x_img + ih * sxh + iw * sxw
                    for c0 in range(0, C_IN, BLOCK_K):
                        ci = c0 + offs_k
                        c_ok = ci < C_IN
                        a = tl.load(x_ptr + x_pix[:, None] + ci[None, :] * sxc, mask=p_ok[:, None] & c_ok[None, :],
                                    other=0.0)
                        b = tl.load(w_ptr + offs_n[None, :] * swo + (ci * swi + kh * swh + kw * sww)[:, None],
                                    mask=c_ok[:, None] & n_ok[None, :], other=0.0)
                        if DOT_FP32:
                            a = a.to(tl.float32)
                            b = b.to(tl.float32)
                        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        acc += tl.load(b_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        out_ok = m_ok[:, None] & n_ok[None, :]
        if HAS_RES:
            r = tl.load(r_ptr + (nb * srn + oh * srh + ow * srw)[:, None] + offs_n[None, :] * src, mask=out_ok,
                        other=0.0)
            acc += r.to(tl.float32)
        if RELU:
            acc = tl.maximum(acc, 0.0)
        tl.store(o_ptr + (nb * son + oh * soh + ow * sow)[:, None] + offs_n[None, :] * soc,
                 acc.to(o_ptr.dtype.element_ty), mask=out_ok)

    _conv_autotuned = triton.autotune(
        configs=[triton.Config({"BLOCK_M": m, "BLOCK_K": k}, num_warps=w, num_stages=s)
                 for m, k, w, s in AUTOTUNE_CONFIGS],
        key=["M", "H", "W", "OH", "OW", "C_IN", "C_OUT", "KH", "KW", "STRIDE", "PAD", "HAS_RES", "RELU"],
        prune_configs_by={"early_config_prune": _prune},
    )(_conv_kernel)

    @triton.jit
    def _block_kernel(x_ptr, w1_ptr, b1_ptr, w2_ptr, b2_ptr, o_ptr, s_ptr,
                      N, H, W, C, SLOT,
                      sxn, sxh, sxw, sxc,            # input strides (n, h, w, c); also the residual
                      s1o, s1i, s1h, s1w,            # conv1 weight strides (out, in, kh, kw)
                      s2o, s2i, s2h, s2w,            # conv2 weight strides
                      son, soh, sow, soc,            # output strides (n, h, w, c)
                      DOT_FP32: tl.constexpr, PRECISION: tl.constexpr,
                      TILE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr):
        """relu(conv2(relu(conv1(x) + b1)) + b2 + x) for a stride-1 BasicBlock with an identity shortcut
        (3x3 convolutions, padding 1, C -> C). Each program takes TILE x TILE output pixels of one image
        at a time, persistently: phase 1 computes h = relu(conv1(x) + b1) on the tile and its one-pixel
        halo (recomputed by neighbouring tiles) into the program's own scratch slot, rounded to the
        activation dtype as the two-kernel path stores it; phase 2 runs conv2 on it, + b2 + x, ReLU. The
        slot is written and read back by the same program (L2-resident), so h never goes to DRAM."""
        pid = tl.program_id(0)
        nprog = tl.num_programs(0)
        HALO: tl.constexpr = TILE + 2
        HALO_PIX: tl.constexpr = HALO * HALO
        tiles_h = (H + TILE - 1) // TILE
        tiles_w = (W + TILE - 1) // TILE
        num_tiles = N * tiles_h * tiles_w
        slot = s_ptr + pid * SLOT
        offs_m = tl.arange(0, BLOCK_M)
        offs_c = tl.arange(0, BLOCK_C)
        offs_k = tl.arange(0, BLOCK_K)
        c_ok = offs_c < C
        bias1 = tl.load(b1_ptr + offs_c, mask=c_ok, other=0.0).to(tl.float32)
        bias2 = tl.load(b2_ptr + offs_c, mask=c_ok, other=0.0).to(tl.float32)
        for tile in range(pid, num_tiles, nprog):
            tx = tile % tiles_w
            t = tile // tiles_w
            ty = t % tiles_h
            n = t // tiles_h
            x_img = n * sxn
            y0 = ty * TILE - 1                     # the halo's top-left pixel
            x0 = tx * TILE - 1
            # phase 1: h on the halo tile; zero outside the image (conv2's zero padding applies to h)
            for r0 in range(0, HALO_PIX, BLOCK_M):
                r = r0 + offs_m
                yy = y0 + r // HALO
                xx = x0 + r % HALO
                inside = (r < HALO_PIX) & (yy >= 0) & (yy < H) & (xx >= 0) & (xx < W)
                acc = tl.zeros((BLOCK_M, BLOCK_C), dtype=tl.float32)
                for kh in tl.static_range(3):
                    iy = yy + (kh - 1)
                    row_ok = inside & (iy >= 0) & (iy < H)
                    for kw in tl.static_range(3):
                        ix = xx + (kw - 1)
                        p_ok = row_ok & (ix >= 0) & (ix < W)
                        x_pix = x_img + iy * sxh + ix * sxw
                        for c0 in range(0, C, BLOCK_K):
                            ci = c0 + offs_k
                            k_ok = ci < C
                            a = tl.load(x_ptr + x_pix[:, None] + ci[None, :] * sxc,
                                        mask=p_ok[:, None] & k_ok[None, :], other=0.0)
                            b = tl.load(w1_ptr + offs_c[None, :] * s1o + (ci * s1i + kh * s1h + kw * s1w)[:, None],
                                        mask=k_ok[:, None] & c_ok[None, :], other=0.0)
                            if DOT_FP32:
                                a = a.to(tl.float32)
                                b = b.to(tl.float32)
                            acc = tl.dot(a, b, acc, input_precision=PRECISION)
                h = tl.maximum(acc + bias1[None, :], 0.0)
                h = tl.where(inside[:, None], h, 0.0)
                tl.store(slot + r[:, None] * BLOCK_C + offs_c[None, :], h.to(o_ptr.dtype.element_ty),
                         mask=(r < HALO_PIX)[:, None])
            tl.debug_barrier()                      # the slot written by every thread before any reads it
            # phase 2: relu(conv2(h) + b2 + x) on the tile
            for p0 in range(0, TILE * TILE, BLOCK_M):
                p = p0 + offs_m
                p_in = p < TILE * TILE
                py = p // TILE
                px = p % TILE
                oy = y0 + 1 + py
                ox = x0 + 1 + px
                out_ok = p_in & (oy < H) & (ox < W)
                acc = tl.zeros((BLOCK_M, BLOCK_C), dtype=tl.float32)
                for kh in tl.static_range(3):
                    for kw in tl.static_range(3):
                        row = (py + kh) * HALO + (px + kw)
                        for c0 in range(0, C, BLOCK_K):
                            ci = c0 + offs_k
                            k_ok = ci < C
                            a = tl.load(slot + row[:, None] * BLOCK_C + ci[None, :], mask=p_in[:, None] & k_ok[None, :],
                                        other=0.0, cache_modifier=".cg")
                            b = tl.load(w2_ptr + offs_c[None, :] * s2o + (ci * s2i + kh * s2h + kw * s2w)[:, None],
                                        mask=k_ok[:, None] & c_ok[None, :], other=0.0)
                            if DOT_FP32:
                                a = a.to(tl.float32)
                                b = b.to(tl.float32)
                            acc = tl.dot(a, b, acc, input_precision=PRECISION)
                mask = out_ok[:, None] & c_ok[None, :]
                res = tl.load(x_ptr + (x_img + oy * sxh + ox * sxw)[:, None] + offs_c[None, :] * sxc, mask=mask,
                              other=0.0)
                acc = tl.maximum(acc + bias2[None, :] + res.to(tl.float32), 0.0)
                tl.store(o_ptr + (n * son + oy * soh + ox * sow)[:, None] + offs_c[None, :] * soc,
                         acc.to(o_ptr.dtype.element_ty), mask=mask)
            tl.debug_barrier()                      # every read done before the next tile overwrites the slot

    _block_autotuned = triton.autotune(
        configs=[triton.Config({"TILE": t, "BLOCK_M": m, "BLOCK_K": k}, num_warps=w, num_stages=s)
                 for t, m, k, w, s in BLOCK_CONFIGS],
        key=["N", "H", "W", "C"],
        prune_configs_by={"early_config_prune": _block_prune},
    )(_block_kernel)
    # Built by the interpreter (TRITON_INTERPRET=1 when triton.jit ran): the kernel runs on CPU tensors.
    _INTERPRETED = type(_conv_kernel).__name__ == "InterpretedFunction"
else:
    _conv_kernel = _conv_autotuned = _block_kernel = _block_autotuned = None
    _INTERPRETED = False


def triton_conv_unavailable(device) -> Optional[str]:
    """None when the Triton kernel can run on `device` (CUDA with triton importable, or any device
    under the Triton interpreter), else a one-line reason."""
    device = torch.device(device)
    if triton is None:
        return f"triton is not importable ({_TRITON_ERROR})"
    if _INTERPRETED:
        return None
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return ("TRITON_INTERPRET was set after diffsmooth.engine.models.triton_conv was imported: "
                "its kernel was built for a GPU (set it before the import)")
    if device.type != "cuda":
        return f"the Triton convolution runs on CUDA devices only (this is {device.type}; TRITON_INTERPRET=1 emulates it)"
    if not torch.cuda.is_available():
        return "CUDA is not available to torch"
    return _gpu_unavailable(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _gpu_unavailable(index: int) -> Optional[str]:
    major, minor = torch.cuda.get_device_capability(index)
    if torch.version.hip is None and major < 8:
        return f"the Triton convolution needs compute capability 8.0 or newer (this GPU is {major}.{minor})"
    return None


def _out_hw(x: torch.Tensor, weight: torch.Tensor, stride: int, padding: int):
    return ((x.shape[2] + 2 * padding - weight.shape[2]) // stride + 1,
            (x.shape[3] + 2 * padding - weight.shape[3]) // stride + 1)


def unsupported_reason(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, residual: Optional[torch.Tensor],
                       stride: int, padding: int) -> Optional[str]:
    """Why the Triton kernel does not take this call (None when it does); the op then runs the reference."""
    if x.dim() != 4 or weight.dim() != 4:
        return f"not a 2-D convolution (input {x.dim()}-D, weight {weight.dim()}-D)"
    if x.dtype not in _DTYPES:
        return f"input dtype {x.dtype} (the kernel takes float16, bfloat16, float32)"
    if weight.dtype != x.dtype:
        return f"weight dtype {weight.dtype} differs from the input's {x.dtype}"
    if bias is None or bias.shape != (weight.shape[0],) or not bias.dtype.is_floating_point:
        return "bias is not one float per output channel"
    if weight.shape[1] != x.shape[1]:
        return f"weight takes {weight.shape[1]} input channels, the input has {x.shape[1]} (grouped or mismatched)"
    if max(weight.shape[2:]) > _MAX_KERNEL:
        return f"kernel {tuple(weight.shape[2:])} is larger than {_MAX_KERNEL}x{_MAX_KERNEL}"
    if stride < 1 or padding < 0:
        return f"stride {stride} / padding {padding}"
    oh, ow = _out_hw(x, weight, stride, padding)
    if oh < 1 or ow < 1 or x.numel() == 0 or weight.numel() == 0:
        return "empty input or output"
    out_shape = (x.shape[0], weight.shape[0], oh, ow)
    if residual is not None:
        if tuple(residual.shape) != out_shape:
            return f"residual shape {tuple(residual.shape)} is not the output's {out_shape}"
        if not residual.dtype.is_floating_point or residual.device != x.device:
            return "residual is not a float tensor on the input's device"
    if bias.device != x.device or weight.device != x.device:
        return "weight / bias not on the input's device"
    if int(torch.Size(out_shape).numel()) >= _INT32_LIMIT:
        return "the output has 2**31 elements or more (the kernel's offsets are 32-bit)"
    for name, t in (("input", x), ("residual", residual), ("weight", weight)):
        if t is not None and 1 + sum((size - 1) * abs(step) for size, step in zip(t.shape, t.stride())) >= _INT32_LIMIT:
            return f"the {name} spans 2**31 elements or more (the kernel's offsets are 32-bit)"
    return None


def _nhwc_strides(t: torch.Tensor):
    s = t.stride()
    return s[0], s[2], s[3], s[1]


def _precision(dtype: torch.dtype) -> str:
    """fp32 inputs: TF32 tensor cores where torch lets cuDNN use them (its default), else full fp32
    (and on ROCm)."""
    if dtype == torch.float32 and not _INTERPRETED and (torch.version.hip or not torch.backends.cudnn.allow_tf32):
        return "ieee"
    return "tf32"


def _on_device(x: torch.Tensor):
    """Triton launches on the current CUDA device: make it x's."""
    return torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext()


def _launch(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, residual: Optional[torch.Tensor],
            stride: int, padding: int, relu: bool, config=None) -> torch.Tensor:
    """Run the Triton kernel. config = (BLOCK_M, BLOCK_K, warps, stages) launches that config without
    autotuning; the interpreter always does (the largest tiles that fit, unless given)."""
    n, c_in, h, w = x.shape
    c_out, _, kh, kw = weight.shape
    oh, ow = _out_hw(x, weight, stride, padding)
    out = torch.empty((n, c_out, oh, ow), dtype=x.dtype, device=x.device, memory_format=_output_format(x))
    res = residual if residual is not None else out          # a placeholder pointer, never read
    m = n * oh * ow
    block_n = _block_n(c_out)
    args = (x, weight, bias, res, out, m, h, w, oh, ow, c_in, c_out,
            *_nhwc_strides(x), *weight.stride(), *_nhwc_strides(res), *_nhwc_strides(out))
    meta = dict(KH=kh, KW=kw, STRIDE=int(stride), PAD=int(padding), HAS_RES=residual is not None, RELU=bool(relu),
                FLAT_K=c_in < _FLAT_K_BELOW, DOT_FP32=_INTERPRETED and x.dtype == torch.bfloat16,
                PRECISION=_precision(x.dtype), BLOCK_N=block_n)
    if config is None and _INTERPRETED:          # the fewest, largest tiles: the interpreter's cost is per program
        config = max((c for c in AUTOTUNE_CONFIGS if _fits(c[1], c_in, kh, kw)), key=lambda c: (c[0], c[1]))
    TRITON_CALLS["count"] += 1
    with _on_device(x):
        if config is None:
            def grid(meta_):
                return triton.cdiv(m, meta_["BLOCK_M"]), triton.cdiv(c_out, block_n)
            _conv_autotuned[grid](*args, **meta)
        else:
            block_m, block_k, warps, stages = config
            _conv_kernel[(triton.cdiv(m, block_m), triton.cdiv(c_out, block_n))](
                *args, **meta, BLOCK_M=block_m, BLOCK_K=block_k, num_warps=warps, num_stages=stages)
    return out


def _dispatch(x, weight, bias, residual, stride, padding, relu):
    reason = unsupported_reason(x, weight, bias, residual, stride, padding)
    if reason is not None:
        TRITON_FALLBACKS[reason] = TRITON_FALLBACKS.get(reason, 0) + 1
        return _reference(x, weight, bias, residual, stride, padding, relu)
    return _launch(x, weight, bias, residual, stride, padding, relu)


@torch.library.custom_op("diffsmooth::triton_conv_bias_add_relu", mutates_args=())
def triton_conv_bias_add_relu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                              residual: Optional[torch.Tensor], stride: int, padding: int, relu: bool) -> torch.Tensor:
    """relu?(conv2d(x, weight, bias, stride, padding) + residual?); off CUDA the reference maths, or
    the Triton kernel under the interpreter (TRITON_INTERPRET=1 before import)."""
    if _INTERPRETED:
        return _dispatch(x, weight, bias, residual, stride, padding, relu)
    return _reference(x, weight, bias, residual, stride, padding, relu)


@triton_conv_bias_add_relu.register_kernel("cuda")
def _triton_conv_bias_add_relu_cuda(x, weight, bias, residual, stride, padding, relu):
    """The Triton kernel where it takes the call, else conv2d + add + relu (the reason counted)."""
    unavailable = triton_conv_unavailable(x.device)
    if unavailable is not None:
        TRITON_FALLBACKS[unavailable] = TRITON_FALLBACKS.get(unavailable, 0) + 1
        return _reference(x, weight, bias, residual, stride, padding, relu)
    return _dispatch(x, weight, bias, residual, stride, padding, relu)


@triton_conv_bias_add_relu.register_fake
def _triton_conv_bias_add_relu_fake(x, weight, bias, residual, stride, padding, relu):
    oh, ow = _out_hw(x, weight, stride, padding)
    return torch.empty((x.shape[0], weight.shape[0], oh, ow), dtype=x.dtype, device=x.device,
                       memory_format=_output_format(x))


class TritonConv(FoldedConv):
    """A FoldedConv whose call is the Triton op. Its weight is stored output-channel-fastest
    ([kh, kw, in, out] in memory, viewed as [out, in, kh, kw]): the kernel's weight tile is a
    K x N row-major slice. Any other layout (e.g. after .to(memory_format=...)) is read through
    its strides."""

    @classmethod
    def from_folded(cls, folded: FoldedConv) -> "TritonConv":
        conv = cls.__new__(cls)
        nn.Module.__init__(conv)
        weight = folded.weight.detach()
        conv.register_buffer("weight", weight.permute(2, 3, 1, 0).contiguous().permute(3, 2, 0, 1))
        conv.register_buffer("bias", folded.bias.detach().clone())
        conv.stride, conv.padding, conv.relu = folded.stride, folded.padding, folded.relu
        return conv

    def forward(self, x: torch.Tensor, residual: Optional[torch.Tensor] = None) -> torch.Tensor:
        x = x.to(self.weight.dtype)
        residual = residual.to(self.weight.dtype) if residual is not None else None
        return triton_conv_bias_add_relu(x, self.weight, self.bias, residual, self.stride, self.padding, self.relu)


# ------------------------------------------------------------------ a whole BasicBlock in one kernel

# How often the fused BasicBlock kernel was launched (Python calls, as TRITON_CALLS).
TRITON_BLOCK_CALLS = {"count": 0}


def block_unsupported_reason(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor,
                             b2: torch.Tensor) -> Optional[str]:
    """Why the fused BasicBlock kernel does not take this call (None when it does)."""
    if x.dim() != 4:
        return f"not an image batch ({x.dim()}-D input)"
    c = x.shape[1]
    if x.dtype not in _DTYPES:
        return f"input dtype {x.dtype} (the kernel takes float16, bfloat16, float32)"
    for name, w in (("conv1", w1), ("conv2", w2)):
        if tuple(w.shape) != (c, c, 3, 3):
            return f"{name} weight {tuple(w.shape)} is not a 3x3 {c} -> {c} convolution"
        if w.dtype != x.dtype or w.device != x.device:
            return f"{name} weight is {w.dtype} on {w.device}, the input {x.dtype} on {x.device}"
    for name, b in (("conv1", b1), ("conv2", b2)):
        if b is None or b.shape != (c,) or not b.dtype.is_floating_point or b.device != x.device:
            return f"{name} bias is not one float per channel on the input's device"
    if c > _BLOCK_MAX_CHANNELS:
        return f"{c} channels (the fused block holds at most {_BLOCK_MAX_CHANNELS})"
    if x.numel() == 0:
        return "empty input"
    if 1 + sum((size - 1) * abs(step) for size, step in zip(x.shape, x.stride())) >= _INT32_LIMIT:
        return "the input spans 2**31 elements or more (the kernel's offsets are 32-bit)"
    return None


@functools.lru_cache(maxsize=None)
def _program_cap(index: int) -> int:
    return _PROGRAMS_PER_SM * torch.cuda.get_device_properties(index).multi_processor_count


def _launch_block(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor,
                  config=None) -> torch.Tensor:
    """Run the fused BasicBlock kernel: config = (TILE, BLOCK_M, BLOCK_K, warps, stages) without
    autotuning; the interpreter always does (the largest tiles that fit, unless given)."""
    n, c, h, w = x.shape
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device, memory_format=_output_format(x))
    block_c = max(16, _pow2_at_least(c))
    slot = (max(cfg[0] for cfg in BLOCK_CONFIGS) + 2) ** 2 * block_c
    if x.is_cuda and not _INTERPRETED:
        cap = _program_cap(x.device.index if x.device.index is not None else torch.cuda.current_device())
    else:
        cap = 3                                     # the interpreter: still several tiles per program
    if config is None and _INTERPRETED:
        config = max((cfg for cfg in BLOCK_CONFIGS if _block_fits(cfg, c, h, w)), key=lambda cfg: cfg[:3])
    programs = (min(cap, n * triton.cdiv(h, config[0]) * triton.cdiv(w, config[0])) if config is not None
                else min(cap, n * triton.cdiv(h, 8) * triton.cdiv(w, 8)))
    scratch = torch.empty(programs * slot, dtype=x.dtype, device=x.device)
    args = (x, w1, b1, w2, b2, out, scratch, n, h, w, c, slot, *_nhwc_strides(x), *w1.stride(), *w2.stride(),
            *_nhwc_strides(out))
    meta = dict(DOT_FP32=_INTERPRETED and x.dtype == torch.bfloat16, PRECISION=_precision(x.dtype), BLOCK_C=block_c)
    TRITON_BLOCK_CALLS["count"] += 1
    with _on_device(x):
        if config is None:
            def grid(meta_):
                return (min(programs, n * triton.cdiv(h, meta_["TILE"]) * triton.cdiv(w, meta_["TILE"])),)
            _block_autotuned[grid](*args, **meta)
        else:
            tile, block_m, block_k, warps, stages = config
            _block_kernel[(programs,)](*args, **meta, TILE=tile, BLOCK_M=block_m, BLOCK_K=block_k, num_warps=warps,
                                       num_stages=stages)
    return out


def _block_reference(x, w1, b1, w2, b2):
    """The two-convolution path: h = relu(conv1(x) + b1) in the activation dtype, relu(conv2(h) + b2 + x)."""
    return _reference(_reference(x, w1, b1, None, 1, 1, True), w2, b2, x, 1, 1, True)


def _block_dispatch(x, w1, b1, w2, b2):
    reason = block_unsupported_reason(x, w1, b1, w2, b2)
    if reason is not None:
        reason = f"fused block: {reason}"
        TRITON_FALLBACKS[reason] = TRITON_FALLBACKS.get(reason, 0) + 1
        return _block_reference(x, w1, b1, w2, b2)
    return _launch_block(x, w1, b1, w2, b2)


@torch.library.custom_op("diffsmooth::triton_basic_block", mutates_args=())
def triton_basic_block(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor,
                       b2: torch.Tensor) -> torch.Tensor:
    """relu(conv2d(relu(conv2d(x, w1, b1, padding=1)), w2, b2, padding=1) + x); off CUDA the reference
    maths, or the Triton kernel under the interpreter."""
    if _INTERPRETED:
        return _block_dispatch(x, w1, b1, w2, b2)
    return _block_reference(x, w1, b1, w2, b2)


@triton_basic_block.register_kernel("cuda")
def _triton_basic_block_cuda(x, w1, b1, w2, b2):
    unavailable = triton_conv_unavailable(x.device)
    if unavailable is not None:
        TRITON_FALLBACKS[unavailable] = TRITON_FALLBACKS.get(unavailable, 0) + 1
        return _block_reference(x, w1, b1, w2, b2)
    return _block_dispatch(x, w1, b1, w2, b2)


@triton_basic_block.register_fake
def _triton_basic_block_fake(x, w1, b1, w2, b2):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device, memory_format=_output_format(x))


def _fusable_block(block: nn.Module) -> bool:
    """A folded stride-1 BasicBlock with an identity shortcut: conv3x3 + ReLU, conv3x3 + x + ReLU, C -> C."""
    if not isinstance(block, FoldedBlock) or block.shortcut is not None or len(block.convs) != 2:
        return False
    first, second = block.convs
    c = first.weight.shape[0]
    return all(conv.stride == 1 and conv.padding == 1 and conv.relu and tuple(conv.weight.shape) == (c, c, 3, 3)
               for conv in (first, second))


class TritonBlock(FoldedBlock):
    """A folded BasicBlock (stride 1, identity shortcut) as one call of `diffsmooth::triton_basic_block`.
    Its two convolutions are TritonConv modules (the same buffers the per-convolution path would use)."""

    @classmethod
    def from_folded(cls, block: FoldedBlock) -> "TritonBlock":
        fused = cls.__new__(cls)
        nn.Module.__init__(fused)
        fused.convs = nn.ModuleList([c if isinstance(c, TritonConv) else TritonConv.from_folded(c) for c in block.convs])
        fused.shortcut = None
        return fused

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first, second = self.convs
        x = x.to(first.weight.dtype)
        return triton_basic_block(x, first.weight, first.bias, second.weight, second.bias)


def _replace_blocks(module: nn.Module) -> int:
    replaced = 0
    for name, child in module.named_children():
        if _fusable_block(child) and not isinstance(child, TritonBlock):
            setattr(module, name, TritonBlock.from_folded(child))
            replaced += 1
        else:
            replaced += _replace_blocks(child)
    return replaced


def _replace_convs(module: nn.Module) -> List[str]:
    replaced = []
    for name, child in module.named_children():
        if isinstance(child, FoldedConv) and not isinstance(child, TritonConv):
            setattr(module, name, TritonConv.from_folded(child))
            replaced.append(name)
        else:
            replaced += [f"{name}.{sub}" for sub in _replace_convs(child)]
    return replaced


def tritonize(folded: nn.Module, fuse_blocks: bool = False) -> nn.Module:
    """A copy of a classifier from fold_classifier whose folded convolutions (FoldedConv) run through
    `diffsmooth::triton_conv_bias_add_relu`; `folded` itself is not modified. fuse_blocks: every
    stride-1 BasicBlock with an identity shortcut runs as one `diffsmooth::triton_basic_block` call
    instead (the intermediate activation stays on chip; the other blocks per convolution)."""
    if isinstance(folded, FoldedConv):
        return TritonConv.from_folded(folded)
    # fold_classifier's buffers may carry autograd history (folded outside no_grad), which deepcopy
    # refuses: those are copied detached.
    memo = {id(t): t.detach().clone() for t in (*folded.parameters(), *folded.buffers()) if not t.is_leaf}
    out = copy.deepcopy(folded, memo)
    if fuse_blocks:
        _replace_blocks(out)
    if not _replace_convs(out) and not any(isinstance(m, TritonConv) for m in out.modules()):
        raise ValueError(f"{type(folded).__name__} holds no folded convolution (FoldedConv): "
                         f"pass the classifier fold_classifier returned")
    return out

"""The GPU fast path as settings: compiled static-shape stages, CUDA graphs, two streams, compiled
noise, fused attention in the UNet — on by default on CUDA — plus GPU batch defaults and the once-per-run check of the fast
path against eager fp32 on a real image.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable, Optional, Tuple

import torch

from diffsmooth.engine.errors import UserError

# Batch defaults from the H200 measurements (shared/measurements/2026-11-26-h200.md): the compiled
# CIFAR-10 UNet peaks at batch 2000 (classifier B x m = 10,000); the ImageNet UNet was measured at 32.
CPU_BATCH = 1000
CUDA_BATCH_SMALL_IMAGES = 2000      # up to 64 x 64 pixels
CUDA_BATCH_LARGE_IMAGES = 32
MIN_AGREEMENT = 0.999


def default_batch(device: str, image_shape: Tuple[int, ...]) -> int:
    """--batch when the user gives none."""
    if torch.device(device).type != "cuda":
        return CPU_BATCH
    pixels = image_shape[-1] * image_shape[-2]
    return CUDA_BATCH_SMALL_IMAGES if pixels <= 64 * 64 else CUDA_BATCH_LARGE_IMAGES


def aligned_batch(total: int, batch: int) -> int:
    """The smallest static batch that covers `total` samples in as many batches as `batch` needs.
    Static batches compute whole batches, and CERTIFY's estimation counts the padded tail of its
    selection batch, so a run of n0 + n samples computes ceil((n0 + n) / batch) batches: at this
    batch the padding is under one sample per batch (n0 + n = 100,100 at 2000: 100,113 computed
    instead of 102,000)."""
    batches = -(-int(total) // int(batch))
    return -(-int(total) // batches)


def default_static_batch(device: str, image_shape: Tuple[int, ...], total: Optional[int], static: bool) -> int:
    """--batch when the user gives none: default_batch, aligned to a pass of `total` samples when
    batches are static (total None: passes of several lengths, e.g. sequential looks)."""
    batch = default_batch(device, image_shape)
    return aligned_batch(total, batch) if static and total else batch


@dataclass(frozen=True)
class FastPath:
    """Which speed features a run uses; `resolve` fills the defaults for a device."""

    compile: bool = False
    cuda_graphs: bool = False
    streams: int = 1
    static_batch: bool = False
    compiled_noise: bool = False
    fused_attention: bool = False
    fused_conv: bool = False

    @classmethod
    def resolve(cls, device: str, compile: Optional[bool] = None, cuda_graphs: Optional[bool] = None,
                streams: Optional[int] = None, fused_attention: Optional[bool] = None,
                fused_conv: Optional[bool] = None) -> "FastPath":
        """On CUDA everything on unless switched off; on CPU eager unless compile=True. Compiled
        stages always get static batches (one graph per run); fused attention defaults to on with
        compiled CUDA stages; fused (BatchNorm-folded) classifier convolutions only when asked for
        (not yet measured on a GPU)."""
        cuda = torch.device(device).type == "cuda"
        compile = cuda if compile is None else bool(compile)
        cuda_graphs = (cuda and compile) if cuda_graphs is None else bool(cuda_graphs)
        if cuda_graphs and not cuda:
            raise UserError("--cuda-graphs needs a CUDA device")
        streams = (2 if cuda else 1) if streams is None else int(streams)
        if streams not in (1, 2):
            raise UserError(f"--streams must be 1 or 2, got {streams}")
        fused_attention = (cuda and compile) if fused_attention is None else bool(fused_attention)
        return cls(compile=compile, cuda_graphs=cuda_graphs, streams=streams,
                   static_batch=compile or cuda_graphs, compiled_noise=compile and cuda,
                   fused_attention=fused_attention, fused_conv=bool(fused_conv))

    @property
    def changes_arithmetic(self) -> bool:
        """True when votes may differ from eager execution (compiled kernels, other attention / conv kernels)."""
        return self.compile or self.cuda_graphs or self.fused_attention or self.fused_conv

    def as_dict(self) -> dict:
        """The settings as recorded next to result files; fused_attention / fused_conv only when on,
        so result files written before they existed still resume."""
        d = asdict(self)
        for key in ("fused_attention", "fused_conv"):
            if not d[key]:
                d.pop(key)
        return d


@dataclass
class AgreementReport:
    samples: int
    agree: int
    max_abs_diff: float

    @property
    def fraction(self) -> float:
        return self.agree / self.samples

    def line(self) -> str:
        return (f"votes agree on {self.agree}/{self.samples} samples ({100 * self.fraction:.2f}%), "
                f"max |score difference| {self.max_abs_diff:.3g}")


def measure_agreement(fast, reference, x: torch.Tensor, image_index: int, samples: int, batch: int) -> AgreementReport:
    """Per-sample votes and scores of two MonteCarloPipelines on the same noisy samples of x."""
    a = fast.all_scores(x, image_index, 0, samples, batch).float().cpu()
    b = reference.all_scores(x, image_index, 0, samples, batch).float().cpu()
    agree = int((a.argmax(dim=1) == b.argmax(dim=1)).sum())
    return AgreementReport(samples, agree, float((a - b).abs().max()))


def validate_fast_path(fast, reference, x: torch.Tensor, image_index: int, samples: int, batch: int,
                       min_agreement: float = MIN_AGREEMENT,
                       log: Callable[[str], None] = print) -> AgreementReport:
    """Check a compiled / reduced-precision pipeline against eager fp32 before it counts; a
    UserError when fewer than `min_agreement` of the votes match."""
    report = measure_agreement(fast, reference, x, image_index, samples, batch)
    verdict = "ok" if report.fraction >= min_agreement else "TOO LOW"
    log(f"# fast path vs eager fp32 on image {image_index}: {report.line()} — {verdict}")
    if report.fraction < min_agreement:
        raise UserError(f"the fast path's votes agree with eager fp32 on only {100 * report.fraction:.2f}% of "
                        f"{samples} samples (need {100 * min_agreement:.1f}%): use --precision fp16/fp32 or "
                        f"--no-compile, or lower --min-agreement")
    return report

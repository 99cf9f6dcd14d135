"""The GPU fast path as settings: compiled static-shape stages, CUDA graphs, two streams, compiled
noise, fused attention in the UNet — on by default on CUDA — plus GPU batch defaults and the once-per-run check of the fast
path's production counts against eager fp32 (TF32 off) on real images.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass
from typing import Callable, Optional, Sequence, Tuple

import torch

from diffsmooth.engine.backends.registry import stage_backend
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.models.packed_resnet import packing
from diffsmooth.engine.runs.fast_path_options import FAST_PATH_OPTIONS, OPTIONAL_KEYS, AskedFastPath, FastPathFields
from diffsmooth.engine.runs.vote_agreement import FP16_FLIP_RATE, AgreementReport, judge_agreement

# Batch defaults from the H200 measurements (bench/results/h200-2026-11-26/): the compiled
# CIFAR-10 UNet peaks at batch 2000 (classifier B x m = 10,000); the ImageNet UNet was measured at 32.
CPU_BATCH = 1000
CUDA_BATCH_SMALL_IMAGES = 2000      # up to 64 x 64 pixels
CUDA_BATCH_LARGE_IMAGES = 32
VALIDATE_IMAGES = 4        # images of the agreement check (the first selected ones)
VALIDATE_SAMPLES = 500     # samples per check image


def default_batch(device: str, image_shape: Tuple[int, ...]) -> int:
    """--batch when the user gives none."""
    if torch.device(device).type != "cuda":
        return CPU_BATCH
    pixels = image_shape[-1] * image_shape[-2]
    return CUDA_BATCH_SMALL_IMAGES if pixels <= 64 * 64 else CUDA_BATCH_LARGE_IMAGES


@dataclass(frozen=True)
class FastPath(FastPathFields):
    """Which speed features a run uses (its fields: engine/runs/fast_path_options.py's table, each off by default);
    `resolve` fills the defaults for a device."""

    @classmethod
    def asked_by(cls, settings, device: str, backend: str = "torch") -> "FastPath":
        """The fast path a run's settings ask for (a RunRequest, bench's settings: their `asked_fast_path`),
        resolved for `device` and `backend`."""
        return cls.resolve(device, backend=backend, **settings.asked_fast_path.given())

    @classmethod
    def resolve(cls, device: str, compile: Optional[bool] = None, *, backend: str = "torch", **asked) -> "FastPath":
        """The fast path of a run on `backend`; `asked`: the settings of fast_path_options.ASKED a user gave (None or absent: the
        default). Each backend decides its own defaults (its class's `fast_path_defaults`, engine/backends/),
        and the settings only the torch backend reads are refused on the others. Torch backend: on CUDA everything
        on unless switched off; on CPU eager unless compile=True. Compiled stages always get static batches (one
        graph per run); fused attention defaults to on with compiled CUDA stages; fused (BatchNorm-folded)
        classifier convolutions only when asked for (docs/status.md says what has run on a GPU). The lean UNet, the
        compile mode and inductor knobs, the classifier's own batch, Triton convolutions and the packed first stage
        are off until asked for: no GPU has measured them (docs/performance.md, "Time-per-sample variants").
        TensorRT: static batches (engine files are built for the run's batch) and, on CUDA, two streams. ONNX Runtime:
        none of it."""
        asked = AskedFastPath(compile=compile, **asked).given()       # each value checked (unknown names refused)
        compile = asked.pop("compile", None)
        try:
            cuda = torch.device(device).type == "cuda"
        except RuntimeError:
            raise UserError(f"unknown device {device!r}: use cpu, cuda or cuda:N") from None
        asked["pack_images"] = packing(asked.get("pack_images"))
        given = [o.name for o in FAST_PATH_OPTIONS if o.variant and asked.get(o.name) not in (None, False, (), "")]
        on = stage_backend(backend)
        if given and not on.accepts_torch_options:
            raise UserError(f"`{given[0]}` is for the torch backend, not {backend}")
        return cls(**on.fast_path_defaults(cuda, compile, asked))

    @property
    def changes_arithmetic(self) -> bool:
        """True when votes may differ from eager execution (compiled kernels, other attention / conv kernels)."""
        return (self.compile or self.cuda_graphs or self.fused_attention or self.fused_conv or self.lean_unet
                or self.triton_conv or bool(self.pack_images))

    def as_dict(self) -> dict:
        """The settings as recorded next to result files; fused_attention, fused_conv and the time-per-sample
        variants only when on (set), so result files written before they existed still resume."""
        d = asdict(self)
        for key in OPTIONAL_KEYS:
            if not d[key]:
                d.pop(key)
        if "inductor" in d:
            d["inductor"] = list(d["inductor"])
        return d


@contextlib.contextmanager
def tf32_off():
    """Full fp32 convolutions and matmuls inside (cuDNN and cuBLAS default to TF32 on Ampere and
    later), the caller's settings restored after: the reference of the agreement check is true fp32."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def production_arrays(fast, images: Sequence[Tuple[int, torch.Tensor]], samples: int, batch: int):
    """(counts [E, K] per image from the production path: the images packed into shared batches by the
    scheduler, per-sample scores [samples, E, K] per image) of samples 0..samples-1 of each (index,
    image), as numpy arrays."""
    counts = fast.count_many(images, 0, samples, batch)
    scores = [fast.all_scores(x, index, 0, samples, batch).float().cpu().numpy() for index, x in images]
    return counts, scores


def reference_arrays(reference, images: Sequence[Tuple[int, torch.Tensor]], samples: int, batch: int):
    """Per-sample scores [samples, E, K] of the eager fp32 reference on the same samples, with TF32 off."""
    with tf32_off():
        return [reference.all_scores(x, index, 0, samples, batch).float().cpu().numpy() for index, x in images]


def measure_agreement(fast, reference, images: Sequence[Tuple[int, torch.Tensor]], samples: int, batch: int,
                      flip_rate: float = FP16_FLIP_RATE) -> AgreementReport:
    """The fast pipeline's production counts (`count_many`: packing, lanes, vote scatter, graph replays) and
    per-sample scores on samples 0..samples-1 of each (index, image), against eager fp32 with TF32
    off on the same samples; judged by vote_agreement.judge_agreement, each configuration of each
    image as one case."""
    counts, scores = production_arrays(fast, images, samples, batch)
    references = reference_arrays(reference, images, samples, batch)
    return judge_each_configuration(counts, scores, references, [i for i, _ in images], flip_rate,
                                    getattr(fast.stages, "score_tolerance", None))


def judge_each_configuration(counts, scores, references, image_indices: Sequence[int],
                             flip_rate: float = FP16_FLIP_RATE, score_tolerance: Optional[float] = None) -> AgreementReport:
    """judge_agreement over production counts [E, K] and scores [samples, E, K] per image: each
    configuration of each image is one case (`score_tolerance` None: the check's default)."""
    configs = range(counts[0].shape[0])
    tolerance = {} if score_tolerance is None else {"score_tolerance": score_tolerance}
    return judge_agreement([c[e] for c in counts for e in configs], [f[:, e] for f in scores for e in configs],
                           [r[:, e] for r in references for e in configs], [i for i in image_indices for _ in configs],
                           flip_rate, **tolerance)


def validate_fast_path(fast, reference, images: Sequence[Tuple[int, torch.Tensor]], samples: int, batch: int,
                       flip_rate: float = FP16_FLIP_RATE,
                       log: Callable[[str], None] = print) -> AgreementReport:
    """Check a compiled / reduced-precision pipeline against eager fp32 before it counts (measure_agreement);
    a UserError naming the first problem when the check refuses it. The weights it judges are those sealed
    when the pipeline was built (sealed here if they were not; MonteCarloPipeline.seal_weights): weights that
    changed since are refused, and so is a run whose weights change after the check."""
    if fast.sealed:
        fast.verify_weights()
    else:
        fast.seal_weights()
    report = measure_agreement(fast, reference, images, samples, batch, flip_rate)
    log(f"# fast path vs eager fp32 (TF32 off): {report.line()} — {'ok' if report.ok else 'REFUSED'}")
    if max(report.spread) < 2:
        log("# the check images' votes do not spread over classes: only the scores can show wrong noise")
    if not report.ok:
        raise UserError(f"the fast path disagrees with eager fp32: {report.problems[0]}; use `precision` fp32 or "
                        f"`compile` off, or raise `expected_flip_rate` (this check expected {flip_rate:.2g} per "
                        f"sample; measured rates: docs/gpu-check.md)")
    return report

"""The GPU fast path's options of certify / predict (engine/runs/fast_path.py): compiled stages, CUDA graphs,
two streams, fused kernels, the time-per-sample variants, and the once-per-run check of the fast path's counts
against eager fp32."""

from __future__ import annotations

import click

from diffsmooth.cli.param_types import BATCH, Count, Number
from diffsmooth.engine.backends.torch.compile_options import COMPILE_MODES, INDUCTOR_KNOBS
from diffsmooth.engine.choices import MAX_SAMPLES

__all__ = ["fast_path_options", "variant_options"]


def variant_options():
    """The time-per-sample fast-path variants, each off until a GPU has measured it (docs/performance.md); `bench`
    declares options of the same names."""
    return (
        click.option("--lean-unet/--no-lean-unet", "lean_unet", default=None,
                     help="The UNet computes only its noise estimate (not the learned-sigma channels) and t*'s "
                          "time embedding once per batch; the same maths [default: off; never run on a GPU]."),
        click.option("--compile-mode", type=click.Choice(COMPILE_MODES), default=None,
                     help="torch.compile mode of the stages; max-autotune-no-cudagraphs autotunes conv/matmul "
                          "kernels (a much longer first compile) [default: torch's default]."),
        click.option("--inductor", default=None, metavar="KNOB[,KNOB]",
                     help="Inductor knobs for the compiled stages: " + ", ".join(INDUCTOR_KNOBS) +
                          " [default: none]."),
        click.option("--classifier-compile-mode", type=click.Choice(COMPILE_MODES), default=None,
                     help="The classifier stage's own torch.compile mode, e.g. max-autotune-no-cudagraphs for the "
                          "classifier alone [default: --compile-mode's]."),
        click.option("--classifier-batch", type=BATCH, default=None,
                     help="Most samples per classifier call (x m images with local smoothing), apart from the "
                          "UNet's --batch [default: the whole batch when it fits half the free GPU memory]."),
        click.option("--triton-conv/--no-triton-conv", "triton_conv", default=False,
                     help="ResNet classifiers with BatchNorm folded and each conv + bias + add + ReLU one Triton "
                          "kernel on CUDA [default: off; never run on a GPU]."),
        click.option("--triton-blocks/--no-triton-blocks", "triton_blocks", default=False,
                     help="With --triton-conv: each stride-1 residual block one Triton kernel, its intermediate "
                          "kept on chip [default: off; never run on a GPU]."),
        click.option("--pack-images", "pack_images", type=click.Choice(["1", "2", "4"]), default=None,
                     callback=lambda ctx, param, value: None if value is None else int(value),
                     help="CIFAR ResNets' 16-channel first stage on K images per tensor (block-diagonal weights, "
                          "the same maths) [default: 1; never run on a GPU]."),
    )


def fast_path_options():
    """The fast path's options in --help's order (on by default with --device cuda; the variants opt-in)."""
    return (
        click.option("--compile/--no-compile", "compile", default=None,
                     help="torch.compile the stages at one static batch shape [default: on for CUDA]."),
        click.option("--cuda-graphs/--no-cuda-graphs", "cuda_graphs", default=None,
                     help="Replay each compiled stage from a CUDA graph [default: on with --compile on CUDA]."),
        click.option("--streams", type=click.IntRange(1, 2), default=None,
                     help="2: denoise batch k+1 while classifying batch k on two CUDA streams [default: 2 on CUDA]."),
        click.option("--fused-attention/--no-fused-attention", "fused_attention", default=None,
                     help="Run the UNet's attention through scaled_dot_product_attention (flash kernels) "
                          "[default: on with --compile on CUDA]."),
        click.option("--fused-conv/--no-fused-conv", "fused_conv", default=False,
                     help="ResNet classifiers with BatchNorm folded into the convolutions and conv + add + ReLU "
                          "as one cuDNN call on CUDA [default: off; see docs/status.md]."),
        *variant_options(),
        click.option("--validate-samples", type=Count(0, MAX_SAMPLES), default=500, show_default=True,
                     help="Samples per image on which a compiled / fp16 / bf16 path's production counts are "
                          "checked against eager fp32 (TF32 off) once per run (0: skip)."),
        click.option("--validate-images", type=click.IntRange(1), default=4, show_default=True,
                     help="How many of the first selected images that check uses."),
        click.option("--expected-flip-rate", type=Number(0, 1, low_open=True, label="the flip rate"), default=None,
                     help="Per-sample vote flip rate a correct fast path shows; the check refuses a run that exceeds "
                          "it with 1-in-10,000 odds [default: measured on an H200, by precision and method: fp16 "
                          "1.3e-4, bf16 1.7e-3; DDS (a clean-trained classifier) fp16 1.1e-3, bf16 1.7e-2]."),
    )

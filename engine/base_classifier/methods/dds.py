"""DDS (Carlini et al. 2023): one-shot diffusion denoising, then a classifier trained on clean images votes."""

from __future__ import annotations

from diffsmooth.engine.base_classifier.methods.base import Method
from diffsmooth.engine.base_classifier.methods.logits_head import LogitsHead
from diffsmooth.engine.base_classifier.methods.one_shot_purifier import OneShotPurifier


class DenoisedSmoothingMethod(Method):
    name = "dds"
    line_name = "DDS (denoise, m=1)"
    purifier = OneShotPurifier
    head = LogitsHead
    # Measured on an H200 on the demo models (bench.agreement; bench/results/h200-2026-11-26/, h200-2026-11-27/):
    # DDS puts a classifier trained on clean images behind the one-shot denoiser, and more of its inputs lie near
    # a decision boundary than a noise-trained classifier's do (the same on the engine's UNet and a diffusers DDPM).
    flip_rates = {
        "fp16": 1.1e-3,         # eager fp16: 18 of 16,000 (diffusers DDPM), 10 (demo UNet)
        # bf16: 0.6-0.7% over 8 images (114 of 16,000 diffusers DDPM, 101 demo UNet), but the check's own four
        # images (the first selected) flipped 34 and 29 of 2,000: flips cluster on images near a boundary, so the
        # rate is the check's worst measured one, not the spread images' average.
        "bf16": 1.7e-2,
    }

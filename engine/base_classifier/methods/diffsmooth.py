"""DiffSmooth (Zhang et al., USENIX Security 2023): one-shot denoising, then local smoothing: the mean softmax of a
smoothed classifier over m Gaussian noises of std sigma' added to the denoised image votes (its settings m,
local_sigma, local_noise, local_noise_seed are its head's: local_smoothing_head.py)."""

from __future__ import annotations

from diffsmooth.engine.base_classifier.methods.base import Method
from diffsmooth.engine.base_classifier.methods.local_smoothing_head import LocalSmoothingHead
from diffsmooth.engine.base_classifier.methods.one_shot_purifier import OneShotPurifier


class DiffSmoothMethod(Method):
    name = "diffsmooth"
    line_name = "DiffSmooth"
    purifier = OneShotPurifier
    head = LocalSmoothingHead
    # Measured on an H200 on the demo models (bench.agreement; bench/results/h200-2026-11-26/, h200-2026-11-27/).
    flip_rates = {"fp16": 1.3e-4,         # m = 5, compiled fp16: 5 + 6 of 40,000
                  "bf16": 1.7e-3}         # m = 5, eager bf16

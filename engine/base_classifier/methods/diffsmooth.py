"""DiffSmooth (Zhang et al., USENIX Security 2023): one-shot denoising, then local smoothing: the mean softmax of a
smoothed classifier over m Gaussian noises of std sigma' added to the denoised image votes."""

from __future__ import annotations

import math
import numbers

from diffsmooth.engine.base_classifier.local_smoothing import LocalSmoothingHead
from diffsmooth.engine.base_classifier.methods.base import Method
from diffsmooth.engine.base_classifier.methods.config import MethodConfig
from diffsmooth.engine.certify.noise import fixed_local_noise
from diffsmooth.engine.choices import FIXED_LOCAL_NOISE_SEED, LOCAL_NOISE_MODES
from diffsmooth.engine.errors import UserError


class DiffSmoothMethod(Method):
    name = "diffsmooth"
    line_name = "DiffSmooth"
    local_smoothing = True
    settings = ("m", "local_sigma", "local_noise", "local_noise_seed")
    classifier_label = "local-smoothing classifier"
    scores = "mean_softmax"
    output_name = "probs"
    # Measured on an H200 on the demo models (bench.agreement; bench/results/h200-2026-11-26/, h200-2026-11-27/).
    flip_rates = {"fp16": 1.3e-4,         # m = 5, compiled fp16: 5 + 6 of 40,000
                  "bf16": 1.7e-3}         # m = 5, eager bf16

    def validate(self, config):
        if isinstance(config.m, bool) or not isinstance(config.m, numbers.Integral) or config.m < 1:
            raise UserError(f"m (local noises) must be >= 1, got {config.m}")
        if not (isinstance(config.local_sigma, numbers.Real) and math.isfinite(config.local_sigma)
                and config.local_sigma >= 0):
            raise UserError(f"local sigma must be >= 0 and finite, got {config.local_sigma}")
        if config.local_noise not in LOCAL_NOISE_MODES:
            raise UserError(f"local noise must be one of {', '.join(LOCAL_NOISE_MODES)}, got {config.local_noise!r}")

    def score_head(self, config, classifier, image_shape):
        fixed = (fixed_local_noise(config.m, image_shape, config.local_noise_seed)
                 if config.local_noise == "fixed" else None)
        return LocalSmoothingHead(classifier, config.m, config.local_sigma, config.local_noise, fixed)

    def classifier_calls(self, config):
        return int(config.m)

    def fresh_noise_shape(self, config, image_shape):
        return (int(config.m), *map(int, image_shape)) if config.local_noise == "fresh" else None

    def config_tag(self, config):
        return f"__ls{config.local_sigma:g}__m{config.m}"

    def graph_tag(self, config):
        tag = f"_m{config.m}_ls{config.local_sigma:g}_{config.local_noise}"
        if config.local_noise == "fixed" and config.local_noise_seed != FIXED_LOCAL_NOISE_SEED:
            tag += f"_seed{config.local_noise_seed}"
        return tag

    def graph_fields(self, config):
        return {"m": int(config.m), "local_sigma": float(config.local_sigma), "local_noise": config.local_noise,
                "local_noise_seed": int(config.local_noise_seed) if config.local_noise == "fixed" else None}

    def config_from_manifest(self, manifest):
        return MethodConfig(self.name, float(manifest["sigma"]), int(manifest["m"]), float(manifest["local_sigma"]),
                            manifest["local_noise"], int(manifest.get("local_noise_seed") or FIXED_LOCAL_NOISE_SEED))

    def demo_noise_level(self, sigma, local_sigma):
        return local_sigma

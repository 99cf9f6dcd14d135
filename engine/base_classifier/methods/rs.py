"""Randomized smoothing (Cohen et al. 2019): the classifier votes on the noisy sample itself, no denoiser."""

from __future__ import annotations

from diffsmooth.engine.base_classifier.methods.base import Method


class RandomizedSmoothingMethod(Method):
    name = "rs"
    line_name = "RS (Cohen et al.)"
    denoises = False
    # Not measured on its own (bench.agreement measured DiffSmooth and DDS): the noise-trained classifiers'
    # rates, as DiffSmooth's, since RS's classifier is noise-trained too.
    flip_rates = {"fp16": 1.3e-4, "bf16": 1.7e-3}

    def demo_noise_level(self, sigma: float, local_sigma: float) -> float:
        return sigma

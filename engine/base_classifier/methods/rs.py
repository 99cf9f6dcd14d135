"""Randomized smoothing (Cohen et al. 2019): the classifier votes on the noisy sample itself, no denoiser."""

from __future__ import annotations

from diffsmooth.engine.base_classifier.methods.base import Method
from diffsmooth.engine.base_classifier.methods.logits_head import LogitsHead
from diffsmooth.engine.base_classifier.methods.no_purifier import NoPurifier


class RandomizedSmoothingMethod(Method):
    name = "rs"
    line_name = "RS (Cohen et al.)"
    purifier = NoPurifier
    head = LogitsHead
    # Not measured on its own (bench.agreement measured DiffSmooth and DDS): the noise-trained classifiers'
    # rates, as DiffSmooth's, since RS's classifier is noise-trained too.
    flip_rates = {"fp16": 1.3e-4, "bf16": 1.7e-3}

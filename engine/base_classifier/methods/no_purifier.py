"""No purifier (randomized smoothing): the classifier scores the noisy sample x + sigma * eps itself."""

from __future__ import annotations

from diffsmooth.engine.base_classifier.methods.purifier import Purifier


class NoPurifier(Purifier):
    purifies = False
    denoises = False

    def stage(self, sigma, denoiser, backend, fast=None):
        return None

    def graph(self, sigma, denoiser, image_shape, method):
        return None

    def lookup(self, sigma, method):
        return {}

    def exported_stage(self, sigma, graph, manifest):
        return None

    def key(self, sigma):
        return None

    def serving(self, purifiers):
        return 0

    def share(self, samples):
        return samples

    def unet_calls(self):
        return 0

    def noise_left(self, sigma):
        return float(sigma)

    def tag(self):
        return ""

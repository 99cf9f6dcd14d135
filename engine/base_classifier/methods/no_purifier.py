"""No purifier (randomized smoothing): the classifier scores the noisy sample x + sigma * eps itself."""

from __future__ import annotations

from diffsmooth.engine.base_classifier.methods.purifier import Purifier


class NoPurifier(Purifier):
    denoises = False

    def stage(self, config, denoiser, backend, fast=None):
        return None

    def graph(self, config, denoiser, image_shape):
        return None

    def lookup(self, config):
        return {}

    def exported_stage(self, config, graph, manifest):
        return None

    def key(self, config):
        return None

    def sweep_config(self, configs):
        return configs[0]

    def sweep_samples(self, config, samples):
        return samples

    def runs(self, config):
        return 1

    def unet_calls(self, config):
        return 0

    def noise_left(self, config):
        return float(config.sigma)

    def tag(self, config):
        return ""

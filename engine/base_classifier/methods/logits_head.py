"""The classifier's logits (RS, DDS): the classifier scores each sample once and its argmax votes."""

from __future__ import annotations

from diffsmooth.engine.base_classifier.local_smoothing import LogitsHead
from diffsmooth.engine.base_classifier.methods.head import EachOwnScorer, Head


class Logits(Head):
    label = "classifier"
    scores = "logits"
    output_name = "logits"

    def module(self, config, classifier, image_shape, runs):
        return LogitsHead(classifier)

    def classifier_calls(self, config, runs):
        return 1

    def fresh_noise_shape(self, config, image_shape):
        return None

    def score_tolerance(self, config, runs):
        return None

    def noise_seen(self, config, noise_left):
        return noise_left

    def tag(self, config):
        return ""

    def graph_tag(self, config):
        return ""

    def graph_fields(self, config):
        return {}

    def sweep_scorer(self, configs, classifiers, image_shape, runs):
        return EachOwnScorer(classifiers, [c.method.kind.purifier.reads for c in configs])

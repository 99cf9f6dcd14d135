"""The classifier's logits (RS, DDS): the classifier scores each sample once and its argmax votes."""

from __future__ import annotations

from torch import nn

from diffsmooth.engine.base_classifier.local_smoothing import LogitsHead
from diffsmooth.engine.base_classifier.methods.head import Head, SweepScorer


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
        return LogitsScorer(classifiers, [c.method.kind.purifier.reads for c in configs])


class LogitsScorer(SweepScorer):
    """Each configuration's classifier on the samples it reads."""

    def __init__(self, classifiers, reads):
        super().__init__()
        self.classifiers, self.reads = nn.ModuleList(classifiers), tuple(reads)

    def forward(self, samples, fresh=None):
        return [classifier(samples[reads]).float() for classifier, reads in zip(self.classifiers, self.reads)]

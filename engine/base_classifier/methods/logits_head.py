"""The classifier's logits (RS, DDS): the classifier scores each sample once and its argmax votes."""

from __future__ import annotations

from diffsmooth.engine.base_classifier.local_smoothing import LogitsModule
from diffsmooth.engine.base_classifier.methods.head import PlainHead


class LogitsHead(PlainHead):
    label = "classifier"
    scores = "logits"
    output_name = "logits"

    def module(self, classifier, image_shape, copies):
        return LogitsModule(classifier)

    def classifier_calls(self, copies):
        return 1

    def score_tolerance(self, copies):
        return None

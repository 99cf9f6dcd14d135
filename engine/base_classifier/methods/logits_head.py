"""The classifier's logits (RS, DDS): the classifier scores each sample once and its argmax votes."""

from __future__ import annotations

import torch
from torch import nn

from diffsmooth.engine.base_classifier.methods.head import PlainHead


class LogitsModule(nn.Module):
    """The plain classifier (RS, DDS): images -> fp32 logits; the vote is their argmax."""

    takes_noise = False

    def __init__(self, classifier: nn.Module):
        super().__init__()
        self.classifier = classifier

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(x).float()


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


Logits = LogitsHead      # its name before parts ended in Purifier / Head: scripts written with it keep working

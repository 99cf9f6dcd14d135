"""A majority vote (DensePure's head): the classifier labels each of the purifier's K samples of one noisy sample
and the most frequent label votes, ties going to the label that came first."""

from __future__ import annotations

import torch
from torch import nn

from diffsmooth.engine.base_classifier.methods.head import PlainHead


class MajorityVoteModule(nn.Module):
    """K purified samples [B,K,C,H,W] (or the first K of more) -> scores [B,classes] whose argmax is the label most
    of the K runs gave, ties to the label that came first (DensePure's `max(labels, key=labels.count)`):
    count * (K + 1) - the first run that gave it; -1 for a label no run gave."""

    def __init__(self, classifier: nn.Module, runs: int):
        super().__init__()
        self.classifier, self.runs = classifier, int(runs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.unsqueeze(1) if x.dim() == 4 else x[:, : self.runs]     # one sample, or (a sweep) the first K
        b = x.shape[0]
        logits = self.classifier(x.reshape(b * self.runs, *x.shape[2:])).float()
        chosen = nn.functional.one_hot(logits.argmax(dim=-1).view(b, self.runs), logits.shape[-1]).float()
        counts = chosen.sum(dim=1)
        order = torch.arange(self.runs, device=x.device, dtype=torch.float32).view(1, -1, 1)
        first = torch.where(chosen > 0, order, torch.full_like(chosen, float(self.runs))).amin(dim=1)
        return torch.where(counts > 0, counts * (self.runs + 1) - first, torch.full_like(counts, -1.0))


class MajorityVoteHead(PlainHead):
    """The K labels' majority; K is what the purifier hands over (Purifier.copies; one sample: its own label)."""

    label = "majority-vote classifier"
    scores = "votes"
    output_name = "votes"

    def module(self, classifier, image_shape, copies):
        return MajorityVoteModule(classifier, copies)

    def classifier_calls(self, copies):
        return int(copies)

    def score_tolerance(self, copies):
        """Its scores are vote counts: a run whose label flips moves a sample's score by up to K + 2 against a scale
        of K (K + 1); three such runs in one sample are allowed (the flip budgets judge the votes themselves)."""
        return 3.0 * (copies + 2) / (1.0 + copies * (copies + 1))

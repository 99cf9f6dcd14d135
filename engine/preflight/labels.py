"""Label order: the confusion matrix of the classifier's clean predictions and the label permutation that
explains it best (scipy.optimize.linear_sum_assignment), against the identity. A classifier trained with the
classes in another order scores near chance while a permutation of its predictions scores as a classifier."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict

import numpy as np
from scipy.optimize import linear_sum_assignment

from diffsmooth.engine.preflight.findings import PreflightReport

MIN_PER_LABEL = 5           # images per label the sample needs before a permutation can be told from noise
GAIN = 0.20                 # a permutation must explain this much more of the sample (20 points) to be named


def confusion(labels: np.ndarray, predictions: np.ndarray, classes: int) -> np.ndarray:
    """[data label, predicted class] counts."""
    matrix = np.zeros((classes, classes), dtype=np.int64)
    np.add.at(matrix, (labels, predictions), 1)
    return matrix


@dataclass(frozen=True)
class LabelOrder:
    identity: float                     # accuracy with the labels as given
    best: float                         # accuracy under the best permutation
    mapping: Dict[int, int]             # data label -> the class the classifier calls it (labels present only)
    per_label: float                    # images per label present in the sample

    @classmethod
    def of(cls, labels: np.ndarray, predictions: np.ndarray, classes: int) -> "LabelOrder":
        labels, predictions = np.asarray(labels, dtype=np.int64), np.asarray(predictions, dtype=np.int64)
        matrix = confusion(labels, predictions, classes)
        present = np.unique(labels)
        rows, cols = linear_sum_assignment(-matrix[present])        # each label present to a distinct class
        mapping = {int(present[r]): int(c) for r, c in zip(rows, cols)}
        best = sum(int(matrix[label, c]) for label, c in mapping.items()) / len(labels)
        return cls(float(np.mean(labels == predictions)), float(best), mapping, len(labels) / len(present))

    @property
    def moved(self) -> Dict[int, int]:
        return {label: c for label, c in self.mapping.items() if label != c}

    def report(self, report: PreflightReport) -> None:
        judged = self.per_label >= MIN_PER_LABEL
        text = f"clean accuracy {100 * self.identity:.1f}% with the labels as given, {100 * self.best:.1f}% under the " \
               f"best label permutation ({'the identity' if not self.moved else f'{len(self.moved)} labels moved'})"
        report.add("labels", text + ("" if judged else f"; {self.per_label:.1f} images per label are too few to judge "
                                                       f"the order (needs {MIN_PER_LABEL})"))
        if judged and self.moved and self.best - self.identity >= GAIN:
            shown = ", ".join(f"{a}->{b}" for a, b in list(self.moved.items())[:10])
            more = f" and {len(self.moved) - 10} more" if len(self.moved) > 10 else ""
            report.add("labels", f"the classifier's class order is not the data's: the permutation {shown}{more} "
                                 f"explains {100 * self.best:.1f}% of the sample, the labels as given "
                                 f"{100 * self.identity:.1f}%", warning=True,
                       fix="relabel the data in the classifier's class order (data label -> class above), or use "
                           "the classifier trained on this data's labels")

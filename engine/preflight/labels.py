"""Label order: the confusion matrix of the classifier's clean predictions and the label permutation that
explains it best (scipy.optimize.linear_sum_assignment), against the identity. A classifier trained with the
classes in another order scores near chance while a permutation of its predictions scores as a classifier. The
test is cross-fitted: the permutation is fitted on half of each label's images and judged on the other half, so a
permutation fitted to noise does not beat the identity by construction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict

import numpy as np
from scipy.optimize import linear_sum_assignment

from diffsmooth.engine.preflight.findings import PreflightReport
from diffsmooth.engine.preflight.paired import DIFFERS, INCONCLUSIVE, PairedResult, sign_test

MIN_PER_LABEL = 5           # images per label in the clean sample (stratified over the whole data where it can be)
GAIN = 0.20                 # the effect that matters: a permutation right on 20 more images in 100


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

    @staticmethod
    def crossfit(labels: np.ndarray, predictions: np.ndarray, classes: int, seed: int) -> PairedResult:
        """The sign test of "the permutation fitted on one half of each label's images is right more often on the
        other half than the labels as given" (McNemar's exact test, effect GAIN)."""
        labels, predictions = np.asarray(labels, dtype=np.int64), np.asarray(predictions, dtype=np.int64)
        rng = np.random.default_rng(seed)
        fit = np.zeros(len(labels), dtype=bool)
        for label in np.unique(labels):
            where = np.flatnonzero(labels == label)
            fit[rng.permutation(where)[:len(where) // 2]] = True
        mapping = LabelOrder.of(labels[fit], predictions[fit], classes).mapping if fit.any() else {}
        held = ~fit
        mapped = np.array([mapping.get(int(label), int(label)) for label in labels[held]], dtype=np.int64)
        return sign_test("label permutation against the labels as given (cross-fitted)",
                         (predictions[held] == labels[held]).astype(float), (predictions[held] == mapped).astype(float),
                         GAIN)

    def report(self, report: PreflightReport, test: PairedResult) -> None:
        text = f"clean accuracy {100 * self.identity:.1f}% with the labels as given, {100 * self.best:.1f}% under the " \
               f"best label permutation ({'the identity' if not self.moved else f'{len(self.moved)} labels moved'}; " \
               f"{self.per_label:.1f} images per label)"
        report.add("labels", text)
        report.measured.setdefault("tests", {})[test.name] = test.as_dict()
        report.add("labels", test.text(), inconclusive=test.verdict == INCONCLUSIVE)
        if test.verdict == DIFFERS and self.moved:
            shown = ", ".join(f"{a}->{b}" for a, b in list(self.moved.items())[:10])
            more = f" and {len(self.moved) - 10} more" if len(self.moved) > 10 else ""
            report.add("labels", f"the classifier's class order is not the data's: the permutation {shown}{more} "
                                 f"explains {100 * self.best:.1f}% of the sample, the labels as given "
                                 f"{100 * self.identity:.1f}% (cross-fitted p = {test.p_value:.2g})", warning=True,
                       fix="relabel the data in the classifier's class order (data label -> class above), or use "
                           "the classifier trained on this data's labels")

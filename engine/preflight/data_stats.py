"""The sample's data as the models will see it: count, shape, dtype, pixel range and label set. The engine's
images are [0, 1] floats; a [0, 255] or a [-1, 1] tensor (a uint8 array, or a torchvision Normalize(0.5, 0.5)
left in place) changes what every sigma means, so it is named with its fix."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import torch

from diffsmooth.engine.preflight.findings import PreflightReport

SLACK = 1e-3                # float rounding at the ends of [0, 1]


@dataclass(frozen=True)
class DataStats:
    count: int
    shape: Tuple[int, ...]
    dtype: str
    low: float
    high: float
    labels: Tuple[int, ...]

    @classmethod
    def of(cls, images: torch.Tensor, labels: torch.Tensor) -> "DataStats":
        values = images.detach().to(torch.float64)
        return cls(int(images.shape[0]), tuple(int(d) for d in images.shape[1:]), str(images.dtype).replace("torch.", ""),
                   float(values.min()), float(values.max()), tuple(sorted({int(v) for v in labels.tolist()})))

    def pixel_range(self) -> str:
        """"[0, 1]" (what the engine expects), "[0, 255]", "[-1, 1]", or "other"."""
        if self.low >= -SLACK and self.high <= 1 + SLACK:
            return "[0, 1]"
        if self.low >= -SLACK and self.high <= 255 + SLACK:
            return "[0, 255]"
        if self.low >= -1 - SLACK and self.high <= 1 + SLACK:
            return "[-1, 1]"
        return "other"

    def report(self, report: PreflightReport) -> None:
        labels = self.labels
        listed = ", ".join(map(str, labels)) if len(labels) <= 12 else f"{labels[0]}..{labels[-1]}"
        scale = self.pixel_range()
        where = "as expected" if scale == "[0, 1]" else "not the [0, 1] the engine expects"
        report.add("data", f"{self.count} images {list(self.shape)} {self.dtype}, pixels {self.low:.4g}..{self.high:.4g} "
                           f"({scale}: {where}), {len(labels)} labels ({listed})")
        if scale == "[0, 255]":
            report.add("data", f"the images lie in [0, 255] ({self.low:.4g}..{self.high:.4g}), not [0, 1]: every sigma "
                               f"would be 255 times too small for them", warning=True,
                       fix="divide the images by 255 (or store uint8 in an .npz: the loaders divide)")
        elif scale == "[-1, 1]":
            report.add("data", f"the images lie in [-1, 1] ({self.low:.4g}..{self.high:.4g}), not [0, 1]: a sigma for "
                               f"[0, 1] pixels is half the noise on them", warning=True,
                       fix="map them to [0, 1] with (x + 1) / 2 (drop a Normalize(0.5, 0.5) transform)")
        elif scale == "other":
            report.add("data", f"the pixels span {self.low:.4g}..{self.high:.4g}, not [0, 1]: normalised images? the "
                               f"classifier's normalisation belongs to the model", warning=True,
                       fix="give the images in [0, 1] and the normalisation as --normalization / --stats")

"""Published per-image certification times (docs/performance.md) next to this run's extrapolated times.
The hardware differs (the paper used one RTX A6000 GPU), so a ratio compares machines as much
as implementations; the implied throughput of the published runs is derived with our FLOP count."""

from __future__ import annotations

from typing import List

from .timing import extrapolate_seconds

HARDWARE_NOTE = ("Published times come from other hardware (DiffSmooth paper: one NVIDIA RTX A6000; "
                 "Cohen et al.: their logs' GPU; DDS: one A100). They are not measurements on this "
                 "machine: the ratio compares machines and implementations together.")

# (dataset, method, m, n, seconds per image, where / hardware, denoiser seconds)
PUBLISHED = [
    ("CIFAR-10", "diffsmooth", 1, 100_000, 97.0, "DiffSmooth paper, RTX A6000", 90.0),
    ("CIFAR-10", "diffsmooth", 3, 100_000, 111.0, "DiffSmooth paper, RTX A6000", 90.0),
    ("CIFAR-10", "diffsmooth", 5, 100_000, 125.0, "DiffSmooth paper, RTX A6000", 90.0),
    ("CIFAR-10", "diffsmooth", 11, 100_000, 169.0, "DiffSmooth paper, RTX A6000", 90.0),
    ("CIFAR-10", "diffsmooth", 21, 100_000, 240.0, "DiffSmooth paper, RTX A6000", 90.0),
    ("ImageNet", "diffsmooth", 1, 10_000, 564.0, "DiffSmooth paper, RTX A6000", 553.0),
    ("ImageNet", "diffsmooth", 3, 10_000, 586.0, "DiffSmooth paper, RTX A6000", 553.0),
    ("ImageNet", "diffsmooth", 5, 10_000, 608.0, "DiffSmooth paper, RTX A6000", 553.0),
    ("ImageNet", "diffsmooth", 11, 10_000, 672.0, "DiffSmooth paper, RTX A6000", 553.0),
    ("ImageNet", "diffsmooth", 21, 10_000, 776.0, "DiffSmooth paper, RTX A6000", 553.0),
    ("CIFAR-10", "rs", None, 100_000, 15.5, "Cohen et al. logs, ResNet-110, batch 400 (14-17 s)", None),
    ("ImageNet", "rs", None, 100_000, 150.0, "Cohen et al. logs, ResNet-50", None),
    ("CIFAR-10", "dds", None, 100_000, 121.0, "Carlini et al. DDS, A100 (825 samples/s)", None),
]

SET_DATASET = {"demo": "CIFAR-10", "cifar10": "CIFAR-10", "imagenet": "ImageNet"}


def published_for(dataset: str, method: str) -> List[tuple]:
    return [row for row in PUBLISHED if row[0] == dataset and row[1] == method]


def compare_rows(run: dict, settings) -> dict:
    """Rows (published vs measured-and-extrapolated at the published n) for this run's method."""
    dataset = SET_DATASET[settings.models]
    measured = run["measured"]
    flops = run["flops"]["total_per_sample"]
    like_for_like = settings.models != "demo"
    rows = []
    for ds, method, m, n, seconds, source, den_s in published_for(dataset, settings.method):
        ours = None
        if m is None or m == settings.m:          # a method without m, or the run's m
            ours = extrapolate_seconds(measured["per_sample_s"], measured["per_image_fixed_s"], settings.n0, n)
        samples = settings.n0 + n
        row = {"dataset": ds, "method": method, "m": m, "n": n, "published_s": seconds, "source": source,
               "published_denoiser_s": den_s, "published_samples_per_s": samples / seconds,
               "measured_extrapolated_s": ours,
               "measured_over_published": ours / seconds if ours else None}
        if like_for_like and (m is None or m == settings.m):
            row["published_implied_tflops"] = flops * samples / seconds / 1e12
        rows.append(row)
    note = HARDWARE_NOTE
    if not like_for_like:
        note += (" The demo set uses much smaller models than the published CIFAR-10 runs "
                 f"({flops / 1e9:.2f} vs ~19.3 GFLOP per sample at m=5): not like for like.")
    return {"note": note, "rows": rows}

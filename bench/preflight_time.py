"""How long `diffsmooth preflight` takes: measured on the embedded demo here (rs, dds, diffsmooth at their
`preflight` defaults: 100 images, 5 noise samples each; DiffSmooth also at the paper's m = 21), with the model calls
it made counted; and estimated for the paper's CIFAR-10 and ImageNet models on one GPU from the calls the same
preflight makes there (ImageNet's clean checks: 5 images per label of 1,000, decoded on the CPU at the rate measured
here) and the measured fp32 eager rate of the full-size models on an H200 (the preflight runs eager fp32, as the
run-time check's reference).

    python -m diffsmooth.bench.preflight_time [--device cpu] [--threads 2] [--images 100] [--samples 5] [--json OUT]

`bash bench/gpu_check.sh OUT preflight` runs it with `--device cuda` (the demo's measured time on a GPU).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import List

import click
import torch

from diffsmooth.engine.base_classifier.methods import MethodConfig, method_named
from diffsmooth.engine.models.resnet import CifarResNet, ResNet50
from diffsmooth.engine.models.unet import UNetModel
from diffsmooth.engine.preflight.labels import MIN_PER_LABEL
from diffsmooth.engine.preflight.measure import SCHEDULE_CHOICES, VARIANT_SAMPLES
from diffsmooth.engine.preflight.run import IMAGES, SAMPLES, preflight_request
from diffsmooth.engine.runs.request import RunRequest

# Measured on one H200 (bench/results/h200-2026-11-26/bench.jsonl, `reference_equivalent`: fp32 eager, batch 50,
# UNet + 5 classifier calls per sample, random weights of the official shapes): samples per second, and the FLOPs
# `bench` counted per UNet sample and per classifier image. Their quotient is the fp32 eager FLOP rate the
# estimates below divide by (FLOP-weighted: UNet and classifier calls at the same rate).
H200_FP32_EAGER = {
    "cifar10": {"samples_per_s": 970.17, "unet_gflop": 16.773, "classifier_gflop": 0.5063, "calls": 5,
                "classifier": "ResNet-110"},
    "imagenet": {"samples_per_s": 51.162, "unet_gflop": 1712.58, "classifier_gflop": 8.1784, "calls": 5,
                 "classifier": "ResNet-50"},
}
NORMALIZATIONS = 3              # the classifier's clean predictions under normalize, center, none
VARIANTS = 5                    # the noise variants: the three normalisations, half and twice the noise
CLASSES = {"cifar10": 10, "imagenet": 1000, "embedded": 10}
CHANNELS = {"cifar10": 3, "imagenet": 3, "embedded": 1}     # 3: the clean checks add the channels reversed (BGR)


def clean_images(dataset: str, images: int) -> int:
    """The clean checks' images (engine/preflight/run.py clean_indices): MIN_PER_LABEL per label or more, at least
    `images`."""
    classes = CLASSES[dataset]
    return max(MIN_PER_LABEL, -(-images // classes)) * classes


@dataclass
class Calls:
    """Model calls of one preflight: UNet samples and classifier images."""

    unet: int = 0
    classifier: int = 0


def expected_calls(method: str, images: int, samples: int, m: int, dataset: str = "embedded") -> Calls:
    """The calls a preflight makes (engine/preflight/run.py, measure.py): the classifier on the clean sample under
    each normalisation (and with the channels reversed for RGB); the base classifier on `samples` noise samples per
    image (m classifier images each for DiffSmooth); each variant on VARIANT_SAMPLES of them (one local noise; DDS
    has no half-noise one); for a denoising method the UNet on every sample, and once per image for the denoiser's
    error with the schedule given and the other schedules; and the stages' one probe with a blank image."""
    kind = method_named(method)
    config = MethodConfig(method, 0.5, m=m)
    half = kind.head.noise_option is not None or not kind.purifier.denoises     # a half-noise variant (none for DDS)
    variants = VARIANTS - (not half)
    per_sample = kind.classifier_calls(config)
    clean = clean_images(dataset, images) * (NORMALIZATIONS + (CHANNELS[dataset] == 3))
    classifier = clean + images * (samples * per_sample + variants * min(samples, VARIANT_SAMPLES)) + per_sample
    unet = images * (samples * config.purifier.unet_calls() + len(SCHEDULE_CHOICES)) + 1 if kind.purifier.denoises else 0
    return Calls(unet, classifier)


class CallCounter:
    """Counts the images every UNet and classifier network is called on (a global forward hook)."""

    def __init__(self):
        self.calls = Calls()

    def __enter__(self):
        def hook(module, args, output):
            if isinstance(module, UNetModel):
                self.calls.unet += int(args[0].shape[0])
            elif isinstance(module, (CifarResNet, ResNet50)):
                self.calls.classifier += int(args[0].shape[0])
        self.handle = torch.nn.modules.module.register_module_forward_hook(hook)
        return self

    def __exit__(self, *exc):
        self.handle.remove()


SETTINGS = {"rs": "sigma 0.5", "dds": "sigma 0.5", "diffsmooth": "sigma 0.5, sigma' 0.25, m 5",
            "diffsmooth m 21": "sigma 0.5, sigma' 0.25, m 21 (the paper's m)"}
DEMO = {"rs": dict(method=("rs",), sigma=0.5),
        "dds": dict(method=("dds",), sigma=0.5),
        "diffsmooth": dict(method=("diffsmooth",), sigma=0.5, local_sigma=(0.25,), m=(5,)),
        "diffsmooth m 21": dict(method=("diffsmooth",), sigma=0.5, local_sigma=(0.25,), m=(21,))}


def measure_demo(images: int, samples: int, threads: int, device: str = "cpu") -> List[dict]:
    rows = []
    for name, options in DEMO.items():
        method = options["method"][0]
        request = RunRequest.parse("certify", out="(preflight)", threads=threads, device=device, quiet=True, **options)
        with CallCounter() as counter:
            start = time.perf_counter()
            report = preflight_request(request, images=images, samples=samples)
            seconds = time.perf_counter() - start
        m = request.m[0]
        expected = expected_calls(method, images, samples, m)
        rows.append({"method": method, "settings": SETTINGS[name],
                     "seconds": seconds, "warnings": len(report.warnings), "unet_samples": counter.calls.unet,
                     "classifier_images": counter.calls.classifier, "expected": expected.__dict__,
                     "inconclusive": len(report.inconclusive), "r0_upper": report.measured["r0_upper"]})
    return rows


PAPER_RUNS = {      # the paper's runs whose preflight is estimated: (dataset, method, m)
    "CIFAR-10, RS (ResNet-110)": ("cifar10", "rs", 1),
    "CIFAR-10, DDS (UNet + ResNet-110)": ("cifar10", "dds", 1),
    "CIFAR-10, DiffSmooth m = 21 (UNet + ResNet-110)": ("cifar10", "diffsmooth", 21),
    "ImageNet, RS (ResNet-50)": ("imagenet", "rs", 1),
    "ImageNet, DDS (UNet + ResNet-50)": ("imagenet", "dds", 1),
    "ImageNet, DiffSmooth m = 21 (UNet + ResNet-50)": ("imagenet", "diffsmooth", 21),
}


def decode_seconds(count: int = 24) -> float:
    """Seconds per image to decode, resize and crop an ImageNet-sized JPEG (500 x 375, the validation set's common
    size) with the engine's ImageFolderDataset on this machine, measured on synthetic files."""
    import tempfile

    import numpy as np
    from PIL import Image

    from diffsmooth.engine.data.imagenet import ImageFolderDataset

    with tempfile.TemporaryDirectory() as root:
        rng = np.random.default_rng(0)
        for k in range(count):
            folder = f"{root}/n{k % 2:08d}"
            os.makedirs(folder, exist_ok=True)
            pixels = (rng.random((375, 500, 3)) * 255).astype("uint8")
            Image.fromarray(pixels).save(f"{folder}/{k}.JPEG", quality=90)
        dataset = ImageFolderDataset(root)
        start = time.perf_counter()
        for i in range(len(dataset)):
            dataset[i]
        return (time.perf_counter() - start) / len(dataset)


def estimate_paper(images: int, samples: int, decode: float) -> List[dict]:
    rows = []
    for name, (dataset, method, m) in PAPER_RUNS.items():
        rate = H200_FP32_EAGER[dataset]
        flop_per_s = rate["samples_per_s"] * (rate["unet_gflop"] + rate["calls"] * rate["classifier_gflop"]) * 1e9
        calls = expected_calls(method, images, samples, m, dataset)
        flops = (calls.unet * rate["unet_gflop"] + calls.classifier * rate["classifier_gflop"]) * 1e9
        decoded = (clean_images(dataset, images) + images) * decode if dataset == "imagenet" else 0.0
        rows.append({"run": name, "unet_samples": calls.unet, "classifier_images": calls.classifier,
                     "seconds": flops / flop_per_s, "decode_seconds": decoded,
                     "fp32_eager_tflop_per_s": flop_per_s / 1e12})
    return rows


CIFAR_TABLE1 = [("CIFAR-10, RS (ResNet-110)", 9), ("CIFAR-10, DDS (UNet + ResNet-110)", 9),
                ("CIFAR-10, DiffSmooth m = 21 (UNet + ResNet-110)", 18)]
IMAGENET_TABLE2 = [("ImageNet, RS (ResNet-50)", 6), ("ImageNet, DDS (UNet + ResNet-50)", 9),
                   ("ImageNet, DiffSmooth m = 21 (UNet + ResNet-50)", 6)]
TABLES = {"cifar10-table1.toml (36 runs: 9 RS, 9 DDS, 18 DiffSmooth m = 21)": CIFAR_TABLE1,
          "imagenet-table2-resnet50.toml (21 runs: 6 RS, 9 DDS, 6 DiffSmooth m = 21)": IMAGENET_TABLE2}


@click.command()
@click.option("--device", default="cpu", show_default=True, help="Where the demo's preflights run (cpu, cuda).")
@click.option("--threads", type=int, default=2, show_default=True, help="torch CPU threads for the demo runs.")
@click.option("--images", type=int, default=IMAGES, show_default=True)
@click.option("--samples", type=int, default=SAMPLES, show_default=True)
@click.option("--json", "json_out", type=click.Path(dir_okay=False), default=None, help="Also write the figures as JSON.")
def main(device, threads, images, samples, json_out):
    """Print the preflight's measured time on the demo and its estimated time on the paper's models."""
    demo = measure_demo(images, samples, threads, device)
    where = "this machine's CPU" if device == "cpu" else f"{device} ({torch.cuda.get_device_name(device)})"
    print(f"preflight on the embedded demo, {images} images x {samples} noise samples, {threads} torch threads, "
          f"{where} (measured):")
    print("| method | settings | seconds (measured) | UNet samples | classifier images | warnings | inconclusive |")
    print("|---|---|---|---|---|---|---|")
    for row in demo:
        same = row["expected"] == {"unet": row["unet_samples"], "classifier": row["classifier_images"]}
        print(f"| {row['method']} | {row['settings']} | {row['seconds']:.1f} | {row['unet_samples']:,} | "
              f"{row['classifier_images']:,}{'' if same else ' (expected ' + str(row['expected']) + ')'} | "
              f"{row['warnings']} | {row['inconclusive']} |")
    decode = decode_seconds()
    paper = estimate_paper(images, samples, decode)
    print()
    print("the same preflight on the paper's models on one H200 (estimated: the calls above at the fp32 eager FLOP rate "
          "measured there, bench/results/h200-2026-11-26/bench.jsonl; ImageNet's decoding at "
          f"{1000 * decode:.1f} ms per image, measured here on one core; checkpoint loading not included):")
    print("| run | UNet samples | classifier images | GPU seconds (estimated) | decoding seconds (estimated) |")
    print("|---|---|---|---|---|")
    for row in paper:
        print(f"| {row['run']} | {row['unet_samples']:,} | {row['classifier_images']:,} | {row['seconds']:.1f} | "
              f"{row['decode_seconds']:.1f} |")
    by_run = {row["run"]: row["seconds"] for row in paper}
    decoding = {row["run"]: row["decode_seconds"] for row in paper}
    print()
    for table, runs in TABLES.items():
        total = sum(by_run[run] * count for run, count in runs)
        once = max(decoding[run] for run, _ in runs)      # the clean sample is decoded once per table (cached)
        print(f"`table specs/paper/{table} --check`'s preflight: {total + once:.0f} s (estimated, one H200: "
              f"{total:.0f} s on the GPU, {once:.0f} s decoding the clean sample once)")
    if json_out:
        with open(json_out, "w") as f:
            json.dump({"demo_measured": demo, "paper_estimated": paper, "decode_seconds_per_image": decode,
                       "images": images, "samples": samples,
                       "threads": threads, "device": device, "h200_fp32_eager": H200_FP32_EAGER}, f, indent=1)


if __name__ == "__main__":
    main()

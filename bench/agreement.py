"""Per-sample vote agreement of the fast variants with eager fp32 on the embedded demo models,
plus the fast path's own invariants on the GPU: repeated runs count identically, two streams
count like one, compiled noise equals the eager noise.

    python -m diffsmooth.bench.agreement --device cuda --images 20 --samples 2000 --out agreement.json
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click
import numpy as np
import torch

VARIANTS = (  # name, precision, FastPath fields (None: the device's default fast path, a "resolve" dict: its options)
    ("eager fp16", "fp16", {}),
    ("eager bf16", "bf16", {}),
    ("compiled fp16 (fast path)", "fp16", None),
    ("compiled fp16 + fused conv", "fp16", {"resolve": {"fused_conv": True}}),
)


def _fast_path(device: str, fields):
    from diffsmooth.engine.runs.fast_path import FastPath
    if fields is None:
        return FastPath.resolve(device)
    if "resolve" in fields:
        return FastPath.resolve(device, **fields["resolve"])
    return FastPath(**fields)


def _pipelines(device: str):
    from diffsmooth.engine.base_classifier.methods import MethodConfig
    from diffsmooth.engine.runs.assemble import ModelSources, build_smooth, load_models
    from diffsmooth.engine.runs.fast_path import FastPath
    config = MethodConfig("diffsmooth", 0.5, m=5, local_sigma=0.25)
    sources = ModelSources.demo()
    models = load_models(config, sources)

    def build(precision, fast):
        return build_smooth(config, sources, (1, 32, 32), 10, device=device, precision=precision, fast=fast,
                            models=models, log=lambda m: print(m, file=sys.stderr)).pipeline
    reference = build("fp32", FastPath())
    variants = [(name, build(precision, _fast_path(device, fields))) for name, precision, fields in VARIANTS]
    return reference, variants


def run(device: str = "cuda", images: int = 20, samples: int = 2000, batch: int = 1000) -> dict:
    from diffsmooth.engine.certify.noise import STREAM_SMOOTHING, gaussian
    from diffsmooth.engine.data import load_dataset
    from diffsmooth.engine.runs.fast_path import measure_agreement
    dataset = load_dataset("embedded")
    indices = [int(i * len(dataset) / images) for i in range(images)]
    reference, variants = _pipelines(device)
    rows = []
    for name, pipe in variants:
        start = time.perf_counter()
        agree = total = 0
        worst = 0.0
        for i in indices:
            r = measure_agreement(pipe, reference, dataset[i][0], i, samples, batch)
            agree, total, worst = agree + r.agree, total + r.samples, max(worst, r.max_abs_diff)
        rows.append({"variant": name, "pipeline": pipe.describe(), "samples": total, "agree": agree,
                     "agreement": agree / total, "differ": total - agree, "max_abs_score_diff": worst,
                     "seconds_incl_warmup": time.perf_counter() - start})
    fast = variants[-1][1]
    x = dataset[indices[1]][0]
    first = fast.count(x, indices[1], 0, 3 * batch + 7, batch)
    again = fast.count(x, indices[1], 0, 3 * batch + 7, batch)
    from diffsmooth.engine.certify.monte_carlo import MonteCarloPipeline
    serial = MonteCarloPipeline(fast.stages, fast.sigma, fast.seed, static_batch=True, streams=1,
                                compiled_noise=fast.compiled_noise)
    one_stream = serial.count(x, indices[1], 0, 3 * batch + 7, batch)
    eager_noise = gaussian(0, STREAM_SMOOTHING, 5, 100, batch, (1, 32, 32), device)
    compiled_noise = gaussian(0, STREAM_SMOOTHING, 5, 100, batch, (1, 32, 32), device, compiled=True)
    checks = {"repeat_identical": bool(np.array_equal(first, again)),
              "two_streams_equal_one": bool(np.array_equal(first, one_stream)),
              "votes_spread_classes": int((first > 0).sum()),
              "compiled_noise_identical": bool(torch.equal(eager_noise, compiled_noise)),
              "compiled_noise_max_abs_diff": float((eager_noise - compiled_noise).abs().max())}
    gpu = torch.cuda.get_device_name(torch.device(device)) if torch.device(device).type == "cuda" else "cpu"
    return {"device": gpu, "images": len(indices), "samples_per_image": samples, "batch": batch,
            "method": "diffsmooth sigma 0.5, m=5, sigma' 0.25 (demo models)", "rows": rows, "checks": checks}


def table(doc: dict) -> str:
    lines = [f"vote agreement with eager fp32 on {doc['device']}: {doc['images']} demo images x "
             f"{doc['samples_per_image']} samples, {doc['method']}", "",
             "| variant | agreement | samples that differ | max abs score diff |", "|---|---|---|---|"]
    for r in doc["rows"]:
        lines.append(f"| {r['variant']} | {100 * r['agreement']:.3f}% | {r['differ']} of {r['samples']} | "
                     f"{r['max_abs_score_diff']:.3g} |")
    c = doc["checks"]
    lines.append("")
    lines.append(f"fast path: repeated run identical {c['repeat_identical']}; two streams == one stream "
                 f"{c['two_streams_equal_one']} (votes over {c['votes_spread_classes']} classes); compiled noise "
                 f"identical to eager {c['compiled_noise_identical']} (max diff {c['compiled_noise_max_abs_diff']:.3g})")
    return "\n".join(lines)


@click.command()
@click.option("--device", default="cuda", show_default=True)
@click.option("--images", type=int, default=20, show_default=True)
@click.option("--samples", type=int, default=2000, show_default=True)
@click.option("--batch", type=int, default=1000, show_default=True)
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="Write the JSON here.")
def main(device, images, samples, batch, out):
    """Agreement of eager fp16/bf16 and the compiled fast path with eager fp32 (demo models)."""
    doc = run(device, images, samples, batch)
    if out:
        Path(out).write_text(json.dumps(doc, indent=1) + "\n")
    click.echo(table(doc))


if __name__ == "__main__":
    main()

"""Vote agreement of the fast variants with eager fp32 (TF32 off) on the embedded demo models, judged
like the run-time check (production counts and per-sample votes), with each variant's peak GPU
memory, plus the fast path's own invariants on the GPU: repeated runs count identically, two
streams count like one, compiled noise equals the eager noise. The JSON is rewritten after each
variant, so a step cut off by its time limit keeps what it measured.

    python -m diffsmooth.bench.agreement --device cuda --images 20 --samples 2000 --out agreement.json
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

import click
import numpy as np
import torch

from diffsmooth.engine.base_classifier.methods import MethodConfig
from diffsmooth.engine.certify.monte_carlo import MonteCarloPipeline
from diffsmooth.engine.certify.noise import STREAM_SMOOTHING, gaussian
from diffsmooth.engine.data import load_dataset
from diffsmooth.engine.demo import shipped as demo_assets
from diffsmooth.engine.errors import first_line
from diffsmooth.engine.runs.assemble import ModelSources, load_models
from diffsmooth.engine.runs.fast_path import FastPath, judge_each_configuration, production_arrays, reference_arrays
from diffsmooth.engine.runs.stage_build import build_smooth
from diffsmooth.engine.runs.vote_agreement import design_flip_rate

from .hardware import gpu_peak_memory, reset_gpu_peak_memory
from .variants import parse_variants, variant_flags

VARIANTS = (  # name, precision, FastPath fields (None: the device's default fast path, a "resolve" dict: its options)
    ("eager fp16", "fp16", {}),
    ("eager bf16", "bf16", {}),
    ("compiled fp16 (fast path)", "fp16", None),
    ("compiled fp16 + fused conv", "fp16", {"resolve": {"fused_conv": True}}),
    ("compiled bf16 (fast path)", "bf16", None),
)
DEFAULT_VARIANTS = ("eager fp16", "eager bf16", "compiled fp16 (fast path)", "compiled fp16 + fused conv")
SPEC_PRECISION = "fp16"     # the precision bench variants (--variants) are judged in: the GPU path's

def _clean_classifier() -> str:
    """The demo classifier trained on clean images (DDS's)."""
    return str(demo_assets.demo_classifier_path(0.0))


# What is smoothed (setup -> what, its method config, its model sources): DiffSmooth (the default), or DDS (m = 1,
# a classifier trained on clean images) behind the engine's UNet or diffusers' UNet2DModel; the DDS pair measured
# DDS's design flip rates and shows whether the diffusers adapter adds to them; DensePure at its defaults. Each
# variant is judged at its setup's design rate, as the run-time check is.
SETUPS = {
    "diffsmooth": ("diffsmooth sigma 0.5, m=5, sigma' 0.25 (demo models)",
                   MethodConfig("diffsmooth", 0.5, m=5, local_sigma=0.25), ModelSources.demo),
    "dds": ("dds sigma 0.5 (demo UNet, classifier trained on clean images)", MethodConfig("dds", 0.5),
            lambda: ModelSources.demo(classifier=_clean_classifier())),
    "dds-diffusers": ("dds sigma 0.5 (demo diffusers DDPM, classifier trained on clean images)", MethodConfig("dds", 0.5),
                      lambda: ModelSources(denoiser=str(demo_assets.DEMO_DDPM), stats=demo_assets.DEMO_STATS,
                                           classifier=_clean_classifier())),
    # DensePure at its defaults behind the demo UNet, the clean-image classifier: measures its design flip rates
    "densepure": ("densepure sigma 0.5, K=10, S=2 (demo UNet, classifier trained on clean images)",
                  MethodConfig("densepure", 0.5), lambda: ModelSources.demo(classifier=_clean_classifier())),
}


def _without_batch(spec: str) -> str:
    """A variant's tokens other than batch=N ('default' when nothing else is left; '' for 'default' itself,
    which is the fast path row already)."""
    kept = [t for t in spec.split("+") if not t.startswith("batch=")]
    return "" if kept in ([], ["default"]) else "+".join(kept)


def _fast_path(device: str, fields):
    if fields is None:
        return FastPath.resolve(device)
    if "resolve" in fields:
        return FastPath.resolve(device, **fields["resolve"])
    return FastPath(**fields)


def spec_name(spec: str) -> str:
    """The agreement row of a bench variant (bench/variants.py): the fp16 fast path with its changes."""
    return f"compiled fp16 + {spec}"


def _pipelines(device: str, setup: str, variants, specs: Sequence[str] = ()):
    """The eager fp32 reference and the chosen variants, built lazily (a variant is built when it is judged,
    so a step cut off by its limit has spent nothing on the ones it never reached)."""
    config = SETUPS[setup][1]
    sources = SETUPS[setup][2]()
    models = load_models(config, sources)

    def build(precision, fast):
        return build_smooth(config, sources, (1, 32, 32), 10, device=device, precision=precision, fast=fast,
                            models=models, log=lambda m: print(m, file=sys.stderr)).pipeline
    reference = build("fp32", FastPath())
    chosen = [(name, precision, lambda p=precision, f=fields: build(p, _fast_path(device, f)), None)
              for name, precision, fields in VARIANTS if name in variants]
    chosen += [(spec_name(spec), SPEC_PRECISION,
                lambda s=spec: build(SPEC_PRECISION, FastPath.resolve(device, **variant_flags(s))), spec)
               for spec in specs]
    return reference, chosen, type(models[0]).__name__ if models[0] is not None else None


def run(device: str = "cuda", images: int = 20, samples: int = 2000, batch: int = 1000,
        on_update: Optional[Callable[[dict], None]] = None, setup: str = "diffsmooth",
        variants: Optional[Sequence[str]] = None, specs: Sequence[str] = ()) -> dict:
    """The chosen variants' (default DEFAULT_VARIANTS, none when only `specs` are given) production counts
    and per-sample scores against eager fp32 (TF32 off) on the same samples of `setup`, judged like the
    run-time check; `specs`: bench variants (bench/variants.py) on the fp16 fast path, each a row named
    `compiled fp16 + SPEC` (its batch token ignored: every row runs at `batch`). `on_update(doc)` after
    each variant and the fast path's checks (run on the first compiled variant, if any)."""
    specs = tuple(dict.fromkeys(s for s in (_without_batch(spec) for spec in parse_variants(specs)) if s))
    variants = tuple(variants or (() if specs else DEFAULT_VARIANTS))
    unknown = sorted(set(variants) - {name for name, _, _ in VARIANTS})
    if unknown:
        raise click.BadParameter(f"unknown variant(s) {unknown}: pick from {[v[0] for v in VARIANTS]}")
    dataset = load_dataset("embedded")
    indices = [int(i * len(dataset) / images) for i in range(images)]
    check = [(i, dataset[i][0]) for i in indices]
    gpu = torch.cuda.get_device_name(torch.device(device)) if torch.device(device).type == "cuda" else "cpu"
    doc = {"device": gpu, "images": len(indices), "samples_per_image": samples, "batch": batch,
           "setup": setup, "method": SETUPS[setup][0],
           "reference": "eager fp32, TF32 off", "rows": [], "checks": None}
    notify = on_update or (lambda d: None)
    reference, builders, doc["denoiser"] = _pipelines(device, setup, variants, specs)
    start = time.perf_counter()
    reference_scores = reference_arrays(reference, check, samples, batch)
    doc["reference_seconds"] = time.perf_counter() - start
    built = []
    for name, precision, make, spec in builders:
        reset_gpu_peak_memory(device)
        start = time.perf_counter()
        try:
            pipe = make()
            counts, scores = production_arrays(pipe, check, samples, batch)
        except Exception as exc:            # a variant that cannot build or run: a row that says so
            doc["rows"].append({"variant": name, "spec": spec, "verdict": "FAILED",
                                "problems": [f"{type(exc).__name__}: {first_line(exc)}"]})
            notify(doc)
            continue
        built.append((name, precision, pipe))
        rate = design_flip_rate(precision, [SETUPS[setup][1].name])      # as the run-time check judges
        report = judge_each_configuration(counts, scores, reference_scores, indices, rate)
        doc["rows"].append({"variant": name, "spec": spec, "pipeline": pipe.describe(), "samples": report.compared,
                            "agree": report.agree, "agreement": report.fraction, "differ": report.flips,
                            "flip_rate": report.flips / report.compared, "count_moved": sum(report.count_moved),
                            "max_abs_score_diff": report.max_abs_diff, "budget": report.budget,
                            "design_flip_rate": rate, "verdict": "ok" if report.ok else "REFUSED",
                            "problems": report.problems, "report": report.as_dict(),
                            "peak_memory": gpu_peak_memory(device),
                            "seconds_incl_warmup": time.perf_counter() - start})
        notify(doc)
    compiled = [pipe for name, _, pipe in built if name.startswith("compiled")]
    if not compiled:
        doc["checks"] = "no compiled variant judged"
        notify(doc)
        return doc
    fast = compiled[0]
    x = dataset[indices[1]][0]
    first = fast.count(x, indices[1], 0, 3 * batch + 7, batch)
    again = fast.count(x, indices[1], 0, 3 * batch + 7, batch)
    serial = MonteCarloPipeline(fast.stages, fast.sigma, fast.seed, static_batch=True, streams=1,
                                compiled_noise=fast.compiled_noise)
    one_stream = serial.count(x, indices[1], 0, 3 * batch + 7, batch)
    eager_noise = gaussian(0, STREAM_SMOOTHING, 5, 100, batch, (1, 32, 32), device)
    compiled_noise = gaussian(0, STREAM_SMOOTHING, 5, 100, batch, (1, 32, 32), device, compiled=True)
    doc["checks"] = {"repeat_identical": bool(np.array_equal(first, again)),
                     "two_streams_equal_one": bool(np.array_equal(first, one_stream)),
                     "votes_spread_classes": int((first > 0).sum()),
                     "compiled_noise_identical": bool(torch.equal(eager_noise, compiled_noise)),
                     "compiled_noise_max_abs_diff": float((eager_noise - compiled_noise).abs().max())}
    notify(doc)
    return doc


def table(doc: dict) -> str:
    judged = ("; production counts (`count`) and per-sample votes" if "reference" in doc
              else "; per-sample votes of the serial path")
    lines = [f"vote agreement with {doc.get('reference', 'eager fp32')} on {doc['device']}: {doc['images']} demo "
             f"images x {doc['samples_per_image']} samples, {doc['method']}{judged}", "",
             "| variant | per-sample votes that differ | flip rate | production votes moved | max abs score diff | "
             "budget | verdict | peak GPU memory (alloc / reserved GiB) |", "|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        if r.get("verdict") == "FAILED":
            lines.append(f"| {r['variant']} | - | - | - | - | - | FAILED: {'; '.join(r['problems'])} | - |")
            continue
        mem = r.get("peak_memory") or {}
        memory = f"{mem['max_allocated_gib']:.2f} / {mem['max_reserved_gib']:.2f}" if mem else "-"
        rate = r.get('flip_rate', r['differ'] / r['samples'])
        lines.append(f"| {r['variant']} | {r['differ']} of {r['samples']} | {rate:.2g} | "
                     f"{r.get('count_moved', '-')} | {r['max_abs_score_diff']:.3g} | {r.get('budget', '-')} | "
                     f"{r.get('verdict', '-')} | {memory} |")
    c = doc.get("checks")
    lines.append("")
    if isinstance(c, str):
        lines.append(f"fast path invariants: not checked ({c})")
    elif c:
        lines.append(f"fast path: repeated run identical {c['repeat_identical']}; two streams == one stream "
                     f"{c['two_streams_equal_one']} (votes over {c['votes_spread_classes']} classes); compiled noise "
                     f"identical to eager {c['compiled_noise_identical']} "
                     f"(max diff {c['compiled_noise_max_abs_diff']:.3g})")
    else:
        lines.append("fast path invariants: not reached (the step stopped before them)")
    return "\n".join(lines)


@click.command()
@click.option("--device", default="cuda", show_default=True)
@click.option("--images", type=int, default=20, show_default=True)
@click.option("--samples", type=int, default=2000, show_default=True)
@click.option("--batch", type=int, default=1000, show_default=True)
@click.option("--setup", type=click.Choice(list(SETUPS)), default="diffsmooth", show_default=True,
              help="What is smoothed: the demo DiffSmooth, or DDS on the demo UNet or the demo diffusers DDPM.")
@click.option("--variant", "variants", multiple=True, type=click.Choice([v[0] for v in VARIANTS]),
              help="A variant to judge (repeatable); default: " + ", ".join(DEFAULT_VARIANTS) + ".")
@click.option("--variants", "specs", default="", metavar="SPEC[,SPEC]",
              help="Bench variants (bench/variants.py) to judge on the fp16 fast path, e.g. lean-unet,freezing.")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="Write the JSON here.")
def main(device, images, samples, batch, setup, variants, specs, out):
    """Agreement of eager fp16/bf16 and the compiled fast path with eager fp32 (demo models)."""
    def write(doc):
        if out:
            Path(out).write_text(json.dumps(doc, indent=1) + "\n")
    doc = run(device, images, samples, batch, on_update=write, setup=setup, variants=variants,
              specs=parse_variants(specs))
    click.echo(table(doc))


if __name__ == "__main__":
    main()

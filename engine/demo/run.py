"""The main job on the embedded models and data: certify K shipped test images with rs, dds
and diffsmooth at one sigma, side by side; and the purified-images figure for any model."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont

from diffsmooth.engine.base_classifier.methods import MethodConfig
from diffsmooth.engine.certify.noise import STREAM_SMOOTHING, fixed_local_noise, gaussian
from diffsmooth.engine.choices import DEFAULT_ALPHA, DEFAULT_LOCAL_SIGMA, DEFAULT_M, DEFAULT_N0, DEFAULT_SEED
from diffsmooth.engine.data import load_dataset
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.runs.analyze import DEFAULT_RADII, markdown_table, plot_curves, summarize
from diffsmooth.engine.runs.assemble import ModelSources, classifier_path_for, load_denoiser_from
from diffsmooth.engine.runs.dataset_run import Images, Jobs, run_dataset
from diffsmooth.engine.runs.fast_path import FastPath
from diffsmooth.engine.runs.locks import hold_lock
from diffsmooth.engine.runs.results import RADIUS_FORMAT, RADIUS_FORMAT_KEY, check_or_record_settings, settings_path
from diffsmooth.engine.runs.stage_build import build_smooth


def spread_indices(total: int, count: int) -> List[int]:
    """`count` indices spread evenly over range(total) (the shipped subset is in test-set order,
    so this mixes the classes)."""
    count = max(1, min(count, total))
    return sorted({int(i * total / count) for i in range(count)})


DEMO_METHODS = ("rs", "dds", "diffsmooth")     # the paper's line and its two baselines (docs/demo.md)


@dataclass(frozen=True)
class DemoRun:
    """What `run_demo` certifies: K images, the samples, alpha, sigma, sigma' and m, batch, seed, methods, where it runs."""

    images: int = 30
    n0: int = DEFAULT_N0
    n: int = 500
    alpha: float = DEFAULT_ALPHA
    sigma: float = 0.5
    m: int = DEFAULT_M
    local_sigma: float = DEFAULT_LOCAL_SIGMA
    batch: int = 200
    seed: int = DEFAULT_SEED
    methods: Sequence[str] = DEMO_METHODS
    device: str = "cpu"
    precision: str = "fp32"
    fast: Optional[FastPath] = None     # None: the device's default fast path


def run_demo(out_dir, run: DemoRun = DemoRun(), *, sources: Optional[ModelSources] = None, dataset=None,
             progress: bool = True) -> Dict:
    """Certify the same images with each method (`run`); TSVs, a markdown table and a PNG into out_dir."""
    out = Path(out_dir)
    dataset = dataset or load_dataset("embedded")
    indices = spread_indices(len(dataset), run.images)
    configs = {method: MethodConfig(method, run.sigma, m=run.m, local_sigma=run.local_sigma) for method in run.methods}
    settings = {method: dict(config.as_dict(), mode="demo", n0=run.n0, n=run.n, alpha=run.alpha, seed=run.seed,
                             images=indices, models="embedded" if sources is None else repr(sources),
                             **{RADIUS_FORMAT_KEY: RADIUS_FORMAT})
                for method, config in configs.items()}
    _refuse_other_runs(out, settings)
    for config in configs.values():             # a missing demo classifier is refused before anything is written
        classifier_path_for(config, sources or ModelSources.demo())
    out.mkdir(parents=True, exist_ok=True)
    paths, seconds = [], {}
    for method, config in configs.items():
        smooth = build_smooth(config, sources or ModelSources.demo(), tuple(dataset.image_shape),
                              dataset.num_classes, device=run.device, precision=run.precision, seed=run.seed,
                              fast=run.fast)
        path = out / f"{method}.tsv"
        with hold_lock(path):                   # one writer per result file (engine/runs/locks.py)
            check_or_record_settings(path, settings[method])
            start = time.perf_counter()
            run_dataset(smooth.pipeline, Images(dataset, indices, run.batch, progress=progress), [path],
                        Jobs("certify", run.n0, run.n, run.alpha, config.sigma))
        seconds[method] = time.perf_counter() - start
        paths.append(path)
    radii = [r for r in DEFAULT_RADII]
    summaries = [summarize(p, radii) for p in paths]
    table = markdown_table(summaries, radii, names=list(run.methods))
    plot_curves(paths, out / "certified_accuracy.png", names=list(run.methods),
                title=f"sigma={run.sigma}, n={run.n}, {len(indices)} images")
    header = (f"sigma={run.sigma}, sigma'={run.local_sigma}, m={run.m}, n0={run.n0}, n={run.n}, alpha={run.alpha}, "
              f"K={len(indices)} images, seed={run.seed}, device={run.device}, precision={run.precision}")
    (out / "summary.md").write_text(f"{header}\n\n{table}\n")
    return {"table": table, "header": header, "summaries": summaries, "seconds": seconds,
            "files": [str(p) for p in paths]}


def _refuse_other_runs(out: Path, settings: Dict[str, dict]) -> None:
    """Before anything is written: a demo folder holding rows of other settings (or rows with
    no recorded settings) is refused, so summary.md never describes rows of another run."""
    for method, wanted in settings.items():
        path = out / f"{method}.tsv"
        if settings_path(path).exists():
            check_or_record_settings(path, wanted)          # equal settings: nothing to do
        elif path.exists() and path.stat().st_size > 0:
            raise UserError(f"{path} holds rows whose settings were not recorded: use another `out`")


def _to_uint8(images: torch.Tensor, scale: int) -> np.ndarray:
    """[N,C,H,W] in [0,1] -> a row of upscaled uint8 tiles [H*scale, N*(W*scale+2), 3]."""
    x = images.clamp(0, 1).mul(255).round().to(torch.uint8)
    if x.shape[1] == 1:
        x = x.expand(-1, 3, -1, -1)
    x = x[:, :3].repeat_interleave(scale, 2).repeat_interleave(scale, 3)
    tiles = [np.pad(t.permute(1, 2, 0).numpy(), ((0, 0), (1, 1), (0, 0)), constant_values=255) for t in x]
    return np.concatenate(tiles, axis=1)


def row_labels(labels: Sequence[str], row_height: int) -> np.ndarray:
    """A white column [len(labels) * row_height, width, 3] with each row's label written in black at its
    row's middle, so the figure says which row is which without its caption."""
    font = ImageFont.load_default()
    measure = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    width = 8 + max(int(measure.textlength(text, font=font)) for text in labels)
    column = Image.new("RGB", (width, row_height * len(labels)), "white")
    draw = ImageDraw.Draw(column)
    for i, text in enumerate(labels):
        top, bottom = draw.textbbox((0, 0), text, font=font)[1::2]
        draw.text((4, i * row_height + (row_height - (bottom - top)) // 2 - top), text, fill="black", font=font)
    return np.asarray(column)


@dataclass(frozen=True)
class PurifyFigure:
    """What the purified-images figure shows: its images (columns), sigma, sigma', m locally noised rows, seed, scale."""

    images: int = 8
    sigma: float = 0.5
    local_sigma: float = 0.25
    m: int = 2
    seed: int = 0                       # of the smoothing noise (the figure's noisy row)
    scale: int = 3                      # each pixel drawn as scale x scale


@torch.inference_mode()
def purify_grid(out_png, figure: PurifyFigure = PurifyFigure(), *, sources: Optional[ModelSources] = None,
                dataset=None) -> Path:
    """One PNG: rows = clean, noisy (x + sigma*eps), one-shot denoised, denoised + sigma'*delta_i
    for the first m local noises (the paper's purified-images figure), each labelled at its left."""
    images, sigma, local_sigma, m, seed, scale = (figure.images, figure.sigma, figure.local_sigma, figure.m,
                                                  figure.seed, figure.scale)
    dataset = dataset or load_dataset("embedded")
    denoiser = load_denoiser_from(sources or ModelSources.demo())
    idx = spread_indices(len(dataset), images)
    clean = torch.stack([dataset[i][0] for i in idx])
    noise = torch.cat([gaussian(seed, STREAM_SMOOTHING, i, 0, 1, clean.shape[1:]) for i in idx])
    noisy = clean + sigma * noise
    denoised = denoiser.denoise(noisy, sigma)
    local = fixed_local_noise(m, tuple(clean.shape[1:]))
    rows = [clean, noisy, denoised] + [denoised + local_sigma * local[i] for i in range(m)]
    labels = (["clean", f"noisy, sigma {sigma:g}", "one-shot denoised"]
              + [f"denoised + sigma' {local_sigma:g} noise {i + 1}" for i in range(m)])
    tiles = np.concatenate([_to_uint8(r, scale) for r in rows], axis=0)
    canvas = np.concatenate([row_labels(labels, tiles.shape[0] // len(rows)), tiles], axis=1)
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(canvas).save(out)
    return out

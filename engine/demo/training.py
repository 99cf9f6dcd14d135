"""Training of the embedded demo models: a one-channel DDPM denoiser and Gaussian-augmented classifiers.

Everything runs on CPU with fixed seeds and fixed step counts (never time budgets), so the same
command on the same software gives the same weights; `train_demo` writes the checkpoints in the
official formats plus a `MODELS.json` manifest recording how they were made and how well they do.
"""

from __future__ import annotations

import dataclasses
import json
import math
import multiprocessing
import os
import platform
import shlex
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from diffsmooth.engine.base_classifier.denoise import PRESET_SCHEDULES, DiffusionDenoiser, load_denoiser
from diffsmooth.engine.base_classifier.schedule import DiffusionSchedule
from diffsmooth.engine.data import load_arrays, load_dataset
from diffsmooth.engine.data.idx import find_idx
from diffsmooth.engine.demo.diffusers_training import DDPM_SEED_OFFSET, DdpmTraining, save_ddpm_folder, train_diffusers_ddpm
from diffsmooth.engine.demo.train_steps import (
    ClassifierTraining,
    DenoiserTraining,
    TrainResult,
    batches,
    check_images,
    random_flip,
    sample_timesteps,
    train_with_ema,
    warmup_cosine,
)
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.hashing import sha256_file, sha256_path
from diffsmooth.engine.machine import usable_cores
from diffsmooth.engine.models.checkpoints import load_classifier, load_unet, save_cohen_checkpoint, save_unet_state
from diffsmooth.engine.models.resnet import NormalizedClassifier, build_classifier_net, normalization_layer
from diffsmooth.engine.models.shipped import DEMO_TRAINING_SIGMAS, demo_classifier_name, demo_sigmas_text
from diffsmooth.engine.models.unet import UNetConfig, UNetModel, unet_config
from diffsmooth.engine.stages.manifests import write_json

DEFAULT_DATA_DIR = "/usr/share/datasets/fashion-mnist"
CLASSIFIER_ARCH = "cifar_resnet20"
CLASSIFIER_SIGMAS = DEMO_TRAINING_SIGMAS   # the one list (models/shipped.py); append-only: seeds follow the index
# Noise levels of the denoiser's recorded metrics (one-shot MSE, one-sample DDS accuracy): the UNet's own
# evaluation grid, not the classifiers' list, so adding a classifier leaves the UNet's entry as it is.
DENOISE_EVAL_SIGMAS = (0.25, 0.5)
DDPM_EVAL_SIGMAS = (0.25, 0.5, 1.0)        # the diffusers denoiser's grid (the demo table's sigmas)
DDPM_FOLDER = "demo_ddpm_diffusers"         # the diffusers pipeline folder (engine/demo/diffusers_training.py)
EVAL_NOISE_SEED = 20230  # seed of every evaluation noise tensor (see seeded_noise)


def _set_threads(threads: Optional[int]) -> int:
    """Use `threads` intra-op threads (default: all cores this process may use)."""
    threads = threads or usable_cores()
    torch.set_num_threads(int(threads))
    return int(threads)


# --------------------------------------------------------------------------------------------
# Denoiser


def train_denoiser(images: torch.Tensor, settings: DenoiserTraining = DenoiserTraining(), *,
                   config: UNetConfig | str = "demo", schedule: DiffusionSchedule = PRESET_SCHEDULES["demo"],
                   progress: bool = True) -> TrainResult:
    """Train a noise-predicting UNet as a DDPM (MSE on eps) on [0,1] images; returns the EMA weights.

    Images are mapped to [-1,1] (2x-1) and the UNet is fed t*1000/T when the schedule rescales,
    exactly what one-shot denoising feeds it. AdamW, warmup + cosine LR, EMA with warmup
    (decay min(ema_decay, (1+n)/(10+n))); `settings`: the recipe's numbers and seed.
    """
    steps, batch_size, lr, weight_decay = settings.steps, settings.batch_size, settings.lr, settings.weight_decay
    warmup, ema_decay, grad_clip = settings.warmup, settings.ema_decay, settings.grad_clip
    focus, focus_prob, flip, seed = settings.focus, settings.focus_prob, settings.flip, settings.seed
    check_images(images, "train_denoiser")
    cfg = unet_config(config) if isinstance(config, str) else config
    if images.shape[1] != cfg.in_channels:
        raise UserError(f"train_denoiser: images have {images.shape[1]} channels, the UNet takes {cfg.in_channels}")
    torch.manual_seed(seed)                       # weight init and dropout
    gen = torch.Generator().manual_seed(seed)     # data order, flips, t and eps
    model = UNetModel(cfg).train()
    ema = UNetModel(cfg).eval()
    abar = torch.from_numpy(schedule.alphas_cumprod).float()
    t_scale = 1000.0 / schedule.num_steps if schedule.rescale_timesteps else 1.0

    def loss_of(x0):
        t = sample_timesteps(x0.shape[0], schedule.num_steps, gen, focus, focus_prob)
        eps = torch.randn(x0.shape, generator=gen)
        a = abar[t][:, None, None, None]
        x_t = a.sqrt() * x0 + (1.0 - a).sqrt() * eps
        return F.mse_loss(model(x_t, t.float() * t_scale), eps)
    start = time.perf_counter()
    losses = train_with_ema(model, ema, images, settings, gen, loss_of, "denoiser", progress)
    wall = time.perf_counter() - start
    settings = dict(optimizer="AdamW", lr=lr, weight_decay=weight_decay,
                    lr_schedule=f"linear warmup {min(warmup, max(1, steps // 5))} steps, cosine to 5%",
                    ema_decay=ema_decay, ema_warmup="decay = min(ema_decay, (1+n)/(10+n))",
                    grad_clip=grad_clip, loss="MSE between predicted and true eps",
                    data_range="x0 = 2*x - 1 in [-1, 1]", random_flip=flip,
                    timestep_input=f"t * {t_scale:g}",
                    timestep_sampling=(f"uniform integer t in [{focus[0]}, {focus[1]}) with probability "
                                       f"{focus_prob:g}, else uniform in [0, {schedule.num_steps}); "
                                       "covers t* for sigma 0.12..1.0 (573..2809)"),
                    schedule=dict(name=schedule.name, num_steps=schedule.num_steps,
                                  rescale_timesteps=schedule.rescale_timesteps),
                    seed=seed)
    return TrainResult(ema, losses, steps, min(batch_size, images.shape[0]), wall, settings)


# --------------------------------------------------------------------------------------------
# Classifiers


def train_classifier(images: torch.Tensor, labels: torch.Tensor, noise_sigma: float,
                     settings: ClassifierTraining = ClassifierTraining(), *, arch: str = CLASSIFIER_ARCH,
                     num_classes: int = 10, stats: str = "fashion-mnist", progress: bool = True) -> TrainResult:
    """Train Sequential(normalize, net) on x + noise_sigma*N(0,I) (Cohen et al.; no clamping).

    SGD with momentum, warmup + cosine LR, optional horizontal flips (`settings`; its `steps` overrides
    its `epochs`).
    """
    epochs, steps, batch_size, lr = settings.epochs, settings.steps, settings.batch_size, settings.lr
    momentum, weight_decay, warmup_fraction = settings.momentum, settings.weight_decay, settings.warmup_fraction
    flip, seed = settings.flip, settings.seed
    check_images(images, "train_classifier")
    if noise_sigma < 0:
        raise UserError(f"train_classifier: noise_sigma must be >= 0, got {noise_sigma}")
    n = images.shape[0]
    batch_size = min(batch_size, n)
    if steps is None:
        steps = max(1, int(round(epochs * (n // batch_size))))
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = NormalizedClassifier(normalization_layer("normalize", stats),
                                 build_classifier_net(arch, num_classes, images.shape[1])).train()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    warmup = max(1, int(round(warmup_fraction * steps)))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: warmup_cosine(s, steps, warmup))
    losses: list[float] = []
    correct = seen = 0
    start = time.perf_counter()
    bar = tqdm(batches(n, batch_size, steps, gen), total=steps, disable=not progress,
               desc=f"classifier s{noise_sigma:.2f}", unit="step", mininterval=5.0, dynamic_ncols=True)
    for k, idx in enumerate(bar):
        x, y = images[idx], labels[idx]
        if flip:
            x = random_flip(x, gen)
        if noise_sigma > 0:
            x = x + noise_sigma * torch.randn(x.shape, generator=gen)
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
        correct += int((logits.argmax(1) == y).sum())
        seen += len(y)
        if k % 10 == 0:
            bar.set_postfix(loss=f"{np.mean(losses[-50:]):.3f}", acc=f"{correct / seen:.3f}")
            correct = seen = 0
    bar.close()
    wall = time.perf_counter() - start
    model.eval()
    settings = dict(arch=arch, normalization=f"normalize ({stats} mean/std)", noise_sigma=noise_sigma,
                    augmentation=f"x + {noise_sigma:g} * N(0, I), no clamping"
                                 + (", random horizontal flip" if flip else ""),
                    optimizer="SGD", lr=lr, momentum=momentum, weight_decay=weight_decay,
                    lr_schedule=f"linear warmup {warmup} steps, cosine to 0",
                    epochs=round(steps * batch_size / n, 4), seed=seed)
    return TrainResult(model, losses, steps, batch_size, wall, settings)


# --------------------------------------------------------------------------------------------
# Evaluation (the manifest's numbers; a test recomputes the embedded-subset ones)


def seeded_noise(shape: Sequence[int], seed: int = EVAL_NOISE_SEED) -> torch.Tensor:
    """The evaluation noise: torch.randn(shape, generator=torch.Generator().manual_seed(seed)), float32."""
    return torch.randn(tuple(shape), generator=torch.Generator().manual_seed(int(seed)))


@torch.inference_mode()
def classifier_accuracy(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor,
                        noise_sigma: float = 0.0, seed: int = EVAL_NOISE_SEED,
                        batch_size: int = 500) -> float:
    """Top-1 accuracy on images + noise_sigma * seeded_noise(images.shape, seed) (no clamping)."""
    model.eval()
    x_all = images + noise_sigma * seeded_noise(images.shape, seed) if noise_sigma > 0 else images
    correct = 0
    for i in range(0, images.shape[0], batch_size):
        correct += int((model(x_all[i:i + batch_size]).argmax(1) == labels[i:i + batch_size]).sum())
    return correct / images.shape[0]


@torch.inference_mode()
def one_shot_denoise(denoiser: DiffusionDenoiser, images: torch.Tensor, sigma: float,
                     seed: int = EVAL_NOISE_SEED, batch_size: int = 250) -> tuple[torch.Tensor, torch.Tensor]:
    """(noisy, denoised): noisy = images + sigma * seeded_noise(images.shape, seed); denoised in [0,1]."""
    noisy = images + sigma * seeded_noise(images.shape, seed)
    out = torch.cat([denoiser.denoise(noisy[i:i + batch_size], sigma)
                     for i in range(0, images.shape[0], batch_size)])
    return noisy, out


def mse(a: torch.Tensor, b: torch.Tensor) -> float:
    """Mean squared difference over all pixels, in the images' [0,1] units."""
    return float(((a.double() - b.double()) ** 2).mean())


def model_bytes(path: Path) -> int:
    """Size of a checkpoint file, or of every file in a folder."""
    path = Path(path)
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# --------------------------------------------------------------------------------------------
# The whole demo


@dataclass(frozen=True)
class DemoBudget:
    """Step counts and batch sizes of one `train_demo` run (fixed numbers, not time limits)."""

    unet_steps: int = 300
    unet_batch_size: int = 128
    classifier_epochs: float = 1.0          # the noisy (sigma > 0) classifiers
    clean_classifier_epochs: float = 2.0    # the sigma = 0 classifier (DDS): more epochs for ~90%
    classifier_steps: Optional[int] = None  # overrides both epoch counts when given
    classifier_batch_size: int = 128
    train_limit: Optional[int] = None   # use only the first N training images (smoke tests)
    test_limit: Optional[int] = None    # evaluate on only the first N test images (smoke tests)


QUICK_BUDGET = DemoBudget(unet_steps=3, unet_batch_size=16, classifier_steps=3,
                          classifier_batch_size=16, train_limit=256, test_limit=200)


@dataclass(frozen=True)
class DemoTraining:
    """What one `train_demo` run trains and how: the data, the base seed, the budget, its processes, only missing ones."""

    data_dir: str = DEFAULT_DATA_DIR
    seed: int = 0
    budget: DemoBudget = DemoBudget()
    workers: Optional[int] = None       # training processes (None: one per core, at most 2)
    threads: Optional[int] = None       # torch threads per worker (None: cores // workers)
    only_missing: bool = False          # train only the models absent from the output folder


def _idx_hashes(data_dir: str) -> dict[str, str]:
    """sha256 of the four Fashion-MNIST IDX files (raw or .gz, whichever is present)."""
    out = {}
    for prefix, kind in (("train", "images-idx3"), ("train", "labels-idx1"),
                         ("t10k", "images-idx3"), ("t10k", "labels-idx1")):
        p = find_idx(data_dir, prefix, kind)
        out[os.path.basename(p)] = sha256_file(p)
    return out


def _load_split(data_dir: str, split: str, limit: Optional[int]):
    ds = load_dataset("idx", data_dir, split=split)
    idx = None if limit is None else list(range(min(limit, len(ds))))
    return load_arrays(ds, idx)


def _trained(res: TrainResult, threads: Optional[int], **epochs) -> dict:
    """A manifest entry's `parameters` and `training` (the recipe, then what the run did) of one trained model."""
    return dict(parameters=sum(p.numel() for p in res.model.parameters()),
                training=dict(res.settings, steps=res.steps, batch_size=res.batch_size, **epochs, threads=threads,
                              final_train_loss=res.final_loss, wall_time_s=round(res.wall_time_s, 1)))


def _train_job(job: dict) -> tuple[str, dict]:
    """Train and save one demo model (runs in a worker process or inline); returns (file, manifest entry)."""

    _set_threads(job["threads"])
    budget, out = job["budget"], Path(job["out"])
    x_train, y_train = _load_split(job["data_dir"], "train", budget.train_limit)
    n = x_train.shape[0]
    if job["kind"] == "diffusers-denoiser":
        res, scheduler = train_diffusers_ddpm(x_train, DdpmTraining(steps=budget.unet_steps, batch_size=budget.unet_batch_size,
                                                                    seed=job["seed"]), progress=job["progress"])
        save_ddpm_folder(out / DDPM_FOLDER, res.model, scheduler)
        return DDPM_FOLDER, dict(
            kind="denoiser", format="diffusers pipeline folder (DDPMPipeline.save_pretrained: model_index.json, "
                                    "unet/ with safetensors weights, scheduler/), EMA weights",
            **_trained(res, job["threads"], epochs=round(res.steps * res.batch_size / n, 4)))
    if job["kind"] == "denoiser":
        res = train_denoiser(x_train, DenoiserTraining(steps=budget.unet_steps, batch_size=budget.unet_batch_size,
                                                       seed=job["seed"]),
                             config="demo", schedule=PRESET_SCHEDULES["demo"], progress=job["progress"])
        save_unet_state(out / "demo_unet.pt", res.model)
        return "demo_unet.pt", dict(
            kind="denoiser", format="plain UNet state dict (improved-diffusion layout), EMA weights",
            preset="demo", config=dataclasses.asdict(unet_config("demo")),
            **_trained(res, job["threads"], epochs=round(res.steps * res.batch_size / n, 4)))
    s = job["sigma"]
    recipe = ClassifierTraining(epochs=budget.classifier_epochs if s > 0 else budget.clean_classifier_epochs,
                                steps=budget.classifier_steps, batch_size=budget.classifier_batch_size, seed=job["seed"])
    res = train_classifier(x_train, y_train, s, recipe, progress=job["progress"])
    name = demo_classifier_name(s)
    save_cohen_checkpoint(out / name, res.model, CLASSIFIER_ARCH,
                          epoch=int(math.ceil(res.settings["epochs"])), noise_sd=s,
                          dataset="fashion-mnist", normalization="normalize")
    return name, dict(
        kind="classifier", arch=CLASSIFIER_ARCH, noise_sigma=s, num_classes=10, in_channels=1,
        dataset_stats="fashion-mnist", normalization="normalize",
        format="Cohen-style dict {'arch', 'state_dict' (keys '1.'), 'epoch', 'noise_sd', ...}",
        **_trained(res, job["threads"]))


def _jobs(seed: int) -> list[dict]:
    """The demo's training jobs in manifest order: the UNet (seed `seed`), the classifier at each
    sigma of CLASSIFIER_SIGMAS (seed `seed + 1 + its index`: the list is append-only), then the
    diffusers DDPM (seed `seed + DDPM_SEED_OFFSET`)."""
    return [dict(name="demo_unet.pt", kind="denoiser", seed=seed)] + [
        dict(name=demo_classifier_name(s), kind="classifier", sigma=s, seed=seed + 1 + i)
        for i, s in enumerate(CLASSIFIER_SIGMAS)] + [
        dict(name=DDPM_FOLDER, kind="diffusers-denoiser", seed=seed + DDPM_SEED_OFFSET)]


def _description() -> str:
    return ("Embedded demo models of diffsmooth-engine: a 1-channel diffusion UNet (preset "
            "'demo', cosine schedule T=4000, rescaled timesteps) and cifar_resnet20 classifiers "
            f"trained with Gaussian augmentation at sigma {demo_sigmas_text(CLASSIFIER_SIGMAS)}, on Fashion-MNIST "
            "(60k train images, 28x28 zero-padded to 32x32, [0,1]); and a diffusers DDPM denoiser "
            f"({DDPM_FOLDER}/: UNet2DModel + DDPMScheduler, cosine, 1000 steps) trained on the same images.")


def _kept_manifest(out: Path, present: list[str], jobs: list[dict], seed: int, budget: DemoBudget,
                   hashes: dict[str, str]) -> dict:
    """The MODELS.json recording the models already in `out` (--only-missing), checked to match this run:
    same seed, budget and data, and every present file the one its entry records (sha256)."""
    path = out / "MODELS.json"
    if not path.exists():
        raise UserError(f"--only-missing: {out} holds {', '.join(present)} but no MODELS.json recording them; "
                        f"remove them or run without --only-missing")
    old = json.loads(path.read_text())
    if old.get("seed") != seed:
        raise UserError(f"--only-missing: {path} was made with --seed {old.get('seed')}, not {seed}")
    want = json.loads(json.dumps(dataclasses.asdict(budget)))
    if old.get("budget") != want:
        diff = ", ".join(f"{k} {old.get('budget', {}).get(k)!r} (recorded) != {v!r}" for k, v in want.items()
                         if old.get("budget", {}).get(k) != v)
        raise UserError(f"--only-missing: the budget differs from the one {path} records ({diff}); "
                        f"give the recorded options")
    if old.get("data", {}).get("sha256") != hashes:
        raise UserError(f"--only-missing: the data files' sha256 differ from those {path} records "
                        f"({old.get('data', {}).get('sha256')} != {hashes})")
    seeds = {job["name"]: job["seed"] for job in jobs}
    for name in present:
        entry = old.get("models", {}).get(name)
        if entry is None:
            raise UserError(f"--only-missing: {out / name} is not recorded in {path}")
        if entry.get("sha256") != sha256_path(out / name):
            raise UserError(f"--only-missing: {out / name} is not the file {path} records (sha256 differs)")
        if old.get("seeds", {}).get(name) != seeds[name]:
            raise UserError(f"--only-missing: {path} records seed {old.get('seeds', {}).get(name)} for {name}, "
                            f"the seed scheme gives {seeds[name]} (DEMO_TRAINING_SIGMAS may only be appended to)")
    return old


def train_demo(out_dir, training: DemoTraining = DemoTraining(), *, command: Optional[str] = None,
               progress: bool = True,
               log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True)) -> dict:
    """Train the demo UNet and the classifiers at DEMO_TRAINING_SIGMAS, write them and MODELS.json into out_dir.

    The trainings (`training`: the data, seed, budget and processes) are independent jobs run by its
    `workers` processes (default: one per core, at most 2) with `threads` torch threads each (default:
    cores // workers); each job is seeded and single-process, so its result does not depend on the
    scheduling. Seeds: UNet `seed`, classifier at sigma s `seed + 1 + i` (i = index of s in DEMO_TRAINING_SIGMAS).

    only_missing: train only the models whose files are absent from out_dir; the present ones are
    neither retrained nor rewritten (they must be the files out_dir/MODELS.json records, made with the
    same seed, budget and data), and the new models' entries are merged into that MODELS.json, with the
    run recorded under `only_missing_runs`. Nothing missing: nothing is written.
    Returns the manifest (also written as out_dir/MODELS.json).
    """

    data_dir, seed, budget, only_missing = training.data_dir, training.seed, training.budget, training.only_missing
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cores = usable_cores()
    workers = int(training.workers or max(1, min(2, cores)))
    threads = int(training.threads or max(1, cores // workers))
    t_all = time.perf_counter()
    log(f"train-demo: data {data_dir}, out {out}, seed {seed}, {workers} worker(s) x {threads} "
        f"thread(s), {budget}" + (", only missing models" if only_missing else ""))
    hashes = _idx_hashes(data_dir)
    jobs = _jobs(seed)
    old: Optional[dict] = None
    if only_missing:
        present = [job["name"] for job in jobs if (out / job["name"]).exists()]
        if present:
            old = _kept_manifest(out, present, jobs, seed, budget, hashes)
            log(f"keeping {', '.join(present)} (unchanged)")
        jobs = [job for job in jobs if job["name"] not in present]
        if not jobs:
            log(f"nothing missing in {out}: nothing trained, nothing written")
            return old
    for job in jobs:
        job.update(threads=threads, budget=budget, out=str(out), data_dir=str(data_dir),
                   progress=progress)
    models = _run_jobs(jobs, workers, log)
    _set_threads(threads)
    data = _EvaluationData.read(data_dir, budget)
    log("evaluating ...")
    t_eval = time.perf_counter()
    _evaluate(models, out, data, log)
    eval_wall = time.perf_counter() - t_eval

    for name in models:
        models[name]["file_bytes"] = model_bytes(out / name)
        models[name]["sha256"] = sha256_path(out / name)
    software = dict(python=platform.python_version(), torch=torch.__version__,
                    numpy=np.__version__, workers=workers, threads_per_worker=threads,
                    machine=platform.machine())
    if old is None:
        manifest = _new_manifest(training, out, command, data, hashes, models,
                                 dict(workers=workers, threads=threads, software=software, eval_wall=eval_wall,
                                      started=t_all))
    else:
        manifest = _merged_manifest(old, models, out, data_dir, seed, budget, dict(
            command=command or _equivalent_command(data_dir, out, seed, budget, workers, threads, only_missing=True),
            equivalent_command=_equivalent_command(data_dir, out, seed, budget, workers, threads, only_missing=True),
            models=list(models), software=software, evaluation_wall_time_s=round(eval_wall, 1),
            total_wall_time_s=round(time.perf_counter() - t_all, 1)))
    write_json(out / "MODELS.json", manifest, indent=2)
    log(f"wrote {out / 'MODELS.json'} ({time.perf_counter() - t_all:.0f} s in all)")
    return manifest


def _run_jobs(jobs: list, workers: int, log: Callable[[str], None]) -> dict:
    """Every training job, on `workers` spawned processes (or here); {file name: its manifest entry}."""
    if workers == 1 or len(jobs) == 1:
        results = [_train_job(job) for job in jobs]
    else:
        with ProcessPoolExecutor(min(workers, len(jobs)), mp_context=multiprocessing.get_context("spawn")) as pool:
            results = list(pool.map(_train_job, jobs))
    models: dict[str, dict] = dict(results)
    for name, entry in models.items():
        log(f"{name}: {entry['training']['steps']} steps in {entry['training']['wall_time_s']:.0f} s, "
            f"final loss {entry['training']['final_train_loss']:.4f}")
    return models


@dataclass(frozen=True)
class _EvaluationData:
    """The images the trained models are evaluated on: the test split (its `test_limit`) and the embedded subset
    (a smoke test's test_limit limits this subset's metrics too); `n_train`: the training images used."""

    x_test: torch.Tensor
    y_test: torch.Tensor
    x_sub: torch.Tensor
    y_sub: torch.Tensor
    n_train: int

    @classmethod
    def read(cls, data_dir, budget: DemoBudget) -> "_EvaluationData":
        n_train = len(load_dataset("idx", data_dir, split="train"))
        x_test, y_test = _load_split(data_dir, "test", budget.test_limit)
        embedded = load_dataset("embedded")
        x_sub, y_sub = load_arrays(embedded, None if budget.test_limit is None else
                                   list(range(min(budget.test_limit, len(embedded)))))
        return cls(x_test, y_test, x_sub, y_sub, min(n_train, budget.train_limit or n_train))


def _evaluate(models: dict, out: Path, data: _EvaluationData, log: Callable[[str], None]) -> None:
    """The metrics of the models trained now, read back through the project's loaders, into their entries."""
    x_test, y_test, x_sub, y_sub = data.x_test, data.y_test, data.x_sub, data.y_sub
    schedule = PRESET_SCHEDULES["demo"]
    unet_path = out / "demo_unet.pt"
    for s in CLASSIFIER_SIGMAS:
        if demo_classifier_name(s) not in models:
            continue
        clf = load_classifier(out / demo_classifier_name(s), dataset="fashion-mnist")
        models[demo_classifier_name(s)]["metrics"] = dict(
            test_clean_accuracy=classifier_accuracy(clf, x_test, y_test),
            test_noisy_accuracy=classifier_accuracy(clf, x_test, y_test, s) if s > 0 else None,
            embedded_clean_accuracy=classifier_accuracy(clf, x_sub, y_sub),
            embedded_noisy_accuracy=classifier_accuracy(clf, x_sub, y_sub, s) if s > 0 else None)
        log(f"classifier s{s:.2f}: {models[demo_classifier_name(s)]['metrics']}")
    if "demo_unet.pt" in models:
        clean = load_classifier(out / demo_classifier_name(0.0), dataset="fashion-mnist")
        denoiser = DiffusionDenoiser(load_unet(unet_path, "demo"), schedule)
        dmetrics = {}
        for s in DENOISE_EVAL_SIGMAS:
            noisy, den = one_shot_denoise(denoiser, x_sub, s)
            t_noisy, t_den = one_shot_denoise(denoiser, x_test, s)
            dmetrics[f"{s:.2f}"] = dict(
                t_star=schedule.timestep(s), model_timestep=schedule.coefficients(s).model_timestep,
                embedded_denoised_mse=mse(den, x_sub), embedded_noisy_mse=mse(noisy, x_sub),
                embedded_dds_accuracy_s0_00=classifier_accuracy(clean, den, y_sub),
                embedded_noisy_accuracy_s0_00=classifier_accuracy(clean, noisy, y_sub),
                test_denoised_mse=mse(t_den, x_test), test_noisy_mse=mse(t_noisy, x_test),
                test_dds_accuracy_s0_00=classifier_accuracy(clean, t_den, y_test))
            log(f"denoiser sigma {s}: {dmetrics[f'{s:.2f}']}")
        models["demo_unet.pt"]["metrics"] = dmetrics
    if DDPM_FOLDER in models:
        models[DDPM_FOLDER]["metrics"] = _ddpm_metrics(out, x_sub, y_sub, x_test, y_test)
        models[DDPM_FOLDER]["evaluation"] = (
            "load_denoiser(folder).denoise(noisy, sigma) and, for *_demo_unet_*, the demo UNet on the same noisy "
            "images; noise, MSE and DDS accuracy as in `evaluation` above")
        log(f"diffusers denoiser: {models[DDPM_FOLDER]['metrics']}")


def _new_manifest(training: DemoTraining, out: Path, command: Optional[str], data: _EvaluationData, hashes: dict,
                  models: dict, run: dict) -> dict:
    """MODELS.json of a fresh training: how to run it again, the data, how the models were evaluated, the models.
    `run`: the processes (workers, threads), software, evaluation seconds and the training's start time."""
    data_dir, seed, budget = training.data_dir, training.seed, training.budget
    workers, threads, eval_wall, t_all = run["workers"], run["threads"], run["eval_wall"], run["started"]
    software = run["software"]
    equivalent = _equivalent_command(data_dir, out, seed, budget, workers, threads, only_missing=training.only_missing)
    return dict(
            description=_description(),
            command=command or equivalent,
            equivalent_command=equivalent,
            seed=seed,
            seeds={job["name"]: job["seed"] for job in _jobs(seed)},
            budget=dataclasses.asdict(budget),
            data=dict(directory=str(data_dir), sha256=hashes, train_images=data.n_train,
                      test_images=int(data.x_test.shape[0]),
                      preprocessing="uint8/255, zero-pad 28x28 -> 32x32 (load_dataset('idx', dir, split))",
                      embedded_subset="load_dataset('embedded'): 500 test images, first 50 per class"
                      + ("" if budget.test_limit is None else f" (metrics on its first {int(data.x_sub.shape[0])})")),
            evaluation=dict(
                noise=("noisy = images + sigma * torch.randn(images.shape, generator="
                       f"torch.Generator().manual_seed({EVAL_NOISE_SEED})) on the whole [N,1,32,32] "
                       "set at once, no clamping (training.seeded_noise); the same seed for every sigma"),
                noise_seed=EVAL_NOISE_SEED,
                accuracy="top-1 of the checkpoint loaded with load_classifier(path, dataset='fashion-mnist')",
                denoise=("DiffusionDenoiser(load_unet(path, 'demo'), PRESET_SCHEDULES['demo']).denoise(noisy, "
                         "sigma); MSE = mean over all pixels of (denoised - clean)^2 in [0,1] units"),
                dds_accuracy="s0.00 classifier on the one-shot-denoised images (one sample of DDS)",
                wall_time_s=round(eval_wall, 1)),
            software=software,
            total_wall_time_s=round(time.perf_counter() - t_all, 1),
            models=models)


def _ddpm_metrics(out: Path, x_sub, y_sub, x_test, y_test) -> dict:
    """The diffusers denoiser's one-shot MSE and one-sample DDS accuracy (s0.00 classifier) at each sigma of
    DDPM_EVAL_SIGMAS, read back with load_denoiser, beside the demo UNet's on the same noise."""
    clean = load_classifier(out / demo_classifier_name(0.0), dataset="fashion-mnist")
    ddpm = load_denoiser(out / DDPM_FOLDER)
    unet = DiffusionDenoiser(load_unet(out / "demo_unet.pt", "demo"), PRESET_SCHEDULES["demo"])
    metrics = {}
    for s in DDPM_EVAL_SIGMAS:
        row = dict(t_star=int(ddpm.timestep(s)))
        for name, images, labels in (("embedded", x_sub, y_sub), ("test", x_test, y_test)):
            noisy, den = one_shot_denoise(ddpm, images, s)
            _, reference = one_shot_denoise(unet, images, s)
            row.update({f"{name}_denoised_mse": mse(den, images), f"{name}_noisy_mse": mse(noisy, images),
                        f"{name}_dds_accuracy_s0_00": classifier_accuracy(clean, den, labels),
                        f"{name}_demo_unet_denoised_mse": mse(reference, images),
                        f"{name}_demo_unet_dds_accuracy_s0_00": classifier_accuracy(clean, reference, labels)})
        metrics[f"{s:.2f}"] = row
    return metrics


def _merged_manifest(old: dict, new_models: dict[str, dict], out: Path, data_dir, seed: int,
                     budget: DemoBudget, run: dict) -> dict:
    """`old` with `new_models` merged in (manifest order: the UNet, then the classifiers by sigma) and `run`
    appended to `only_missing_runs`. The kept models' entries stay as they are; the description lists the
    sigmas now shipped, and `command` / `equivalent_command` become the full command that trains every
    model listed from scratch (same seeds and budget, the original run's workers and threads)."""
    manifest = dict(old)
    software = old.get("software", {})
    full = _equivalent_command(data_dir, out, seed, budget, software.get("workers", run["software"]["workers"]),
                               software.get("threads_per_worker", run["software"]["threads_per_worker"]))
    order = [job["name"] for job in _jobs(seed)]
    models = {name: new_models.get(name, old["models"].get(name)) for name in order
              if name in new_models or name in old["models"]}
    models.update({k: v for k, v in old["models"].items() if k not in models})
    manifest.update(
        description=_description(), command=full, equivalent_command=full,
        command_note=("command / equivalent_command train every model listed here from scratch (same seeds, "
                      "budget and data); only_missing_runs lists the `train-demo --only-missing` runs that "
                      "added models to the files of an earlier run (its command, software and wall times)"),
        seeds={name: job_seed for name, job_seed in
               ((job["name"], job["seed"]) for job in _jobs(seed)) if name in models},
        only_missing_runs=[*old.get("only_missing_runs", []), run])
    manifest.pop("models")
    manifest["models"] = models        # the models stay the last, longest field
    return manifest


def _equivalent_command(data_dir, out, seed: int, budget: DemoBudget, workers: int, threads: int,
                        only_missing: bool = False) -> str:
    """The `diffsmooth train-demo` command line that reproduces this run."""
    args = ["diffsmooth", "train-demo", *(["--only-missing"] if only_missing else []),
            "--data", str(data_dir), "--out", str(out), "--seed", str(seed),
            "--unet-steps", str(budget.unet_steps), "--unet-batch-size", str(budget.unet_batch_size),
            "--classifier-epochs", f"{budget.classifier_epochs:g}",
            "--clean-classifier-epochs", f"{budget.clean_classifier_epochs:g}",
            *(["--classifier-steps", str(budget.classifier_steps)] if budget.classifier_steps else []),
            "--classifier-batch-size", str(budget.classifier_batch_size),
            "--workers", str(workers), "--threads", str(threads)]
    if budget.train_limit is not None:
        args += ["--train-limit", str(budget.train_limit)]
    if budget.test_limit is not None:
        args += ["--test-limit", str(budget.test_limit)]
    return shlex.join(args)

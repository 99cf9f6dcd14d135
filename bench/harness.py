"""The benchmark run: build a model set, count its FLOPs, time the engine stage by stage at a
small n, extrapolate to the requested n, and time a reference-structured baseline side by side
on the same models. Returns one JSON-ready document (see `run_bench`)."""

from __future__ import annotations

import datetime
import gc
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import torch
from tqdm import tqdm

from diffsmooth.engine.backends.registry import stage_backend
from diffsmooth.engine.backends.tensorrt.backend import TensorRTBackend
from diffsmooth.engine.backends.tensorrt.runner import tensorrt_available
from diffsmooth.engine.backends.torch.backend import TorchBackend
from diffsmooth.engine.backends.torch.runner import resolve_device
from diffsmooth.engine.backends.torch.stages import score_module
from diffsmooth.engine.base_classifier.methods import MethodConfig, method_named
from diffsmooth.engine.certify.cohen import certify_from_counts
from diffsmooth.engine.certify.jobs import Request
from diffsmooth.engine.certify.monte_carlo import MonteCarloPipeline
from diffsmooth.engine.choices import GRAPH_PRECISIONS
from diffsmooth.engine.errors import first_line
from diffsmooth.engine.runs.assemble import ModelSources
from diffsmooth.engine.runs.fast_path import FastPath
from diffsmooth.engine.runs.fast_path_options import FAST_PATH_OPTIONS, AskedFastPath
from diffsmooth.engine.runs.results import ResultWriter, format_radius, format_time
from diffsmooth.engine.runs.stage_build import StageBuild

from ..export.trt_build import build_engine_files, current_target
from .compare import compare_rows
from .flops import CONVENTION, stage_flops
from .hardware import gpu_peak_memory, machine_info, peak_flops, reset_gpu_peak_memory
from .kernel_profile import profile_pipeline
from .models import SET_SPECS, bench_images, build_model_set
from .reference_equivalent import build_reference, official_cudnn_benchmark
from .report import plot_sweep
from .timing import STAGE_NAMES, StageClock, extrapolation_table, make_timed_pipeline, split_fractions, synchronize, timed_noise
from .variants import parse_variant, parse_variants

SCHEMA = "diffsmooth-bench/1"
STANDARD_NS = (10_000, 100_000)
EXTRAPOLATION_NOTE = ("seconds per certified image are measured at a small n and extrapolated linearly in "
                      "Monte Carlo samples: (n0 + n) x measured seconds per sample + measured per-image "
                      "statistics and row-write time")
SWEEP_DEFAULTS = {"demo": ((25, 50, 100, 200, 400), (1, 3, 5, 11, 21)),
                  "cifar10": ((25, 50, 100), (1, 5)),
                  "imagenet": ((2, 4), (1, 5))}


@dataclass
class BenchSettings:
    """Every knob of one benchmark run; None fields take the model set's defaults (models.SET_SPECS)."""

    models: str = "demo"
    method: str = "diffsmooth"
    sigma: float = 0.5
    n0: int = 100
    n: Optional[int] = None
    m: int = 5
    local_sigma: float = 0.25
    local_noise: str = "fixed"
    method_options: Tuple[Tuple[str, str], ...] = ()    # the method's own settings (`--option NAME=VALUE`)
    alpha: float = 0.001
    batch: Optional[int] = None
    backends: Tuple[str, ...] = ("torch",)
    precisions: Tuple[str, ...] = ("fp32",)
    device: str = "cpu"
    images: int = 1
    measure_n: Optional[int] = None
    reference: bool = True
    reference_batch: int = 50
    compare: bool = False
    peak_tflops: Optional[float] = None
    sweep: bool = False
    sweep_batches: Tuple[int, ...] = ()
    sweep_ms: Tuple[int, ...] = ()
    sweep_n: Optional[int] = None
    plot: Optional[str] = None
    seed: int = 0
    threads: Optional[int] = None
    unet_overrides: Dict = field(default_factory=dict)
    arch: Optional[str] = None
    denoiser: Optional[str] = None          # a diffusers folder instead of the set's UNet
    scheduler: Optional[str] = None         # its scheduler folder, for a UNet folder
    measure_cpu_peak: bool = True
    progress: bool = True
    # the torch backend's fast path (engine/runs/fast_path_options.py; None: its default, on for CUDA)
    asked_fast_path: AskedFastPath = AskedFastPath()
    profile: Optional[str] = None           # folder for the kernel profile (bench/kernel_profile.py)
    variants: Tuple[str, ...] = ()          # measure each named variant in turn (bench/variants.py); () one run
    deadline_s: Optional[float] = None      # start no variant that would end past this many seconds

    def resolved(self) -> "BenchSettings":
        """A copy with the model set's defaults filled in; the values were checked by `diffsmooth bench`'s option
        types (diffsmooth/cli/param_types.py), the fast-path settings are checked here."""
        spec = SET_SPECS[self.models]
        cuda = str(self.device).startswith("cuda")
        def given(value, default):              # 0 is refused by the option types, not taken for "not given"
            return default if value is None else value
        s = replace(self, n=given(self.n, spec["n"]), batch=given(self.batch, spec["batch_cuda" if cuda else "batch"]),
                    measure_n=given(self.measure_n, spec["measure_n_cuda" if cuda else "measure_n"]))
        batches, ms = SWEEP_DEFAULTS[self.models]
        s = replace(s, sweep_batches=tuple(self.sweep_batches or batches),
                    sweep_ms=tuple(self.sweep_ms or (ms if _takes_m(self.method) else (s.m,))))
        s = replace(s, variants=parse_variants(s.variants))
        s.fast_path()                            # refuses settings that cannot go together, in one line
        for spec in s.variants:
            s.for_variant(spec, False).fast_path()
        return s

    def fast_path(self):
        """The torch backend's fast-path settings for this run."""
        return FastPath.asked_by(self, self.device)

    def for_variant(self, spec: str, first: bool) -> "BenchSettings":
        """These settings with a variant's changes on top (bench/variants.py); the reference-equivalent
        baseline and the kernel profile only with the first variant measured."""
        changes = parse_variant(spec)
        batch = changes.pop("batch", self.batch)
        if "inductor" in changes:
            changes["inductor"] = tuple(sorted({*(self.asked_fast_path.inductor or ()), *changes["inductor"]}))
        return replace(self, batch=batch, asked_fast_path=self.asked_fast_path.replace(**changes), variants=(),
                       reference=self.reference and first, profile=self.profile if first else None)

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(d.pop("asked_fast_path"))         # recorded flat, as before the settings were one object
        d["backends"], d["precisions"] = list(self.backends), list(self.precisions)
        d["sweep_batches"], d["sweep_ms"] = list(self.sweep_batches), list(self.sweep_ms)
        for key in ("progress", "measure_cpu_peak"):
            d.pop(key)
        d["fast_path"] = self.fast_path().as_dict()
        if not self.unet_overrides:
            d.pop("unet_overrides")
        for key in ("arch", "denoiser", "scheduler"):
            if d[key] is None:
                d.pop(key)
        for key in (*(o.name for o in FAST_PATH_OPTIONS if o.variant), "variants", "deadline_s"):
            if not d[key]:
                d.pop(key)
            elif isinstance(d[key], tuple):
                d[key] = list(d[key])
        return d


def _progress(iterable, settings: BenchSettings, **kw):
    if not settings.progress:
        return iterable
    return tqdm(iterable, file=sys.stderr, dynamic_ncols=True, leave=False, **kw)


def _takes_m(method: str) -> bool:
    """Whether the method has the setting m (`--m` and the sweep over m apply to it)."""
    return "m" in {o.name for o in method_named(method).options}


def _method_config(settings: BenchSettings, m: Optional[int] = None):
    return MethodConfig(settings.method, settings.sigma, m or settings.m, settings.local_sigma, settings.local_noise,
                        options=settings.method_options)        # m, sigma', local noise: aliases (OPTION_ALIASES)


def count_model_flops(model_set, settings: BenchSettings, m: Optional[int] = None) -> dict:
    """FLOPs per Monte Carlo sample of the denoiser stage and of the classifier stage (incl. m)."""
    config = _method_config(settings, m)
    shape = model_set.image_shape
    batch = max(2, int(settings.batch or 2))        # the lean UNet computes t*'s embedding once per batch
    # the one-shot purifier's FLOPs per UNet call, times the method's UNet calls per sample (a reverse chain's
    # elementwise steps are left out: under 0.1% of a UNet call)
    lean = bool(settings.asked_fast_path.lean_unet)
    den, den_ops = (stage_flops(model_set.denoiser.purifier(settings.sigma, lean=lean), shape, batch=batch if lean else 2)
                    if config.purifier.denoises else (0, {}))
    unet_calls = config.purifier.unet_calls()
    den *= max(1, unet_calls)
    head = score_module(config, model_set.classifier, shape)
    extra = [config.head.fresh_noise_shape(shape)] if getattr(head, "takes_noise", False) else []
    cls, cls_ops = stage_flops(head, config.purifier.purified_shape(shape) or shape, extra)
    calls = config.method.classifier_calls(config)
    return {
        "convention": CONVENTION,
        "denoiser_per_sample": den,
        "classifier_per_sample": cls,
        "classifier_per_call": cls // calls,
        "classifier_calls_per_sample": calls,
        "unet_calls_per_sample": unet_calls,
        "total_per_sample": den + cls,
        "denoiser_share": den / (den + cls) if den + cls else 0.0,
        "by_op": {"denoiser": den_ops, "classifier": cls_ops},
    }


def build_stages(backend: str, precision: str, model_set, settings: BenchSettings, m: Optional[int] = None,
                 workdir: Optional[str] = None):
    """BaseClassifierStages on the requested backend; raises _Skip with the reason when unavailable."""
    config = _method_config(settings, m)
    if precision != "fp32" and torch.device(settings.device).type != "cuda":
        raise _Skip(f"precision {precision} runs only on CUDA devices (device is {settings.device})")
    build = StageBuild(device=settings.device, precision=precision, batch=settings.batch, onnx_dir=workdir,
                       threads=settings.threads, log=lambda message: print(message, file=sys.stderr),
                       fast=settings.fast_path() if stage_backend(backend).runs_modules else FastPath())
    runner = stage_backend(backend)
    if isinstance(runner, TorchBackend):         # the model set's loaded modules
        return runner.from_models(config, model_set.classifier, model_set.denoiser, model_set.image_shape,
                                  model_set.num_classes, build)
    if isinstance(runner, TensorRTBackend):
        ok, why = tensorrt_available()
        if not ok:
            raise _Skip(why)
    else:
        try:
            import onnxruntime  # noqa: F401
        except ImportError as exc:
            raise _Skip(f"onnxruntime backend not available ({exc})") from None
    if precision not in GRAPH_PRECISIONS:
        raise _Skip(f"{backend} runs the exported fp32 or fp16 graphs, not {precision}")
    try:
        _export_graphs(config, precision, model_set, workdir)
        if isinstance(runner, TensorRTBackend):      # engine files for settings.batch (not vote-validated: build-engine does)
            build_engine_files(workdir, current_target(settings.device), batch=settings.batch, precisions=(precision,),
                        echo=lambda line: print(line, file=sys.stderr))
        return runner.stages(config, ModelSources(), model_set.image_shape, model_set.num_classes, build)
    except Exception as exc:  # the exported backends are optional: any failure to export/build/load is a skip
        raise _Skip(f"{backend} graphs could not be exported/built/loaded: {first_line(exc)}") from None


def _export_graphs(config, precision, model_set, workdir) -> None:
    """The ONNX graphs of the model set for `precision` into workdir (for the exported backends)."""
    # onnx_export imports onnx (optional): only the onnxruntime/tensorrt backends need it, so not at the top
    from ..export.onnx_export import export_models
    export_models(config, model_set.image_shape, workdir, denoiser=model_set.denoiser,
                  classifier=model_set.classifier, fp16=precision == "fp16",
                  preset=None if model_set.weights == "diffusers folder" else SET_SPECS[model_set.name]["preset"])


def engine_seconds_table(measured: dict, settings: BenchSettings, ns) -> Dict[str, float]:
    """Seconds per image at each target n in a run over many images: n0 + n computed samples each
    (the scheduler packs images into every batch, so only the run's last batch is padded) times the
    measured cost per computed sample, plus fixed costs."""
    return {str(int(n)): measured["per_computed_sample_s"] * (settings.n0 + int(n)) + measured["per_image_fixed_s"]
            for n in ns}


def _selection_and_estimation(n0: int, n: int):
    """A job returning CERTIFY's two count vectors of the one configuration (samples 0..n0-1 and n0..n0+n-1)."""
    selection, estimation = yield Request(0, n0), Request(n0, n)
    return selection[0], estimation[0]


def computed_samples(n0: int, n: int, batch: int, static: bool) -> int:
    """Samples CERTIFY computes for one image run alone: static batches compute whole batches and
    its n0 + n samples are asked for at once, so they take ceil((n0 + n) / batch) batches (a
    packed run over many images pads only the last batch of the run)."""
    return -(-(n0 + n) // batch) * batch if static else n0 + n


class _Skip(Exception):
    """A backend/precision combination that cannot run here; the message says why."""


@dataclass
class _Timed:
    """What one measurement runs on: the timed pipeline and its clock, the baseline (or None), the samples
    measured per image, the batches and the baseline's interleaving chunk."""

    stages: object
    pipe: MonteCarloPipeline
    clock: StageClock
    reference: object
    settings: BenchSettings
    fast: object
    n0: int
    n: int
    chunk: int

    @property
    def device(self):
        return self.stages.device

    @property
    def static(self) -> bool:
        return bool(self.fast and self.fast.static_batch)


def measure(stages, model_set, images, settings: BenchSettings, reference=None,
            fast=None) -> Tuple[dict, Optional[dict]]:
    """Certify each image at (n0_measured, n_measured) with timed engine stages (see timing.py) and,
    when `reference` is given, run the reference-equivalent baseline on the same samples interleaved
    chunk by chunk in alternating order (ABBA), so both see the same machine load.

    Returns (engine measurement, reference measurement or None)."""
    clock = StageClock(stages.device)
    pipe = make_timed_pipeline(stages, settings.sigma, settings.seed, clock, static_batch=bool(fast and fast.static_batch),
                               compiled_noise=bool(fast and fast.compiled_noise),
                               classifier_batch=fast.classifier_batch if fast else None)
    n0m, nm = min(settings.n0, settings.measure_n), settings.measure_n
    chunk = max(settings.batch, settings.reference_batch) if reference is not None else max(n0m, nm)
    timed = _Timed(stages, pipe, clock, reference, settings, fast, n0m, nm, chunk)
    first_batch_s, ref_first_batch_s, memory = _warm_up(timed, images[0][0])
    computed_before = pipe.samples_computed
    count_s, ref_s, predictions, ref_counts = _timed_images(timed, model_set, images)
    stage_s = {name: float(clock.seconds.get(name, 0.0)) for name in STAGE_NAMES}
    stage_s["vote_count"] = max(0.0, count_s - stage_s["noise"] - stage_s["denoise"] - stage_s["classify"])
    pipeline_s, rate_source = count_s, "timed pass (no extra syncs on CPU)"
    if stages.device.type == "cuda":      # timers synchronise per stage: measure the plain pipeline too
        pipeline_s, computed = _plain_pass(timed, images, memory)
        rate_source = "separate pass without stage timers"
    else:
        computed = pipe.samples_computed - computed_before
    expected = len(images) * computed_samples(n0m, nm, settings.batch, timed.static)
    if computed != expected:            # the extrapolation assumes what this measured pass computed
        raise RuntimeError(f"bench: the pipeline computed {computed} samples, the extrapolation assumes {expected}")
    samples = len(images) * (n0m + nm)
    engine = {
        "images": len(images),
        "n0_measured": n0m,
        "n_measured": nm,
        "samples": samples,
        "batch": settings.batch,
        "interleave_chunk": chunk if reference is not None else None,
        "first_batch_s": first_batch_s,
        "stage_seconds": stage_s,
        "stage_fraction": split_fractions(stage_s),
        "count_seconds": count_s,
        "seconds_per_image_measured": (count_s + stage_s["statistics"] + stage_s["io"]) / len(images),
        "pipeline_seconds": pipeline_s,
        "pipeline_rate_source": rate_source,
        "static_batch": timed.static,
        "samples_computed": computed,
        "per_sample_s": pipeline_s / samples,
        "per_computed_sample_s": pipeline_s / computed,
        "per_image_fixed_s": (stage_s["statistics"] + stage_s["io"]) / len(images),
        "predictions": predictions,
        "memory_phases": memory,
    }
    ref = _reference_doc(timed, samples, ref_s, ref_first_batch_s, ref_counts) if reference is not None else None
    return engine, ref


def _warm_up(timed: _Timed, x0) -> Tuple[float, Optional[float], dict]:
    """One batch of each side before the timed passes (the engine's compile, autotuning and graph capture):
    (engine's first batch s, baseline's first batch s or None, peak memory of the warm-up)."""
    settings, device = timed.settings, timed.device
    if timed.fast and timed.fast.compile:
        print(f"# warming up the compiled fast path ({timed.stages.describe()}): the first run compiles "
              f"(about a minute per stage on a GPU; cached on disk for the next run)", file=sys.stderr)
    start = time.perf_counter()
    with timed_noise(timed.clock):
        timed.pipe.count(x0, 0, 0, min(settings.batch, timed.n0 + timed.n), settings.batch)
    synchronize(device)
    first_batch_s = time.perf_counter() - start
    memory = {"warmup": gpu_peak_memory(str(device))}      # build, compile, autotuning, graph capture
    reset_gpu_peak_memory(str(device))
    timed.clock.reset()
    ref_first_batch_s = None
    if timed.reference is not None:
        start = time.perf_counter()
        timed.reference.count(x0, min(settings.reference_batch, timed.n0 + timed.n), settings.reference_batch)
        synchronize(device)
        ref_first_batch_s = time.perf_counter() - start
    return first_batch_s, ref_first_batch_s, memory


def _timed_images(timed: _Timed, model_set, images) -> Tuple[float, float, list, list]:
    """Each image certified by the engine (one CERTIFY job) and counted by the baseline, in alternating order:
    (engine seconds, baseline seconds, the engine's predictions, the baseline's estimation counts)."""
    settings, clock, device = timed.settings, timed.clock, timed.device
    count_s = ref_s = 0.0
    predictions, ref_counts = [], []
    with tempfile.TemporaryDirectory() as tmp, ResultWriter(Path(tmp) / "bench.tsv") as writer:
        for i, (x, label) in enumerate(_progress(images, settings, desc=f"{timed.stages.method} "
                                                 f"{timed.stages.score.precision}", unit="img")):
            image_start = time.perf_counter()
            ref_est = np.zeros(model_set.num_classes, dtype=np.int64)
            order = ("engine", "reference") if i % 2 == 0 else ("reference", "engine")
            for who in order:
                if who == "engine":         # one CERTIFY job: selection and estimation back to back
                    with timed_noise(clock):
                        t0 = time.perf_counter()
                        selection, estimation = timed.pipe.run_one(x, i, _selection_and_estimation(timed.n0, timed.n),
                                                                   settings.batch)
                        count_s += time.perf_counter() - t0
                elif timed.reference is not None:
                    synchronize(device)
                    t0 = time.perf_counter()
                    for phase, total in (("selection", timed.n0), ("estimation", timed.n)):
                        for start in range(0, total, timed.chunk):
                            got = timed.reference.count(x, min(timed.chunk, total - start), settings.reference_batch)
                            if phase == "estimation":
                                ref_est += got
                    synchronize(device)
                    ref_s += time.perf_counter() - t0
            with clock.section("statistics"):
                prediction, radius = certify_from_counts(selection.tolist(), estimation.tolist(),
                                                         settings.alpha, settings.sigma)
            with clock.section("io"):
                writer.write(idx=i, label=int(label), predict=prediction, radius=format_radius(radius),
                             correct=int(prediction == int(label)),
                             time=format_time(time.perf_counter() - image_start))
            predictions.append({"image": i, "predict": int(prediction), "radius": float(radius),
                                "estimation_counts": estimation.tolist()})
            ref_counts.append(ref_est.tolist())
    return count_s, ref_s, predictions, ref_counts


def _plain_pass(timed: _Timed, images, memory: dict) -> Tuple[float, int]:
    """On CUDA, the images again on a pipeline without stage timers (which synchronise per stage): (seconds,
    samples computed); `memory` gets the timed and steady peaks."""
    settings, fast, device = timed.settings, timed.fast, timed.device
    plain = MonteCarloPipeline(timed.stages, settings.sigma, settings.seed, static_batch=timed.static,
                               streams=fast.streams if fast else 1, compiled_noise=bool(fast and fast.compiled_noise),
                               classifier_batch=fast.classifier_batch if fast else None)
    plain.count(images[0][0], 0, 0, settings.batch, settings.batch)      # warm the second stream's path
    synchronize(device)
    memory["timed"] = gpu_peak_memory(str(device))      # the timed passes (and the baseline's)
    reset_gpu_peak_memory(str(device))
    computed_before = plain.samples_computed
    t0 = time.perf_counter()
    for i, (x, _) in enumerate(images):
        plain.run_one(x, i, _selection_and_estimation(timed.n0, timed.n), settings.batch)
    synchronize(device)
    seconds = time.perf_counter() - t0
    memory["steady"] = dict(gpu_peak_memory(str(device)), current_allocated_gib=_allocated_gib(device))
    return seconds, plain.samples_computed - computed_before


def _reference_doc(timed: _Timed, samples: int, seconds: float, first_batch_s, counts) -> dict:
    """The baseline's measurement: its rate over the same samples, how it was interleaved, what it is."""
    return {"batch": timed.settings.reference_batch, "samples": samples, "seconds": seconds,
            "per_sample_s": seconds / samples, "samples_per_s": samples / seconds, "first_batch_s": first_batch_s,
            "estimation_counts": counts,
            "interleaved": f"chunks of {timed.chunk} samples, alternating engine/reference order",
            "cudnn_benchmark": timed.reference.cudnn_benchmark,
            "structure": "fp32 eager, randn_like noise, tables to device per call, m-loop classifier "
                         "with per-call softmax, .cpu() per batch, Python vote loop, cudnn.benchmark "
                         "as the official code sets it"}


def _allocated_gib(device) -> float:
    return torch.cuda.memory_allocated(device) / 2 ** 30 if torch.device(device).type == "cuda" else 0.0


def _peak_over_phases(phases: dict) -> dict:
    """The record's peak GPU memory (what `peak_memory` always was: build, warm-up, engine and baseline)
    from the phases measure() reset between, and the phases themselves: `warmup` (build, compile, cuDNN's
    benchmark trials, graph capture), `timed` (timed passes, the baseline), `steady` (the plain pass alone)."""
    measured = [p for p in phases.values() if p]
    if not measured:
        return {}
    peak = {key: max(p[key] for p in measured) for key in ("max_allocated_gib", "max_reserved_gib")}
    return dict(peak, phases=phases)


def _rates(measured: dict, flops: dict, peak: Optional[float], calls: int) -> Tuple[dict, dict]:
    s = measured["stage_seconds"]
    samples = measured["samples"]
    rates = {
        "pipeline_samples_per_s": samples / measured["pipeline_seconds"],
        "denoiser_samples_per_s": samples / s["denoise"] if s["denoise"] > 0 else None,
        "classifier_samples_per_s": samples / s["classify"] if s["classify"] > 0 else None,
        "classifier_calls_per_s": calls * samples / s["classify"] if s["classify"] > 0 else None,
    }

    def achieved(flop_per_sample, rate):
        return flop_per_sample * rate if rate else None

    a = {
        "pipeline_flops_per_s": achieved(flops["total_per_sample"], rates["pipeline_samples_per_s"]),
        "denoiser_flops_per_s": achieved(flops["denoiser_per_sample"], rates["denoiser_samples_per_s"]),
        "classifier_flops_per_s": achieved(flops["classifier_per_sample"], rates["classifier_samples_per_s"]),
        "peak_flops_per_s": peak,
    }
    for key in ("pipeline", "denoiser", "classifier"):
        v = a[f"{key}_flops_per_s"]
        a[f"{key}_fraction_of_peak"] = v / peak if (v and peak) else None
    return rates, a


def run_sweep(model_set, images, settings: BenchSettings, precision: str = "fp32", repeats: int = 2) -> dict:
    """Seconds per certified image (extrapolated to settings.n) over batch sizes x m, torch backend.

    The grid is timed `repeats` times, alternately forwards and backwards, and each point keeps its
    fastest pass: machine-load drift then biases neither end of the grid.
    """
    x = images[0][0]
    grid = [(m, b) for m in settings.sweep_ms for b in settings.sweep_batches]
    stages_for_m = {m: build_stages("torch", precision, model_set, settings, m=m) for m in settings.sweep_ms}
    passes = {point: [] for point in grid}
    order = [p for r in range(repeats) for p in (grid if r % 2 == 0 else grid[::-1])]
    for m, b in _progress(order, settings, desc="sweep", unit="pt"):
        stages = stages_for_m[m]
        pipe = MonteCarloPipeline(stages, settings.sigma, settings.seed)
        samples = max(b, settings.sweep_n or settings.measure_n)
        pipe.count(x, 0, 0, b, b)                      # warm-up at this batch size
        synchronize(stages.device)
        t0 = time.perf_counter()
        pipe.count(x, 0, 0, samples, b)
        synchronize(stages.device)
        passes[(m, b)].append((time.perf_counter() - t0) / samples)
    rows = []
    for m, b in grid:
        per_sample = min(passes[(m, b)])
        rows.append({"batch": b, "m": m, "samples": max(b, settings.sweep_n or settings.measure_n),
                     "per_sample_s": per_sample, "per_sample_s_passes": passes[(m, b)],
                     "samples_per_s": 1.0 / per_sample,
                     "seconds_per_image": per_sample * (settings.n0 + settings.n)})
    return {"n0": settings.n0, "n": settings.n, "precision": precision, "backend": "torch",
            "batches": list(settings.sweep_batches), "ms": list(settings.sweep_ms), "rows": rows,
            "repeats": repeats,
            "note": "fastest of the passes per point; statistics/row-write time (< 10 ms per image) not included"}


def sweep_table(sweep: dict) -> List[List[Optional[float]]]:
    """Seconds per image as a len(ms) x len(batches) grid (rows m, columns batch)."""
    index = {(r["m"], r["batch"]): r["seconds_per_image"] for r in sweep["rows"]}
    return [[index.get((m, b)) for b in sweep["batches"]] for m in sweep["ms"]]


def run_bench(settings: BenchSettings, on_run: Optional[Callable[[dict], None]] = None) -> dict:
    """Run the benchmark; returns {schema, timestamp, machine, settings, runs, skipped, sweep}. With
    `settings.variants`, each variant is measured in turn on the same models (bench/variants.py), its runs
    named by `variant`, the baseline beside the first only; a variant that fails or would end past
    `deadline_s` is listed in `skipped` with why. `on_run(record)`: each run's JSON line as it finishes."""
    started = time.perf_counter()
    settings = settings.resolved()
    if settings.threads:
        torch.set_num_threads(settings.threads)
    doc = {"schema": SCHEMA,
           "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "machine": machine_info(settings.device), "settings": settings.as_dict(),
           "extrapolation": EXTRAPOLATION_NOTE, "runs": [], "skipped": [], "sweep": None}
    resolve_device(settings.device)
    model_set = build_model_set(settings.models, settings.method, settings.sigma, settings.local_sigma,
                                settings.seed, settings.unet_overrides or None, settings.arch,
                                denoiser_folder=settings.denoiser, scheduler=settings.scheduler)
    images = bench_images(settings.models, settings.images, model_set.image_shape, settings.seed)
    specs = settings.variants or (None,)
    longest = 0.0                       # the longest variant after the first, its baseline left out
    with tempfile.TemporaryDirectory(prefix="diffsmooth-bench-") as workdir:
        for index, spec in enumerate(specs):
            variant_settings = settings.for_variant(spec, index == 0).resolved() if spec else settings
            elapsed = time.perf_counter() - started
            if spec and index and settings.deadline_s and elapsed + longest > settings.deadline_s:
                doc["skipped"].append({"variant": spec, "reason": f"deadline: {elapsed:.0f} s of "
                                       f"{settings.deadline_s:.0f} s spent, the longest variant took {longest:.0f} s"})
                print(f"skipping variant {spec}: past the deadline", file=sys.stderr)
                continue
            variant_start = time.perf_counter()
            try:
                runs = _measure_settings(variant_settings, model_set, images, doc, workdir, spec)
            except Exception as exc:        # one variant failing (a kernel, memory) must not lose the others
                if spec is None:
                    raise
                doc["skipped"].append({"variant": spec, "reason": f"failed: {type(exc).__name__}: {first_line(exc)}"})
                print(f"variant {spec} failed: {first_line(exc)}", file=sys.stderr)
                runs = []
            finally:
                _release_gpu(settings.device)
            for run in runs:
                if spec:
                    run["variant"] = spec
                    run["variant_changes"] = to_jsonable(parse_variant(spec))
                doc["runs"].append(run)
                if on_run is not None:
                    on_run(_line(doc, run, variant_settings))
            baseline_s = sum((r.get("reference_equivalent") or {}).get("seconds", 0.0) for r in runs)
            if index:
                longest = max(longest, time.perf_counter() - variant_start - baseline_s)
            elif spec:
                longest = 0.7 * (time.perf_counter() - variant_start - baseline_s)   # cache-warm guess for the rest
    if settings.sweep:
        cuda = torch.device(settings.device).type == "cuda"
        doc["sweep"] = run_sweep(model_set, images, settings, settings.precisions[0] if cuda else "fp32")
        doc["sweep"]["table"] = sweep_table(doc["sweep"])
        if settings.plot:
            doc["sweep"]["plot"] = plot_sweep(doc["sweep"], settings.plot, title=f"{settings.models} "
                                              f"{settings.method}, {doc['machine']['gpu'] or doc['machine']['cpu_model']}")
        if on_run is not None:
            on_run(to_jsonable({"schema": doc["schema"], "timestamp": doc["timestamp"], "machine": doc["machine"],
                                "settings": doc["settings"], "sweep": doc["sweep"]}))
    doc["machine"]["load_average_end"] = machine_info(settings.device)["load_average"]
    return doc


def _line(doc: dict, run: dict, settings: BenchSettings) -> dict:
    """One run's self-contained JSON line: machine, the settings it ran with, the run."""
    return to_jsonable({"schema": doc["schema"], "timestamp": doc["timestamp"], "machine": doc["machine"],
                        "settings": settings.as_dict(), "run": run})


def _release_gpu(device: str) -> None:
    """Give back what a measured variant left (its graphs' pools, cached blocks) before the next one."""
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def _measure_settings(settings: BenchSettings, model_set, images, doc: dict, workdir: str,
                      variant: Optional[str]) -> List[dict]:
    """Every backend x precision of `settings` on the model set: the runs measured (skips go to doc)."""
    flops = count_model_flops(model_set, settings)
    calls = flops["classifier_calls_per_sample"]
    ns = sorted({settings.n, *STANDARD_NS})
    runs = []
    for backend in settings.backends:
        for precision in settings.precisions:
            start = time.perf_counter()
            reset_gpu_peak_memory(settings.device)
            try:
                sub = Path(workdir) / f"{backend}-{precision}-{len(doc['runs']) + len(runs)}"
                sub.mkdir(exist_ok=True)
                stages = build_stages(backend, precision, model_set, settings, workdir=str(sub))
            except _Skip as why:
                doc["skipped"].append({"backend": backend, "precision": precision, "reason": str(why),
                                       **({"variant": variant} if variant else {})})
                print(f"skipping {backend}/{precision}: {why}", file=sys.stderr)
                continue
            build_s = time.perf_counter() - start
            peak, peak_source = peak_flops(settings.device, precision, settings.peak_tflops,
                                           settings.measure_cpu_peak)
            baseline = None
            if settings.reference:
                baseline = build_reference(settings.method, model_set, settings.sigma, settings.m,
                                           settings.local_sigma, device=settings.device, seed=settings.seed,
                                           cudnn_benchmark=official_cudnn_benchmark(
                                               settings.arch or SET_SPECS[settings.models]["arch"]))
            measured, reference = measure(stages, model_set, images, settings, baseline,
                                          fast=settings.fast_path() if stage_backend(backend).runs_modules else None)
            peak_memory = dict(_peak_over_phases(measured.pop("memory_phases")),
                               note="build, warm-up, engine and reference-equivalent runs of this record; phases: "
                                    "warmup (build, compile, cuDNN benchmark trials, graph capture), timed (timed "
                                    "passes and baseline), steady (the engine's plain pass alone)")
            rates, achieved = _rates(measured, flops, peak, calls)
            achieved["peak_source"] = peak_source
            run = {
                "backend": backend, "precision": precision, "device": str(stages.device),
                "models": settings.models, "method": settings.method, "m": settings.m if
                _takes_m(settings.method) else None, "batch": settings.batch,
                "model_info": model_set.description, "stages": stages.describe(),
                "flops": flops,
                "warmup": {"build_models_s": model_set.build_s, "build_stages_s": build_s,
                           "first_batch_s": measured.pop("first_batch_s"),
                           "note": "excluded from all rates"},
                "measured": measured, "rates": rates, "achieved": achieved, "peak_memory": peak_memory,
                "fast_path": settings.fast_path().as_dict() if stage_backend(backend).runs_modules else None,
                "extrapolated": {"n0": settings.n0, "note": EXTRAPOLATION_NOTE,
                                 "seconds_per_image": engine_seconds_table(measured, settings, ns)},
            }
            if reference is not None:
                ref_table = extrapolation_table(reference["per_sample_s"], measured["per_image_fixed_s"],
                                                settings.n0, ns)
                engine_at_n = run["extrapolated"]["seconds_per_image"][str(settings.n)]
                run["reference_equivalent"] = dict(reference, seconds_per_image=ref_table,
                                                   speedup=ref_table[str(settings.n)] / engine_at_n)
            if settings.compare:
                run["compare"] = compare_rows(run, settings)
            if settings.profile and stage_backend(backend).runs_modules:
                fast = settings.fast_path()
                run["kernel_profile"] = profile_pipeline(
                    stages, settings.sigma, images[0][0], settings.batch, settings.profile,
                    f"{settings.models}-{backend}-{precision}", static_batch=fast.static_batch,
                    compiled_noise=fast.compiled_noise)
            runs.append(run)
            del stages
    return runs


def to_jsonable(obj):
    """numpy scalars/arrays and tuples to plain JSON types."""
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    return obj

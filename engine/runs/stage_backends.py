"""The backends a run builds its stages on, one class each behind backends/base.py's `StageBackend`: `torch` (the
models in eager or compiled torch), `onnxruntime` (the graphs of `diffsmooth export`), `tensorrt` (the plans of
`diffsmooth build-engine`). `stage_backend(name)` is the one place a backend's name becomes its class; a run, the
Python API and `diffsmooth bench` all build through it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

from diffsmooth.engine.backends.base import BaseClassifierStages, StageBackend
from diffsmooth.engine.backends.compile_options import Compilation
from diffsmooth.engine.backends.onnxruntime_backend import OrtSession
from diffsmooth.engine.backends.torch_backend import TorchBackend
from diffsmooth.engine.base_classifier.configurations import (
    Configuration,
    stacked_configuration_stages,
    torch_configuration_stages,
)
from diffsmooth.engine.base_classifier.methods import MethodConfig
from diffsmooth.engine.base_classifier.onnx_stages import build_onnx_stages
from diffsmooth.engine.base_classifier.tensorrt_stages import build_trt_stages
from diffsmooth.engine.base_classifier.torch_stages import build_torch_stages
from diffsmooth.engine.certify.smooth import Smooth
from diffsmooth.engine.choices import BACKENDS
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.runs.assemble import (
    ModelSources,
    build_pipeline,
    classifier_call_images,
    load_models,
    load_sweep_models,
)
from diffsmooth.engine.runs.fast_path import FastPath
from diffsmooth.engine.runs.model_set import ModelSet


@dataclass(frozen=True)
class StageBuild:
    """How a run builds its stages: the device and precision, the fast path, the batch they serve, where exported
    graphs are and how many threads ONNX Runtime takes; models already loaded (torch: (denoiser, classifier), or
    (denoiser, {name: classifier}) for a sweep); a table's model set, reused where the architecture matches; a log."""

    device: str = "cpu"
    precision: str = "fp32"
    fast: FastPath = FastPath()
    batch: int = 1000
    onnx_dir: Optional[str] = None
    threads: Optional[int] = None
    models: Any = None
    model_set: Optional[ModelSet] = None
    log: Optional[Callable[[str], None]] = None


class TorchStages:
    """The models as torch modules, eager or compiled (the fast path), on the torch backend."""

    name = "torch"
    runs_modules = True         # its fast path (compiled, fp16/bf16) is checked against the same modules in eager fp32

    def runner(self, build: StageBuild) -> TorchBackend:
        """The torch backend for the fast path; its stages come from the model set when one is given."""
        fast = build.fast
        compilation = Compilation(fast.compile_mode, fast.inductor, fast.classifier_compile_mode)
        runner = TorchBackend(device=build.device, precision=build.precision, compile=fast.compile,
                              cuda_graphs=fast.cuda_graphs, log=build.log, compilation=compilation)
        return build.model_set.backend(runner) if build.model_set is not None else runner

    def stages(self, config: MethodConfig, sources: ModelSources, image_shape: Tuple[int, ...],
               num_classes: Optional[int], build: StageBuild) -> BaseClassifierStages:
        denoiser, classifier = build.models or load_models(config, sources)
        return self.from_models(config, classifier, denoiser, image_shape, num_classes, build)

    def from_models(self, config: MethodConfig, classifier, denoiser, image_shape: Tuple[int, ...],
                    num_classes: Optional[int], build: StageBuild) -> BaseClassifierStages:
        """The stages of loaded modules (what `diffsmooth bench` times)."""
        runner, fast = self.runner(build), build.fast
        probe_batch = classifier_call_images(config, build.batch, image_shape, runner.device, fast.classifier_batch)
        return build_torch_stages(config, classifier, denoiser, runner, image_shape, num_classes, fast, probe_batch)

    def sweep_stages(self, configs: Sequence[Configuration], classifier_paths: Dict[str, str], sources: ModelSources,
                     image_shape: Tuple[int, ...], num_classes: Optional[int], build: StageBuild) -> BaseClassifierStages:
        """One module scoring every configuration on the same samples."""
        denoiser, classifiers = build.models or load_sweep_models(configs, classifier_paths, sources)
        return torch_configuration_stages(configs, classifiers, denoiser, self.runner(build), image_shape, num_classes,
                                          fused_attention=build.fast.fused_attention, lean_unet=build.fast.lean_unet)


class ExportedStages:
    """Stages from exported graphs in `onnx_dir`, picked by their manifests; a sweep stacks each configuration's."""

    name = ""
    needs = ""                  # what `onnx_dir` must hold
    runs_modules = False        # graphs and plans are validated when exported and built, not per run

    def load(self, config: MethodConfig, sources: ModelSources, image_shape, num_classes,
             build: StageBuild) -> BaseClassifierStages:
        raise NotImplementedError

    def stages(self, config: MethodConfig, sources: ModelSources, image_shape: Tuple[int, ...],
               num_classes: Optional[int], build: StageBuild) -> BaseClassifierStages:
        if not build.onnx_dir:
            raise UserError(f"`backend` {self.name} needs `onnx_dir` ({self.needs})")
        if not config.kind.exported:
            raise UserError(f"method {config.method} runs on the torch backend only (`backend` {self.name} runs "
                            f"exported graphs of the one-shot denoiser and the score head)")
        stages = self.load(config, sources, image_shape, num_classes, build)
        if build.model_set is not None:
            build.model_set.note_built(stages)
        return stages

    def sweep_stages(self, configs: Sequence[Configuration], classifier_paths: Dict[str, str], sources: ModelSources,
                     image_shape: Tuple[int, ...], num_classes: Optional[int], build: StageBuild) -> BaseClassifierStages:
        def stages_of(c: Configuration) -> BaseClassifierStages:
            one = dataclasses.replace(sources, classifier=classifier_paths[c.classifier])
            return self.stages(c.method, one, image_shape, num_classes, build)
        return stacked_configuration_stages(configs, stages_of)


class OnnxRuntimeStages(ExportedStages):
    """The graphs of `diffsmooth export`, run by ONNX Runtime."""

    name = "onnxruntime"
    needs = "graphs from `diffsmooth export`"

    def load(self, config, sources, image_shape, num_classes, build):
        return build_onnx_stages(build.onnx_dir, config, image_shape, num_classes, device=build.device,
                                 precision=build.precision, session=OrtSession(threads=build.threads),
                                 classifier=sources.classifier)


class TensorRTStages(ExportedStages):
    """The plans `diffsmooth build-engine` built from the exported graphs, for the run's batch."""

    name = "tensorrt"
    needs = "graphs from `diffsmooth export`, plans from `diffsmooth build-engine`"

    def load(self, config, sources, image_shape, num_classes, build):
        return build_trt_stages(build.onnx_dir, config, image_shape, num_classes, device=build.device,
                                precision=build.precision, batch=build.batch, classifier=sources.classifier)


STAGE_BACKENDS: Dict[str, StageBackend] = {b.name: b for b in (TorchStages(), OnnxRuntimeStages(), TensorRTStages())}


def stage_backend(name: str) -> StageBackend:
    """The backend called `name`; an unknown one is refused in one line."""
    if name not in STAGE_BACKENDS:
        raise UserError(f"unknown backend {name!r}: choose one of {', '.join(BACKENDS)}")
    return STAGE_BACKENDS[name]


def build_stages(config: MethodConfig, sources: ModelSources, image_shape: Tuple[int, ...],
                 num_classes: Optional[int] = None, *, backend: str = "torch", **build) -> BaseClassifierStages:
    """The stages of one configuration on the named backend (`build`: StageBuild's fields); probes the models with
    `image_shape`."""
    return stage_backend(backend).stages(config, sources, image_shape, num_classes, StageBuild(**build))


def build_sweep_stages(configs: Sequence[Configuration], classifier_paths: Dict[str, str], sources: ModelSources,
                       image_shape: Tuple[int, ...], num_classes: Optional[int] = None, *, backend: str = "torch",
                       **build) -> BaseClassifierStages:
    """The stages of several configurations at one sigma scored on the same samples (a sweep): on the torch
    backend one module scoring all of them; on exported backends each configuration's graph or plan, stacked."""
    return stage_backend(backend).sweep_stages(configs, classifier_paths, sources, image_shape, num_classes,
                                               StageBuild(**build))


def build_smooth(config: MethodConfig, sources: ModelSources, image_shape: Tuple[int, ...],
                 num_classes: Optional[int] = None, *, backend: str = "torch", seed: int = 0, **build) -> Smooth:
    """A Smooth for `config` on the named backend (`build`: StageBuild's fields; the fast path resolved for the
    device when not given)."""
    if build.get("fast") is None:
        build["fast"] = FastPath.resolve(build.get("device", "cpu"), backend=backend)
    made = StageBuild(**build)
    stages = stage_backend(backend).stages(config, sources, image_shape, num_classes, made)
    return Smooth(build_pipeline(stages, config.sigma, seed, made.fast, made.log))

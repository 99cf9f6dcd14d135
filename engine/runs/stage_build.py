"""How a run builds its stages on a named backend (engine/backends/, picked by name in its registry.py): the
build's settings (`StageBuild`: device, precision, fast path, batch, exported graphs, models loaded or to load) and
the one-call builders a run, the Python API and `diffsmooth bench` use."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

from diffsmooth.engine.backends.registry import stage_backend
from diffsmooth.engine.base_classifier.configurations import Configuration
from diffsmooth.engine.base_classifier.methods import MethodConfig
from diffsmooth.engine.certify.smooth import Smooth
from diffsmooth.engine.runs.assemble import (
    ModelSources,
    build_pipeline,
    classifier_call_images,
    load_models,
    load_sweep_models,
)
from diffsmooth.engine.runs.fast_path import FastPath
from diffsmooth.engine.runs.model_set import ModelSet
from diffsmooth.engine.stages.base import BaseClassifierStages


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

    def modules(self, config: MethodConfig, sources: ModelSources):
        """(denoiser or None, classifier) as torch modules: those given, else loaded from `sources`."""
        return self.models or load_models(config, sources)

    def sweep_modules(self, configs: Sequence[Configuration], classifier_paths: Dict[str, str], sources: ModelSources):
        """(denoiser or None, {name: classifier}) of a sweep: those given, else each loaded once from `sources`."""
        return self.models or load_sweep_models(configs, classifier_paths, sources)

    def classifier_call_images(self, config: MethodConfig, image_shape: Tuple[int, ...], device) -> int:
        """Images per classifier call at this build's batch (assemble.classifier_call_images)."""
        return classifier_call_images(config, self.batch, image_shape, device, self.fast.classifier_batch)


def build_stages(config: MethodConfig, sources: ModelSources, image_shape: Tuple[int, ...],
                 num_classes: Optional[int] = None, *, backend: str = "torch", **build) -> BaseClassifierStages:
    """The stages of one configuration on the named backend (`build`: StageBuild's fields); probes the models with
    `image_shape`."""
    return stage_backend(backend).stages(config, sources, image_shape, num_classes, StageBuild(**build))


def build_sweep_stages(configs: Sequence[Configuration], classifier_paths: Dict[str, str], sources: ModelSources,
                       image_shape: Tuple[int, ...], num_classes: Optional[int] = None, *, backend: str = "torch",
                       **build) -> BaseClassifierStages:
    """The stages of several configurations at one sigma scored on the same samples (a sweep): on the torch
    backend one module scoring all of them; on exported backends each configuration's graph or engine file, stacked."""
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

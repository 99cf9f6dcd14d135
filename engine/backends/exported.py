"""What the backends that run exported graphs (onnxruntime, tensorrt) share: stages from the graphs in `onnx_dir`,
refused in one line when there are none or the method has none; a sweep stacks each configuration's, the denoiser
graph picked, opened and probed once."""

from __future__ import annotations

import dataclasses
from typing import Callable, Dict, Optional, Sequence, Tuple

from diffsmooth.engine.base_classifier.configurations import Configuration, stacked_configuration_stages
from diffsmooth.engine.base_classifier.methods import MethodConfig
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.stages.base import BaseClassifierStages


class SweepGraphs:
    """What a sweep's configurations share of the exported files: the denoiser's picked (its hashes checked) once
    and each file opened once for its label (so one session of the denoiser graph serves every configuration)."""

    def __init__(self):
        self.kept: dict = {}

    def _once(self, key, make):
        if key not in self.kept:
            self.kept[key] = make()
        return self.kept[key]

    def pick(self, pick: Callable) -> Callable:
        """`pick(role, want)` with the denoiser's answer kept (a classifier graph is picked per checkpoint)."""
        return lambda role, want: (self._once(repr(sorted(want.items())), lambda: pick(role, want))
                                   if role == "denoiser" else pick(role, want))

    def load(self, load: Callable) -> Callable:
        """`load(file, label)` with each stage kept."""
        return lambda path, label: self._once((str(path), label), lambda: load(path, label))


class ExportedBackend:
    """Stages from exported graphs in `onnx_dir`, picked by their manifests; a sweep stacks each configuration's.
    `build`: how the run builds (engine/runs/stage_build.py's StageBuild)."""

    name = ""
    needs = ""                  # what `onnx_dir` must hold
    runs_modules = False        # graphs and engine files are validated when exported and built, not per run
    accepts_torch_options = False   # the torch backend's fast-path options (compile, kernels, ...) are refused

    def fast_path_defaults(self, cuda: bool, compile, asked: dict) -> dict:
        """The FastPath fields of this backend on a CUDA device or not (engine/runs/fast_path.py): none."""
        return {}

    def load(self, config: MethodConfig, sources, image_shape, num_classes, build,
             sweep: Optional[SweepGraphs] = None) -> BaseClassifierStages:
        """The stages of `config` from its files (onnxruntime/stages.py's graph_stages; `sweep`: a sweep's shared
        files, the stages left unprobed)."""
        raise NotImplementedError

    def stages(self, config: MethodConfig, sources, image_shape: Tuple[int, ...], num_classes: Optional[int],
               build) -> BaseClassifierStages:
        return self._built(build, lambda: self.load(config, sources, image_shape, num_classes, build))

    def sweep_stages(self, configs: Sequence[Configuration], classifier_paths: Dict[str, str], sources,
                     image_shape: Tuple[int, ...], num_classes: Optional[int], build) -> BaseClassifierStages:
        shared = SweepGraphs()

        def stages_of(c: Configuration) -> BaseClassifierStages:
            one = dataclasses.replace(sources, classifier=classifier_paths[c.classifier])
            return self.load(c.config, one, image_shape, num_classes, build, shared)
        return self._built(build, lambda: stacked_configuration_stages(configs, stages_of, image_shape, num_classes))

    def _built(self, build, make) -> BaseClassifierStages:
        """`make()`'s stages, refused in one line without `onnx_dir`, counted in a table's model set."""
        if not build.onnx_dir:
            raise UserError(f"`backend` {self.name} needs `onnx_dir` ({self.needs})")
        stages = make()
        if build.model_set is not None:
            build.model_set.note_built(stages)
        return stages

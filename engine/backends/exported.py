"""What the backends that run exported graphs (onnxruntime, tensorrt) share: stages from the graphs in `onnx_dir`,
refused in one line when there are none or the method has none; a sweep stacks each configuration's."""

from __future__ import annotations

import dataclasses
from typing import Dict, Optional, Sequence, Tuple

from diffsmooth.engine.base_classifier.configurations import Configuration, stacked_configuration_stages
from diffsmooth.engine.base_classifier.methods import MethodConfig
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.stages.base import BaseClassifierStages


class ExportedBackend:
    """Stages from exported graphs in `onnx_dir`, picked by their manifests; a sweep stacks each configuration's.
    `build`: how the run builds (engine/runs/stage_build.py's StageBuild)."""

    name = ""
    needs = ""                  # what `onnx_dir` must hold
    runs_modules = False        # graphs and plans are validated when exported and built, not per run
    accepts_torch_options = False   # the torch backend's fast-path options (compile, kernels, ...) are refused

    def fast_path_defaults(self, cuda: bool, compile, asked: dict) -> dict:
        """The FastPath fields of this backend on a CUDA device or not (engine/runs/fast_path.py): none."""
        return {}

    def load(self, config: MethodConfig, sources, image_shape, num_classes, build) -> BaseClassifierStages:
        raise NotImplementedError

    def stages(self, config: MethodConfig, sources, image_shape: Tuple[int, ...], num_classes: Optional[int],
               build) -> BaseClassifierStages:
        if not build.onnx_dir:
            raise UserError(f"`backend` {self.name} needs `onnx_dir` ({self.needs})")
        stages = self.load(config, sources, image_shape, num_classes, build)
        if build.model_set is not None:
            build.model_set.note_built(stages)
        return stages

    def sweep_stages(self, configs: Sequence[Configuration], classifier_paths: Dict[str, str], sources,
                     image_shape: Tuple[int, ...], num_classes: Optional[int], build) -> BaseClassifierStages:
        def stages_of(c: Configuration) -> BaseClassifierStages:
            one = dataclasses.replace(sources, classifier=classifier_paths[c.classifier])
            return self.stages(c.config, one, image_shape, num_classes, build)
        return stacked_configuration_stages(configs, stages_of)

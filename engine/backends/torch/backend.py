"""The torch backend as a run sees it (engine/stages/base.py's StageBackend): the models as torch modules, eager
or compiled, and the defaults of its fast path (every speed feature a run may ask for is this backend's)."""

from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple

from diffsmooth.engine.backends.torch.compile_options import Compilation
from diffsmooth.engine.backends.torch.runner import TorchRunner
from diffsmooth.engine.backends.torch.stages import build_torch_stages, check_classifier_rewrites, torch_stages
from diffsmooth.engine.base_classifier.configurations import Configuration
from diffsmooth.engine.base_classifier.methods import MethodConfig
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.stages.base import BaseClassifierStages


class TorchBackend:
    """The models as torch modules, eager or compiled (the fast path), on the torch backend. `build`: how the run
    builds (engine/runs/stage_build.py's StageBuild: its modules, loaded or given, and its fast path)."""

    name = "torch"
    runs_modules = True         # its fast path (compiled, fp16/bf16) is checked against the same modules in eager fp32
    accepts_torch_options = True    # compile, its modes and knobs, the kernels and rewrites of the fast path

    def runner(self, build) -> TorchRunner:
        """The torch backend for the fast path; its stages come from the model set when one is given."""
        fast = build.fast
        compilation = Compilation(fast.compile_mode, fast.inductor, fast.classifier_compile_mode)
        runner = TorchRunner(device=build.device, precision=build.precision, compile=fast.compile,
                              cuda_graphs=fast.cuda_graphs, log=build.log, compilation=compilation)
        return build.model_set.backend(runner) if build.model_set is not None else runner

    def stages(self, config: MethodConfig, sources, image_shape: Tuple[int, ...], num_classes: Optional[int],
               build) -> BaseClassifierStages:
        denoiser, classifier = build.modules(config, sources)
        return self.from_models(config, classifier, denoiser, image_shape, num_classes, build)

    def from_models(self, config: MethodConfig, classifier, denoiser, image_shape: Tuple[int, ...],
                    num_classes: Optional[int], build) -> BaseClassifierStages:
        """The stages of loaded modules (what `diffsmooth bench` times)."""
        runner, fast = self.runner(build), build.fast
        probe_batch = build.classifier_call_images(config, image_shape, runner.device)
        return build_torch_stages(config, classifier, denoiser, runner, image_shape, num_classes, fast, probe_batch)

    def sweep_stages(self, configs: Sequence[Configuration], classifier_paths: Dict[str, str], sources,
                     image_shape: Tuple[int, ...], num_classes: Optional[int], build) -> BaseClassifierStages:
        """One module scoring every configuration on the same samples (a single run is this path's sweep of one)."""
        denoiser, classifiers = build.sweep_modules(configs, classifier_paths, sources)
        return torch_stages(tuple(configs), classifiers, denoiser, self.runner(build), image_shape, num_classes,
                            build.fast)

    def fast_path_defaults(self, cuda: bool, compile: Optional[bool], asked: dict) -> dict:
        """The FastPath fields of the torch backend (engine/runs/fast_path.py's FastPath.resolve says the rules;
        `asked`: the other settings a user gave, each already checked (engine/runs/fast_path_options.py), None or
        absent: the default). On CUDA everything on unless switched off; on CPU eager unless compile=True."""
        def given(name: str, default):
            return default if asked.get(name) is None else asked[name]
        compile = cuda if compile is None else bool(compile)
        cuda_graphs = given("cuda_graphs", cuda and compile)
        if cuda_graphs and not cuda:
            raise UserError("`cuda_graphs` needs a CUDA device")
        modes = {k: None if asked.get(k) == "default" else asked.get(k) for k in ("compile_mode", "classifier_compile_mode")}
        inductor = asked.get("inductor") or ()
        if (any(modes.values()) or inductor) and not compile:
            raise UserError("`compile_mode`, `classifier_compile_mode` and `inductor` set how stages compile: they "
                            "need `compile`")
        check_classifier_rewrites(asked.get("fused_conv"), asked.get("triton_conv"), asked.get("pack_images"))
        if asked.get("triton_blocks") and not asked.get("triton_conv"):
            raise UserError("`triton_blocks` fuses the Triton convolutions of a block: it needs `triton_conv`")
        return dict(compile=compile, cuda_graphs=cuda_graphs, streams=given("streams", 2 if cuda else 1),
                    static_batch=compile or cuda_graphs, compiled_noise=compile and cuda,
                    fused_attention=given("fused_attention", cuda and compile), inductor=inductor,
                    classifier_batch=asked.get("classifier_batch"), pack_images=asked.get("pack_images"), **modes,
                    **{k: bool(asked.get(k)) for k in ("fused_conv", "lean_unet", "triton_conv", "triton_blocks")})

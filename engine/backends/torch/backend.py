"""The torch backend as a run sees it (engine/stages/base.py's StageBackend): the models as torch modules, eager
or compiled, and the defaults of its fast path (every speed feature a run may ask for is this backend's)."""

from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple

from diffsmooth.engine.backends.torch.compile_options import Compilation, check_compile_mode, parse_inductor_knobs
from diffsmooth.engine.backends.torch.runner import TorchRunner
from diffsmooth.engine.backends.torch.stages import build_torch_stages, check_classifier_rewrites
from diffsmooth.engine.base_classifier.configurations import Configuration, torch_configuration_stages
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
        """One module scoring every configuration on the same samples."""
        denoiser, classifiers = build.sweep_modules(configs, classifier_paths, sources)
        return torch_configuration_stages(configs, classifiers, denoiser, self.runner(build), image_shape, num_classes,
                                          fused_attention=build.fast.fused_attention, lean_unet=build.fast.lean_unet)

    def fast_path_defaults(self, cuda: bool, compile: Optional[bool], asked: dict) -> dict:
        """The FastPath fields of the torch backend (engine/runs/fast_path.py's FastPath.resolve says the rules;
        `asked`: the other settings of its ASKED a user gave, None or absent: the default; pack_images and
        inductor already read). On CUDA everything on unless switched off; on CPU eager unless compile=True."""
        compile = cuda if compile is None else bool(compile)
        cuda_graphs, streams = asked.get("cuda_graphs"), asked.get("streams")
        fused_attention, fused_conv, lean_unet = asked.get("fused_attention"), asked.get("fused_conv"), asked.get("lean_unet")
        compile_mode, classifier_compile_mode = asked.get("compile_mode"), asked.get("classifier_compile_mode")
        classifier_batch, pack_images = asked.get("classifier_batch"), asked.get("pack_images")
        triton_conv, triton_blocks = asked.get("triton_conv"), asked.get("triton_blocks")
        cuda_graphs = (cuda and compile) if cuda_graphs is None else bool(cuda_graphs)
        if cuda_graphs and not cuda:
            raise UserError("`cuda_graphs` needs a CUDA device")
        streams = (2 if cuda else 1) if streams is None else int(streams)
        if streams not in (1, 2):
            raise UserError(f"`streams` must be 1 or 2, got {streams}")
        fused_attention = (cuda and compile) if fused_attention is None else bool(fused_attention)
        compile_mode = check_compile_mode(None if compile_mode == "default" else compile_mode)
        classifier_compile_mode = check_compile_mode(None if classifier_compile_mode == "default"
                                                     else classifier_compile_mode)
        inductor = parse_inductor_knobs(asked.get("inductor") or ())
        if (compile_mode or classifier_compile_mode or inductor) and not compile:
            raise UserError("`compile_mode`, `classifier_compile_mode` and `inductor` set how stages compile: they "
                            "need `compile`")
        if classifier_batch is not None and (isinstance(classifier_batch, bool) or not isinstance(classifier_batch, int)
                                             or classifier_batch < 1):
            raise UserError(f"`classifier_batch` must be an integer >= 1, got {classifier_batch!r}")
        check_classifier_rewrites(fused_conv, triton_conv, pack_images)
        if triton_blocks and not triton_conv:
            raise UserError("`triton_blocks` fuses the Triton convolutions of a block: it needs `triton_conv`")
        return dict(compile=compile, cuda_graphs=cuda_graphs, streams=streams,
                    static_batch=compile or cuda_graphs, compiled_noise=compile and cuda,
                    fused_attention=fused_attention, fused_conv=bool(fused_conv), lean_unet=bool(lean_unet),
                    compile_mode=compile_mode, inductor=inductor, classifier_batch=classifier_batch,
                    triton_conv=bool(triton_conv), triton_blocks=bool(triton_blocks), pack_images=pack_images,
                    classifier_compile_mode=classifier_compile_mode)

"""A method's stages on the torch backend: the denoiser's purifier and the method's score head, with the classifier
rewrites of the fast path (folded, fused, Triton, packed), probed once (base_classifier/probe.py)."""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch
from torch import nn

from diffsmooth.engine.backends.torch.runner import AUTOCAST_DTYPES
from diffsmooth.engine.base_classifier.configurations import (
    Configuration,
    ConfigurationHeads,
    check_classes,
    checked_stages,
    inputs_of,
    purifier_config,
)
from diffsmooth.engine.base_classifier.methods import MethodConfig
from diffsmooth.engine.base_classifier.probe import probed
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.models.folded_resnet import CUDNN_FUSION, fold_classifier, fp32_scores, fusion_verdict, probe_cudnn_fusion
from diffsmooth.engine.models.packed_resnet import pack_classifier
from diffsmooth.engine.stages.base import BaseClassifierStages


def score_module(config: MethodConfig, classifier: nn.Module, image_shape: Tuple[int, ...]) -> nn.Module:
    """The classifier half of the base classifier as one module, the method's score head (what the ONNX export
    also uses)."""
    return config.method.score_head(config, classifier, image_shape)


def folded_classifier(classifier: nn.Module, backend, image_shape: Tuple[int, ...], log=None,
                      probe_batch: int = 8) -> nn.Module:
    """The classifier with BatchNorm folded and conv + add + ReLU fused (engine/models/folded_resnet.py)
    in the backend's precision, on its device; the classifier itself when it is not a ResNet.
    probe_batch: images per classifier call in the run, the shape cuDNN's fusion is checked at."""
    log = log or (lambda message: None)
    folded = _folded_on_device(classifier, backend, "fused_conv", log)
    if folded is None:
        return classifier
    if backend.device.type == "cuda":
        probe_cudnn_fusion(folded, image_shape, log, probe_batch, _folded_fp32(classifier, backend))
    return folded


def _folded_fp32(classifier: nn.Module, backend) -> Optional[nn.Module]:
    """The classifier folded in fp32 on the backend's device, channels_last: the truth a fused kernel's check
    measures the run's precision against (engine/models/folded_resnet.py fusion_verdict); None in fp32."""
    if backend.precision == "fp32":
        return None
    return fold_classifier(classifier.eval(), torch.float32).eval().to(backend.device).to(
        memory_format=torch.channels_last)


def _folded_on_device(classifier: nn.Module, backend, option: str, log) -> Optional[nn.Module]:
    """The classifier with BatchNorm folded, in the backend's precision, on its device (NHWC on CUDA: the
    layout cuDNN's fused kernels and the Triton kernel read); None, with a message, when it is not a ResNet."""
    folded = fold_classifier(classifier.eval(), AUTOCAST_DTYPES[backend.precision] or torch.float32)
    if folded is None:
        log(f"# `{option}`: {type(classifier).__name__} is not a CIFAR ResNet / ResNet-50; it runs unfolded")
        return None
    folded = folded.eval().to(backend.device)
    if backend.device.type == "cuda":
        folded = folded.to(memory_format=torch.channels_last)
    return folded


def tritonized_classifier(classifier: nn.Module, backend, image_shape: Tuple[int, ...], log=None,
                          probe_batch: int = 8, fuse_blocks: bool = False) -> nn.Module:
    """The classifier with BatchNorm folded and every folded convolution (+ bias, + residual, ReLU) one call
    of the Triton kernel (engine/models/triton_conv.py), in the backend's precision, on its device; the
    classifier itself when it is not a ResNet. `fuse_blocks`: each stride-1 BasicBlock with an identity
    shortcut one kernel call instead (its intermediate activation stays on chip). A UserError with the
    reason where the kernel cannot run on the device. On CUDA the kernels are first checked (and autotuned)
    at the run's call shape, `probe_batch` images, against the folded network in fp32 (checked_triton); if
    they are further off than the run's precision allows, the folded network runs on torch's convolutions
    instead, with a message."""
    from diffsmooth.engine.models.triton_conv import TRITON_FALLBACKS, triton_conv_unavailable, tritonize
    log = log or (lambda message: None)
    why = triton_conv_unavailable(backend.device)
    if why is not None:
        raise UserError(f"`triton_conv` cannot run here: {why}")
    folded = _folded_on_device(classifier, backend, "triton_conv", log)
    if folded is None:
        return classifier
    fast = tritonize(folded, fuse_blocks=fuse_blocks)
    if backend.device.type != "cuda":
        return fast
    x = torch.rand(max(1, int(probe_batch)), *image_shape, device=backend.device)     # autotunes this shape
    exact = _folded_fp32(classifier, backend)
    before = dict(TRITON_FALLBACKS)
    chosen = checked_triton(fast, folded, x.contiguous(memory_format=torch.channels_last), log, exact)
    del exact
    fell_back = {r: n - before.get(r, 0) for r, n in TRITON_FALLBACKS.items() if n != before.get(r, 0)}
    if fell_back:
        log(f"# `triton_conv`: calls the kernels do not take run on conv2d: {fell_back}")
    return chosen


def checked_triton(fast: nn.Module, folded: nn.Module, x: torch.Tensor, log,
                   exact: Optional[nn.Module] = None) -> nn.Module:
    """`fast` (tritonized) when its scores on x are as close to the fp32 folded network's (`exact`; `folded`
    itself when None) as the folded network in the run's precision is (fusion_verdict), else `folded`,
    left on torch's convolutions for the run, with a message. The references run on torch's conv2d with
    cuDNN's runtime-fused kernels (which an H200 refused) off, and the fp32 one without TF32."""
    saved = CUDNN_FUSION["enabled"]
    CUDNN_FUSION["enabled"] = False
    try:
        with torch.inference_mode():
            expected = folded(x).float()
            got = fast(x).float()
            truth = fp32_scores(exact, x)
    finally:
        CUDNN_FUSION["enabled"] = saved
    problem = fusion_verdict(got, expected, truth)
    if problem is not None:
        CUDNN_FUSION["enabled"] = False
        log(f"# `triton_conv`: the Triton kernels at {x.shape[0]} images: {problem}; the folded classifier runs "
            f"on torch's convolutions")
        return folded
    diff = float((got - (expected if truth is None else truth)).abs().max()) if got.numel() else 0.0
    log(f"# `triton_conv`: checked at {x.shape[0]} images against the folded reference (max |diff| {diff:.3g})")
    return fast


def check_classifier_rewrites(fused_conv: bool, triton_conv: bool, pack_images: Optional[int]) -> None:
    """The classifier rewrites that cannot go together, refused in one line (the one rule for the run options,
    FastPath and bench variants): each replaces or reshapes the same convolutions."""
    if fused_conv and triton_conv:
        raise UserError("`fused_conv` and `triton_conv` are two kernels for the same folded convolutions: pick one")
    if pack_images and (fused_conv or triton_conv):
        raise UserError("`pack_images` widens the convolutions that `fused_conv` / `triton_conv` replace: pick one")


def build_torch_stages(config: MethodConfig, classifier: nn.Module, denoiser, backend, image_shape: Tuple[int, ...],
                       num_classes: Optional[int] = None, fast=None, classifier_batch: int = 8) -> BaseClassifierStages:
    """A single run's stages on a TorchRunner: the torch path's sweep of one (torch_stages), scores [B, K]."""
    return torch_stages(Configuration(config, "classifier"), {"classifier": classifier}, denoiser, backend,
                        image_shape, num_classes, fast, classifier_batch)


def torch_stages(run, classifiers: Dict[str, nn.Module], denoiser, backend, image_shape: Tuple[int, ...],
                 num_classes: Optional[int] = None, fast=None, classifier_batch: int = 8) -> BaseClassifierStages:
    """The stages of `run` on a TorchRunner (messages to its log), one path: a single run (`run` one Configuration:
    scores [B, K]) is a sweep of one (`run` several: one module scoring all, [B, E, K]); purifier_config's purify
    stage serves every one. `classifiers`: by the configurations' classifier names; `fast`: the run's FastPath (None:
    eager), whose UNet kernels the purifier reads and whose classifier rewrite (single runs) rewritten_classifier
    applies; classifier_batch: images per classifier call in the run (where fused convolutions are probed)."""
    single = isinstance(run, Configuration)
    configs = [run] if single else list(run)
    if denoiser is None and any(c.config.purifier.denoises for c in configs):
        raise UserError(f"method {configs[0].config.name} needs a denoiser checkpoint (`denoiser`)" if single else
                        "the sweep's denoising configurations need `denoiser` CHECKPOINT")
    used = {c.classifier: classifiers[c.classifier] for c in configs}
    if not single:
        check_classes(used, image_shape, torch.device("cpu"))
    used = {name: rewritten_classifier(module, backend, image_shape, fast, classifier_batch)
            for name, module in used.items()}
    shared = purifier_config(configs)
    purify = shared.purifier.stage(shared.sigma, denoiser, backend, fast) if shared is not None else None
    heads = ConfigurationHeads(configs, used, image_shape, stacked=not single)
    score = backend.for_classifier().stage(heads, run.config.method.head.label if single else
                                           f"{len(configs)} configurations")
    if single:
        return probed(method_stages(run.config, purify, score, image_shape, num_classes), image_shape, num_classes)
    return checked_stages(configs, purify, score, heads.noise_shape, inputs_of(configs), image_shape, num_classes)


def rewritten_classifier(classifier: nn.Module, backend, image_shape: Tuple[int, ...], fast, classifier_batch: int):
    """The classifier with the fast path's rewrite, if it asks one (check_classifier_rewrites: at most one)."""
    def wants(name: str):
        return getattr(fast, name, None) if fast is not None else None
    log = getattr(backend, "log", None)
    fused_conv, triton_conv, pack_images = bool(wants("fused_conv")), bool(wants("triton_conv")), wants("pack_images")
    check_classifier_rewrites(fused_conv, triton_conv, pack_images)
    if pack_images:
        return pack_classifier(classifier, pack_images, log)
    if fused_conv:
        return folded_classifier(classifier, backend, image_shape, log, classifier_batch)
    if triton_conv:
        return tritonized_classifier(classifier, backend, image_shape, log, classifier_batch, bool(wants("triton_blocks")))
    return classifier


def method_stages(config: MethodConfig, purify, score, image_shape: Tuple[int, ...],
                  num_classes: Optional[int]) -> BaseClassifierStages:
    """The stages of `config`'s method from its built purify and score stages, on any backend: what the method
    says its purifier takes and returns and how far its fast path's scores may move."""
    method = config.method
    return BaseClassifierStages(config.name, purify, score, num_classes or 0,
                                config.head.fresh_noise_shape(image_shape),
                                purify_noise=method.purifier.draws_noise and config.purifier.purifies,
                                purified_shape=config.purifier.purified_shape(image_shape),
                                score_tolerance=method.score_tolerance(config))

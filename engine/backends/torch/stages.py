"""A method's stages on the torch backend: the denoiser's purifier and the method's score head, with the classifier
rewrites of the fast path (folded, fused, Triton, packed), probed once (base_classifier/probe.py)."""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import nn

from diffsmooth.engine.backends.torch.runner import AUTOCAST_DTYPES
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


def build_torch_stages(config: MethodConfig, classifier: nn.Module, denoiser, backend,
                       image_shape: Tuple[int, ...], num_classes: Optional[int] = None, fast=None,
                       classifier_batch: int = 8) -> BaseClassifierStages:
    """Stages for `config` on a TorchRunner (messages to its log); checks once that the models take `image_shape`.
    `fast`: the run's fast path (a FastPath, engine/runs/fast_path.py; None: eager), of which this reads the
    kernels: for the UNet fused attention and the lean UNet (its eps-only copy, t*'s embedding once per call:
    DiffusionDenoiser.purifier); for a ResNet classifier fused convolutions (folded_classifier), the Triton
    convolution (tritonized_classifier; `triton_blocks`: each stride-1 BasicBlock one kernel) or packed images
    (a CIFAR ResNet's first stage on that many images per tensor, engine/models/packed_resnet.py).
    classifier_batch: images per classifier call in the run (where fused convolutions are probed)."""
    def wants(name: str):
        return getattr(fast, name, None) if fast is not None else None
    log = getattr(backend, "log", None)
    fused_conv, triton_conv, pack_images = bool(wants("fused_conv")), bool(wants("triton_conv")), wants("pack_images")
    if config.purifier.denoises and denoiser is None:
        raise UserError(f"method {config.name} needs a denoiser checkpoint (`denoiser`)")
    check_classifier_rewrites(fused_conv, triton_conv, pack_images)
    if pack_images:
        classifier = pack_classifier(classifier, pack_images, log)
    elif fused_conv:
        classifier = folded_classifier(classifier, backend, image_shape, log, classifier_batch)
    elif triton_conv:
        classifier = tritonized_classifier(classifier, backend, image_shape, log, classifier_batch,
                                           bool(wants("triton_blocks")))
    method = config.method
    purify = config.purifier.stage(config.sigma, denoiser, backend, fast) if config.purifier.purifies else None
    head = score_module(config, classifier, image_shape)
    score = backend.for_classifier().stage(head, method.head.label)
    return probed(method_stages(config, purify, score, image_shape, num_classes), image_shape, num_classes)


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

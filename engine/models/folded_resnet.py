"""Inference copies of the ResNet classifiers with every BatchNorm folded into its convolution and
convolution (+ residual add) + ReLU as one call: one fused cuDNN kernel on CUDA.

Why: Cohen's CIFAR ResNet-110 has 16-64 channels, so its time goes to memory traffic. Compiled as
written, each block writes every activation from the convolution, then reads and writes it again in
an inductor BN/add/ReLU kernel; cuDNN's fused convolution-bias-add-ReLU writes it once. inductor
does not fuse into cuDNN convolutions, hence the hand-written op. Off CUDA the op is conv2d + add +
relu. It is a torch custom op with a fake implementation, so torch.compile and CUDA graphs see
through it. Folding is exact algebra (w * gamma / sqrt(var + eps), beta - mean * gamma / sqrt(var +
eps)) evaluated in float64; only rounding differs from the unfolded network.
"""

from __future__ import annotations

from typing import List, Optional

import torch
import torch.nn.functional as F
from torch import nn

from diffsmooth.engine.errors import first_line
from diffsmooth.engine.models.resnet import BasicBlock, Bottleneck, CifarResNet, NormalizedClassifier, ResNet50

__all__ = ["fold_classifier", "fold_net", "FoldedConv", "conv_bias_add_relu", "probe_cudnn_fusion", "check_fusion",
           "fusion_verdict", "fp32_scores", "CUDNN_FUSION", "FUSED_CALLS"]


def _output_format(x: torch.Tensor) -> torch.memory_format:
    """The layout of the op's output: the input's (channels_last stays channels_last)."""
    if x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    return torch.contiguous_format


# Whether the CUDA kernel may call cuDNN's fused convolutions; probe_cudnn_fusion turns it off
# (with a message) on a GPU / cuDNN where they fail or disagree.
CUDNN_FUSION = {"enabled": True}


def _reference(x, weight, bias, residual, stride, padding, relu):
    out = F.conv2d(x, weight, bias, stride, padding)
    if residual is not None:
        out = out + residual
    if relu:
        out = F.relu(out)
    return out.contiguous(memory_format=_output_format(x))


@torch.library.custom_op("diffsmooth::conv_bias_add_relu", mutates_args=())
def conv_bias_add_relu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, residual: Optional[torch.Tensor],
                       stride: int, padding: int, relu: bool) -> torch.Tensor:
    """relu?(conv2d(x, weight, bias) + residual?) — the reference maths (any device)."""
    return _reference(x, weight, bias, residual, stride, padding, relu)


def _fusable(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """cuDNN's runtime-fused kernels want NHWC (channels_last) tensors and channel counts that are
    multiples of 8 (not the RGB stem); anything else takes the reference path."""
    nhwc = torch.channels_last
    return (x.shape[1] % 8 == 0 and weight.shape[0] % 8 == 0 and _output_format(x) == nhwc
            and weight.is_contiguous(memory_format=nhwc))


# How often the CUDA kernel took the cuDNN fused call (Python calls: captured replays are not counted);
# the GPU test reads it to know the fused kernel was reached.
FUSED_CALLS = {"count": 0}


@conv_bias_add_relu.register_kernel("cuda")
def _conv_bias_add_relu_cuda(x, weight, bias, residual, stride, padding, relu):
    """One cuDNN call (convolution, bias, optional add, ReLU fused) where it has one."""
    if not (relu and CUDNN_FUSION["enabled"] and _fusable(x, weight)):
        return _reference(x, weight, bias, residual, stride, padding, relu)
    return _cudnn_fused(x, weight, bias, residual, stride, padding)


def _cudnn_fused(x, weight, bias, residual, stride, padding):
    """cuDNN's conv + bias + add + ReLU. Without a residual the added tensor is an explicit zero:
    torch.cudnn_convolution_relu adds its own uninitialised output with alpha 0, and 0 x NaN is NaN."""
    FUSED_CALLS["count"] += 1
    if residual is None:
        n, _, h, w = x.shape
        k_h, k_w = weight.shape[-2:]
        shape = (n, weight.shape[0], (h + 2 * padding - k_h) // stride + 1, (w + 2 * padding - k_w) // stride + 1)
        residual = torch.zeros((shape[0], shape[2], shape[3], shape[1]), dtype=x.dtype, device=x.device).permute(0, 3, 1, 2)
    out = torch.cudnn_convolution_add_relu(x, weight, residual, 1.0, bias, [stride] * 2, [padding] * 2, [1, 1], 1)
    return out.contiguous(memory_format=_output_format(x))


def fusion_verdict(got: torch.Tensor, expected: torch.Tensor, truth: Optional[torch.Tensor] = None) -> Optional[str]:
    """Why a kernel's outputs `got` cannot be trusted (None when they can): any NaN/Inf, another shape, or too far
    off. `expected`: torch's maths in the run's precision; `truth`: the fp32 network's outputs, when given. Too far:
    off `truth` by more than twice what `expected` is, plus 1e-2 x (1 + max |truth|); without `truth`, off
    `expected` by more than that last term. A deep fp16 net of random weights drifts from fp32 by more than the
    last term alone (0.08-0.18 on ResNet-110 on an H200), which refused kernels as exact as torch's own.
    A NaN difference compares False, so finiteness is checked first."""
    if not bool(torch.isfinite(got).all()):
        bad = int((~torch.isfinite(got)).sum())
        return f"{bad} of {got.numel()} outputs are NaN/Inf"
    if not bool(torch.isfinite(expected).all()):
        return "the unfused reference itself gives NaN/Inf"
    what = "torch's convolutions" if truth is None else "fp32"
    truth = expected if truth is None else truth
    if got.shape != truth.shape or expected.shape != truth.shape:
        return f"their outputs have shape {tuple(got.shape)}, not {tuple(truth.shape)}"
    if not got.numel():
        return None
    truth = truth.float()
    diff = float((got.float() - truth).abs().max())
    allowed = 2.0 * float((expected.float() - truth).abs().max()) + 1e-2 * (1.0 + float(truth.abs().max()))
    if diff > allowed:
        return f"they disagree with {what} (max |diff| {diff:.3g}, allowed {allowed:.3g})"
    return None


def fp32_scores(exact: Optional[nn.Module], x: torch.Tensor) -> Optional[torch.Tensor]:
    """The fp32 network's scores on x without TF32 (fusion_verdict's truth); None without the network."""
    if exact is None:
        return None
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        return exact(x.float()).float()


def check_fusion(folded: nn.Module, x: torch.Tensor, log, exact: Optional[nn.Module] = None) -> bool:
    """Run `folded` on x with and without cuDNN fusion; keep fusion only when it runs, every output
    is finite and it agrees with the unfused path (with the fp32 folded network `exact`, as
    fusion_verdict allows, when given). Returns whether kept."""
    with torch.inference_mode():
        CUDNN_FUSION["enabled"] = False
        expected = folded(x).float()
        truth = fp32_scores(exact, x)
        CUDNN_FUSION["enabled"] = True
        try:
            got = folded(x).float()
            if x.is_cuda:
                torch.cuda.synchronize(x.device)
        except RuntimeError as exc:
            CUDNN_FUSION["enabled"] = False
            log(f"# cuDNN fused convolutions failed on this GPU ({first_line(exc)}); "
                f"the folded classifier runs unfused")
            return False
    problem = fusion_verdict(got, expected, truth)
    if problem is not None:
        CUDNN_FUSION["enabled"] = False
        log(f"# cuDNN fused convolutions at batch {x.shape[0]}: {problem}; the folded classifier runs unfused")
        return False
    diff = float((got - expected).abs().max()) if got.numel() else 0.0
    log(f"# cuDNN fused convolution + bias + add + ReLU in the classifier at batch {x.shape[0]}: "
        f"checked (all finite, max |diff| {diff:.3g})")
    return True


def probe_cudnn_fusion(folded: nn.Module, image_shape, log, batch: int = 8, exact: Optional[nn.Module] = None) -> bool:
    """check_fusion on `batch` random images (CUDA only): `batch` is the run's own classifier call
    (images per call after local smoothing), because cuDNN picks its kernel per shape; `exact`: the fp32
    folded network, the truth the check measures both paths against."""
    device = next(folded.buffers()).device
    if device.type != "cuda":
        return False
    x = torch.rand(max(1, int(batch)), *image_shape, device=device).contiguous(memory_format=torch.channels_last)
    return check_fusion(folded, x, log, exact)


@conv_bias_add_relu.register_fake
def _conv_bias_add_relu_fake(x, weight, bias, residual, stride, padding, relu):
    n, _, h, w = x.shape
    k_h, k_w = weight.shape[-2:]
    shape = (n, weight.shape[0], (h + 2 * padding - k_h) // stride + 1, (w + 2 * padding - k_w) // stride + 1)
    return torch.empty(shape, dtype=x.dtype, device=x.device, memory_format=_output_format(x))


class FoldedConv(nn.Module):
    """A square conv with its BatchNorm folded in, then + residual (optional) and ReLU (optional)."""

    def __init__(self, conv: nn.Conv2d, bn: nn.BatchNorm2d, relu: bool, dtype: torch.dtype):
        super().__init__()
        if conv.groups != 1 or conv.dilation != (1, 1) or len(set(conv.stride)) != 1 or len(set(conv.padding)) != 1:
            raise ValueError("FoldedConv folds plain square convolutions only")
        scale = bn.weight.double() / torch.sqrt(bn.running_var.double() + bn.eps)
        bias = bn.bias.double() - bn.running_mean.double() * scale
        if conv.bias is not None:
            bias = bias + conv.bias.double() * scale
        self.register_buffer("weight", (conv.weight.double() * scale[:, None, None, None]).to(dtype))
        self.register_buffer("bias", bias.to(dtype))
        self.stride, self.padding, self.relu = conv.stride[0], conv.padding[0], bool(relu)

    def forward(self, x: torch.Tensor, residual: Optional[torch.Tensor] = None) -> torch.Tensor:
        x = x.to(self.weight.dtype)
        residual = residual.to(self.weight.dtype) if residual is not None else None
        return conv_bias_add_relu(x, self.weight, self.bias, residual, self.stride, self.padding, self.relu)


class FoldedBlock(nn.Module):
    """A residual block: its convolutions in order, the last one adding the shortcut before its ReLU."""

    def __init__(self, convs: List[FoldedConv], shortcut: Optional[FoldedConv]):
        super().__init__()
        self.convs = nn.ModuleList(convs)
        self.shortcut = shortcut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.shortcut is None else self.shortcut(x)
        h = x
        for conv in self.convs[:-1]:
            h = conv(h)
        return self.convs[-1](h, identity)


class FoldedNet(nn.Module):
    """stem (conv+BN+ReLU, optional max-pool) -> residual blocks -> global pool -> fc."""

    def __init__(self, stem: FoldedConv, pool: Optional[nn.Module], blocks: List[FoldedBlock], avgpool: nn.Module,
                 fc: nn.Linear):
        super().__init__()
        self.stem, self.pool, self.blocks, self.avgpool, self.fc = stem, pool, nn.ModuleList(blocks), avgpool, fc

    # Feed the convolutions NHWC: None = on CUDA only (where cuDNN's fused kernels need it); tests set True.
    nhwc: Optional[bool] = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        nhwc = (x.is_cuda if self.nhwc is None else self.nhwc) and x.dim() == 4
        if nhwc:
            x = x.contiguous(memory_format=torch.channels_last)
        x = self.stem(x)
        if self.pool is not None:
            x = self.pool(x)
        if nhwc:
            # A one-channel image is NCHW and NHWC at once, so the stem's output comes back NCHW and no
            # later convolution would be fused (the H200 GPU test caught it on the Fashion-MNIST demo).
            x = x.contiguous(memory_format=torch.channels_last)
        for block in self.blocks:
            x = block(x)
        return self.fc(torch.flatten(self.avgpool(x), 1).to(self.fc.weight.dtype))


def _fold_block(block: nn.Module, dtype: torch.dtype) -> FoldedBlock:
    shortcut = (FoldedConv(block.downsample[0], block.downsample[1], relu=False, dtype=dtype)
                if block.downsample is not None else None)
    if isinstance(block, BasicBlock):
        pairs = [(block.conv1, block.bn1), (block.conv2, block.bn2)]
    else:
        pairs = [(block.conv1, block.bn1), (block.conv2, block.bn2), (block.conv3, block.bn3)]
    return FoldedBlock([FoldedConv(c, b, relu=True, dtype=dtype) for c, b in pairs], shortcut)


def fold_net(net: nn.Module, dtype: torch.dtype = torch.float32) -> Optional[FoldedNet]:
    """The folded copy of a CifarResNet or ResNet50 (eval-mode maths), or None for other networks."""
    if not isinstance(net, (CifarResNet, ResNet50)):
        return None
    blocks = [_fold_block(b, dtype) for layer in (net.layer1, net.layer2, net.layer3, getattr(net, "layer4", None))
              if layer is not None for b in layer if isinstance(b, (BasicBlock, Bottleneck))]
    fc = nn.Linear(net.fc.in_features, net.fc.out_features).to(dtype)
    with torch.no_grad():
        fc.weight.copy_(net.fc.weight)
        fc.bias.copy_(net.fc.bias)
    return FoldedNet(FoldedConv(net.conv1, net.bn1, relu=True, dtype=dtype), getattr(net, "maxpool", None), blocks,
                     net.avgpool, fc)


def fold_classifier(classifier: nn.Module, dtype: torch.dtype = torch.float32) -> Optional[nn.Module]:
    """Sequential(normalisation, folded net) for a NormalizedClassifier over a CIFAR ResNet or
    ResNet-50, in `dtype`; None when the classifier is anything else (it then runs unfolded)."""
    if not isinstance(classifier, NormalizedClassifier):
        return None
    folded = fold_net(classifier.net, dtype)
    return None if folded is None else NormalizedClassifier(classifier.normalization, folded)

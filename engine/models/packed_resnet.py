"""A CIFAR ResNet whose narrow first stage runs several images per tensor (`--pack-images K`).

The stem and the first stage of Cohen's CIFAR ResNets have 16 channels at 32 x 32. On an H200, cuDNN ran
those convolutions at 0.62 TB/s and 45 TFLOP/s, against 1.6 TB/s and 236 TFLOP/s for the 32-channel convolutions
of the next stage, which do the same FLOPs (kernel profile of bench/results/h200-2026-11-27/speed/profile/). Here K images
share one tensor of K x 16 channels, and the convolutions' weights are block-diagonal: image j reads and
writes only channels 16j..16j+15. The maths is unchanged, because every added product is a zero weight times
an activation. cuDNN then sees the wider shape it runs well; the zero blocks cost K times the FLOPs of a stage
that is bound by memory traffic, not by FLOPs. The tensors are unpacked before the second stage. Whether this
is faster is measured on a GPU (docs/performance.md); status: docs/status.md.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from diffsmooth.engine.errors import UserError
from diffsmooth.engine.models.resnet import BasicBlock, CifarResNet, NormalizedClassifier

__all__ = ["PACKINGS", "PackedCifarResNet", "pack_classifier", "packing"]

PACKINGS = (1, 2, 4)       # images per tensor in the first stage (1: the network as it is)


def packing(value) -> Optional[int]:
    """`pack_images` as the engine keeps it: None when off (None or 1), else 2 or 4; a UserError otherwise."""
    if value is None or (value == 1 and not isinstance(value, bool)):
        return None
    if isinstance(value, bool) or value not in PACKINGS[1:]:
        raise UserError(f"`pack_images` must be one of {', '.join(map(str, PACKINGS))}, got {value!r}")
    return int(value)


def _block_diagonal(conv: nn.Conv2d, k: int) -> nn.Conv2d:
    """conv repeated k times along the diagonal of a k-times wider convolution (zeros elsewhere)."""
    if conv.groups != 1 or conv.bias is not None:
        raise UserError(f"`pack_images`: a convolution with groups={conv.groups} or a bias is not a Cohen ResNet's")
    out_c, in_c = conv.out_channels, conv.in_channels
    wide = nn.Conv2d(k * in_c, k * out_c, conv.kernel_size, stride=conv.stride, padding=conv.padding, bias=False)
    with torch.no_grad():
        weight = torch.zeros((k * out_c, k * in_c, *conv.kernel_size), dtype=conv.weight.dtype,
                             device=conv.weight.device)
        for j in range(k):
            weight[j * out_c:(j + 1) * out_c, j * in_c:(j + 1) * in_c] = conv.weight
    wide.weight = nn.Parameter(weight, requires_grad=False)
    return wide


def _tiled(bn: nn.BatchNorm2d, k: int) -> nn.BatchNorm2d:
    """bn's per-channel statistics and affine terms repeated for k packed images (eval-mode BatchNorm)."""
    wide = nn.BatchNorm2d(k * bn.num_features, eps=bn.eps, momentum=bn.momentum, affine=bn.affine,
                          track_running_stats=bn.track_running_stats)
    with torch.no_grad():
        if bn.affine:
            wide.weight = nn.Parameter(bn.weight.detach().repeat(k), requires_grad=False)
            wide.bias = nn.Parameter(bn.bias.detach().repeat(k), requires_grad=False)
        if bn.track_running_stats:
            wide.running_mean = bn.running_mean.detach().repeat(k)
            wide.running_var = bn.running_var.detach().repeat(k)
            wide.num_batches_tracked = bn.num_batches_tracked.detach().clone()
    return wide.eval()


def _packed_block(block: BasicBlock, k: int) -> BasicBlock:
    """A stride-1 identity-shortcut BasicBlock for k packed images (the first stage's every block)."""
    if block.downsample is not None or block.conv1.stride != (1, 1):
        raise UserError("`pack_images`: the first stage has a block that changes shape; not a Cohen CIFAR ResNet")
    wide = BasicBlock(k * block.conv1.in_channels, k * block.conv1.out_channels)
    wide.conv1, wide.bn1 = _block_diagonal(block.conv1, k), _tiled(block.bn1, k)
    wide.conv2, wide.bn2 = _block_diagonal(block.conv2, k), _tiled(block.bn2, k)
    return wide.eval()


class PackedCifarResNet(nn.Module):
    """`net` (a CifarResNet) with its stem and first stage run on k images per tensor, block-diagonal weights
    (module docstring). Batches that k does not divide get zero images appended, whose scores are dropped."""

    def __init__(self, net: CifarResNet, k: int):
        super().__init__()
        if packing(k) is None:
            raise UserError("`pack_images`: a packed network holds 2 or 4 images per tensor, not 1")
        self.images_per_tensor = int(k)
        self.conv1, self.bn1 = _block_diagonal(net.conv1, k), _tiled(net.bn1, k)
        self.layer1 = nn.Sequential(*(_packed_block(block, k) for block in net.layer1))
        self.layer2, self.layer3, self.avgpool, self.fc = net.layer2, net.layer3, net.avgpool, net.fc

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k, n = self.images_per_tensor, x.shape[0]
        channels_last = x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
        padding = -n % k
        if padding:
            x = torch.cat([x, x.new_zeros((padding, *x.shape[1:]))])
        b, c, h, w = x.shape
        x = self._layout(x.reshape(b // k, k * c, h, w), channels_last)      # image j of a group: channels jc..
        x = self.layer1(F.relu(self.bn1(self.conv1(x))))
        x = self._layout(x.reshape(b, x.shape[1] // k, *x.shape[2:]), channels_last)
        x = self.layer3(self.layer2(x))
        return self.fc(torch.flatten(self.avgpool(x), 1))[:n]

    @staticmethod
    def _layout(x: torch.Tensor, channels_last: bool) -> torch.Tensor:
        # reshape keeps NCHW order; a channels_last caller (the CUDA fast path) gets its layout back
        return x.contiguous(memory_format=torch.channels_last) if channels_last else x


def pack_classifier(classifier: nn.Module, k: int, log=None) -> nn.Module:
    """The classifier with its first stage packed k images per tensor (PackedCifarResNet), built from its
    eval-mode weights; the classifier itself for k = 1, or, with a message, when it is not a CIFAR ResNet."""
    log = log or (lambda message: None)
    k = packing(k)
    if k is None:
        return classifier
    net: Optional[nn.Module] = getattr(classifier, "net", None)
    if not isinstance(classifier, NormalizedClassifier) or not isinstance(net, CifarResNet):
        log(f"# `pack_images`: {type(net if net is not None else classifier).__name__} is not a CIFAR ResNet; "
            f"it runs as it is")
        return classifier
    return NormalizedClassifier(classifier.normalization, PackedCifarResNet(net.eval(), k)).eval()

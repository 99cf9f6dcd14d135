"""Base classifiers of randomized smoothing (Cohen et al. CIFAR ResNets, torchvision-layout ResNet-50).

Module names match the checkpoints of Cohen et al. / SmoothAdv / DiffSmooth, which store
Sequential(normalisation layer, net): the parameter-free normalisation layer is index 0 and the
network's keys start with `1.` (`1.module.` for the DataParallel ImageNet ResNet-50).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from diffsmooth.engine.choices import NORMALIZATIONS
from diffsmooth.engine.errors import UserError

__all__ = [
    "BasicBlock",
    "Bottleneck",
    "CifarResNet",
    "GlobalAvgPool",
    "ResNet50",
    "ARCHITECTURES",
    "build_classifier_net",
    "NormalizeLayer",
    "InputCenterLayer",
    "DATASET_STATS",
    "DEFAULT_NORMALIZATION",
    "NORMALIZATION_MODES",
    "normalization_layer",
    "NormalizedClassifier",
]


# ---------------------------------------------------------------------------------------------
# Residual blocks
# ---------------------------------------------------------------------------------------------


def _shortcut(in_planes: int, out_planes: int, stride: int) -> nn.Sequential | None:
    """Projection shortcut (1x1 conv + BN, keys downsample.0/.1) when the shape changes, else None."""
    if stride == 1 and in_planes == out_planes:
        return None
    return nn.Sequential(
        nn.Conv2d(in_planes, out_planes, kernel_size=1, stride=stride, bias=False), nn.BatchNorm2d(out_planes)
    )


class BasicBlock(nn.Module):
    """Two 3x3 conv+BN layers with an identity or projection shortcut (stride on the first conv)."""

    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = _shortcut(in_planes, planes, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return F.relu(out + identity)


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (carrying the stride, torchvision "v1.5"), 1x1 expand by 4, plus shortcut."""

    expansion = 4

    def __init__(self, in_planes: int, planes: int, stride: int = 1):
        super().__init__()
        out_planes = planes * self.expansion
        self.conv1 = nn.Conv2d(in_planes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out_planes, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_planes)
        self.downsample = _shortcut(in_planes, out_planes, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        identity = x if self.downsample is None else self.downsample(x)
        return F.relu(out + identity)


def _stage(block: type[nn.Module], in_planes: int, planes: int, blocks: int, stride: int) -> nn.Sequential:
    layers = [block(in_planes, planes, stride)]
    layers += [block(planes * block.expansion, planes) for _ in range(1, blocks)]
    return nn.Sequential(*layers)


def _init_weights(model: nn.Module) -> None:
    """He-normal (fan_out) convs and unit/zero BatchNorm, the usual initialisation of both families."""
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


# ---------------------------------------------------------------------------------------------
# Networks
# ---------------------------------------------------------------------------------------------


class GlobalAvgPool(nn.Module):
    """Average over the whole feature map, to [B, C, 1, 1] (accepts any input size).

    Eagerly it is avg_pool2d with a kernel the size of the map: bit-identical to Cohen's
    AvgPool2d(8) at 32x32 inputs (adaptive pooling differs in the last bits on CPU); traced or
    exported it is adaptive pooling, which becomes ONNX GlobalAveragePool for any size.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.jit.is_tracing() or torch.onnx.is_in_onnx_export():
            return F.adaptive_avg_pool2d(x, 1)
        return F.avg_pool2d(x, kernel_size=(int(x.shape[-2]), int(x.shape[-1])))


class CifarResNet(nn.Module):
    """Cohen et al.'s CIFAR ResNet (depth 6n+2, widths 16/32/64, BasicBlocks, global average pool).

    The global pool equals the original AvgPool2d(8) at 32x32 and also accepts other sizes (28x28, ...).
    """

    def __init__(self, depth: int, num_classes: int = 10, in_channels: int = 3):
        super().__init__()
        if depth < 8 or (depth - 2) % 6:
            raise UserError(f"CIFAR ResNet depth must be 6n+2 (20, 32, 44, 56, 110, ...), got {depth}")
        n = (depth - 2) // 6
        self.conv1 = nn.Conv2d(in_channels, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.layer1 = _stage(BasicBlock, 16, 16, n, 1)
        self.layer2 = _stage(BasicBlock, 16, 32, n, 2)
        self.layer3 = _stage(BasicBlock, 32, 64, n, 2)
        self.avgpool = GlobalAvgPool()
        self.fc = nn.Linear(64, num_classes)
        _init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class ResNet50(nn.Module):
    """ResNet-50 in torchvision's module layout (7x7/2 stem, max-pool, Bottleneck stages 3-4-6-3)."""

    def __init__(self, num_classes: int = 1000, in_channels: int = 3):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = _stage(Bottleneck, 64, 64, 3, 1)
        self.layer2 = _stage(Bottleneck, 256, 128, 4, 2)
        self.layer3 = _stage(Bottleneck, 512, 256, 6, 2)
        self.layer4 = _stage(Bottleneck, 1024, 512, 3, 2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(2048, num_classes)
        _init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


# name -> (builder, default number of classes)
ARCHITECTURES: dict[str, tuple[Callable[..., nn.Module], int]] = {
    "cifar_resnet20": (partial(CifarResNet, 20), 10),               # Cohen-style CIFAR ResNet-20
    "cifar_resnet110": (partial(CifarResNet, 110), 10),             # Cohen-style, 1.73M parameters at 10 classes
    "imagenet32_resnet110": (partial(CifarResNet, 110), 1000),      # the same for downsampled ImageNet 32x32
    "resnet50": (ResNet50, 1000),                                   # torchvision layout
}


def build_classifier_net(arch: str, num_classes: int | None = None, in_channels: int = 3) -> nn.Module:
    """Build the bare network (no normalisation layer) for an architecture name used in the checkpoints."""
    if arch not in ARCHITECTURES:
        raise UserError(f"unknown classifier architecture {arch!r}; known: {', '.join(ARCHITECTURES)}")
    builder, default_classes = ARCHITECTURES[arch]
    num_classes = default_classes if num_classes is None else num_classes
    for name, v in (("num_classes", num_classes), ("in_channels", in_channels)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise UserError(f"{name} must be a positive integer, got {v!r}")
    return builder(num_classes=num_classes, in_channels=in_channels)


# ---------------------------------------------------------------------------------------------
# Input normalisation (parameter-free: nothing of it is stored in checkpoints)
# ---------------------------------------------------------------------------------------------

DATASET_STATS: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)),
    "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    "fashion-mnist": ((0.2860,), (0.3530,)),
}

# Default normalisation per dataset. Checkpoints do not record it: Cohen et al.'s models divide by
# the std ("normalize"), while SmoothAdv's ImageNet and most of its CIFAR-10 models only subtract the
# mean ("center"). It is therefore a user setting; these are only the defaults.
DEFAULT_NORMALIZATION: dict[str, str] = {
    "cifar10": "normalize",
    "imagenet": "normalize",
    "fashion-mnist": "normalize",
}

NORMALIZATION_MODES = NORMALIZATIONS


def _channel_buffer(values: Sequence[float]) -> torch.Tensor:
    return torch.tensor([float(v) for v in values], dtype=torch.float32).reshape(1, -1, 1, 1)


class NormalizeLayer(nn.Module):
    """(x - mean) / std per channel; buffers are non-persistent so the state dict stays empty."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]):
        super().__init__()
        if len(mean) != len(std):
            raise UserError(f"normalisation mean has {len(mean)} channels but std has {len(std)}")
        self.register_buffer("mean", _channel_buffer(mean), persistent=False)
        self.register_buffer("std", _channel_buffer(std), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std

    def extra_repr(self) -> str:
        return f"mean={self.mean.flatten().tolist()}, std={self.std.flatten().tolist()}"


class InputCenterLayer(nn.Module):
    """x - mean per channel (SmoothAdv's mean-only normalisation); non-persistent buffer."""

    def __init__(self, mean: Sequence[float]):
        super().__init__()
        self.register_buffer("mean", _channel_buffer(mean), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x - self.mean

    def extra_repr(self) -> str:
        return f"mean={self.mean.flatten().tolist()}"


def _dataset_key(dataset: str) -> str:
    key = str(dataset).strip().lower().replace("_", "-")
    return {"fashionmnist": "fashion-mnist", "cifar-10": "cifar10"}.get(key, key)


def normalization_layer(mode: str, dataset: str | None) -> nn.Module:
    """The input layer for mode "normalize" | "center" | "none" with the dataset's mean/std."""
    if mode not in NORMALIZATION_MODES:
        raise UserError(f"unknown normalization {mode!r}; choose one of {', '.join(NORMALIZATION_MODES)}")
    if mode == "none":
        return nn.Identity()
    key = _dataset_key(dataset) if dataset is not None else None
    if key not in DATASET_STATS:
        raise UserError(f"no normalisation statistics for dataset {dataset!r}; known: {', '.join(DATASET_STATS)} "
                        f"(or normalization='none')")
    mean, std = DATASET_STATS[key]
    return NormalizeLayer(mean, std) if mode == "normalize" else InputCenterLayer(mean)


class NormalizedClassifier(nn.Sequential):
    """Sequential(normalisation, net): maps [0, 1] images to logits; state-dict keys start with `1.` like Cohen's."""

    def __init__(self, normalization: nn.Module, net: nn.Module):
        super().__init__(normalization, net)

    @property
    def normalization(self) -> nn.Module:
        return self[0]

    @property
    def net(self) -> nn.Module:
        return self[1]

"""Tiny stages shared by the pipeline tests: a tiny UNet denoiser and a small conv classifier
whose votes spread over several classes, and a ResNet with non-trivial BatchNorm statistics."""

import torch

from diffsmooth.engine.backends.torch.runner import TorchRunner
from diffsmooth.engine.backends.torch.stages import build_torch_stages
from diffsmooth.engine.base_classifier.methods import MethodConfig
from diffsmooth.engine.certify.monte_carlo import MonteCarloPipeline
from diffsmooth.engine.models.resnet import CifarResNet, NormalizedClassifier, build_classifier_net, normalization_layer
from diffsmooth.engine.runs.fast_path import FastPath

SHAPE = (3, 8, 8)


def build_tiny_stages():
    """diffsmooth stages (fresh local noise, m=3) on a tiny UNet and a small conv classifier whose
    votes spread over several classes (an untrained resnet20 votes one class only)."""
    from tiny_fixtures import random_unet

    from diffsmooth.engine.base_classifier.denoise import PRESET_SCHEDULES, DiffusionDenoiser
    unet = random_unet()
    denoiser = DiffusionDenoiser(unet, PRESET_SCHEDULES["cifar10"])
    classifier = spread_classifier(2)
    config = MethodConfig("diffsmooth", 0.5, m=3, local_sigma=0.25, local_noise="fresh")
    return config, denoiser, classifier


def spread_classifier(seed):
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                              torch.nn.Linear(8 * 64, 10)).eval()
    with torch.no_grad():
        net[3].weight.mul_(4)
    return net


def make_pipeline(tiny_stages, backend=None, fused_attention=False, fused_conv=False, classifier=None, **kw):
    config, denoiser, default_classifier = tiny_stages
    stages = build_torch_stages(config, classifier or default_classifier, denoiser, backend or TorchRunner(), SHAPE, 10,
                                FastPath(fused_attention=fused_attention, fused_conv=fused_conv))
    return MonteCarloPipeline(stages, config.sigma, seed=3, **kw)


def image(seed=0):
    return torch.rand(SHAPE, generator=torch.Generator().manual_seed(seed))



def randomize_batch_norm(net: torch.nn.Module) -> torch.nn.Module:
    """Every BatchNorm of `net` given non-trivial statistics and affine parameters (in place; returns net)."""
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.normal_(0, 0.1)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.0)
                m.bias.normal_(0, 0.05)
    return net


# The smallest CIFAR ResNet (depth 8, one BasicBlock per stage; not a registered architecture): every kind of layer
# the deeper ones have (the stem, 3x3 stride 1 and 2, the 1x1 stride-2 shortcuts, a stride-1 identity block) at a
# fraction of their compile and Triton-interpreter time. Tests whose claim is not about depth build this one.
RESNET8 = "cifar_resnet8"


def cifar_net(arch: str, channels: int = 3) -> torch.nn.Module:
    """build_classifier_net(arch, 10, channels), or the depth-8 CIFAR ResNet for RESNET8."""
    return CifarResNet(8, 10, channels) if arch == RESNET8 else build_classifier_net(arch, 10, channels)


def randomized_bn_resnet(arch: str, seed: int = 0, channels: int = 3) -> NormalizedClassifier:
    """A ResNet (an architecture name, or RESNET8) with non-trivial BatchNorm statistics (folding must use them)
    whose votes spread."""
    torch.manual_seed(seed)
    net = randomize_batch_norm(cifar_net(arch, channels))
    with torch.no_grad():
        net.fc.weight.normal_(0, 1.0)
    norm = normalization_layer("normalize", "cifar10") if channels == 3 else torch.nn.Identity()
    return NormalizedClassifier(norm, net).eval()


# The embedded demo image test_gpu.py's test_fused_conv_classifier_on_cuda counts (diffsmooth, sigma 0.5, m 5,
# 1000 samples): its votes must spread with the correct model. Image 5 (a trouser) does not: every sample votes
# class 1 on the CPU in fp32, unfolded or folded, which is what the H200 reported as a collapse. Image 0 spreads
# (classes 5, 7 and 9 on the CPU); tests/engine/models/test_fused_conv_demo.py checks it on the CPU.
GPU_FUSED_CONV_IMAGE = 0

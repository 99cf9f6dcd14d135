"""Where the paper's checkpoints and data come from, and what each source implies.

A table line may name its classifiers' `source`; that fixes the normalisation layer its checkpoints
were trained behind (the checkpoints do not record it) and tells `diffsmooth table --check` which
official key list the files must match and where a missing file is downloaded from. The download
places are the ones the reference repositories' READMEs give.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Source:
    """A family of official classifier checkpoints."""

    title: str
    normalization: Optional[str]            # the layer it was trained behind; None: the timm model's own stats
    where: str                              # how to obtain it, one line


COHEN_WHERE = ("Cohen et al.'s models.tar (https://github.com/locuslab/smoothing, README 'download our models'): "
               "extract it into MODELS/cohen so that MODELS/cohen/models/<dataset>/<arch>/noise_<s>/checkpoint.pth.tar exist")
SMOOTHADV_WHERE = ("SmoothAdv's models.tar.gz (https://github.com/Hadisalman/smoothing-adversarial, README 'Download our "
                   "pretrained models'): extract it into MODELS/smoothadv so that MODELS/smoothadv/pretrained_models/... exist")
BEIT_WHERE = ("DiffSmooth's BEiT-L/16 checkpoints (https://github.com/javyduck/DiffSmooth, README 'Smoothed Models'): put "
              "each noise level's folder under MODELS/beit_large_patch16_224/noise_sd<s>/checkpoint.pth.tar")

SOURCES = {
    # Cohen et al.'s code builds Sequential(NormalizeLayer, net): (x - mean) / std
    "cohen": Source("Cohen et al. (Gaussian augmentation)", "normalize", COHEN_WHERE),
    # SmoothAdv's code builds Sequential(InputCenterLayer, net): x - mean only
    "smoothadv": Source("Salman et al. (SmoothAdv)", "center", SMOOTHADV_WHERE),
    # DiffSmooth's BEiT: the ViT layer (mean 0.5, std 0.5), which the engine applies to timm models by default
    "beit": Source("DiffSmooth's BEiT-L/16 (Gaussian augmentation)", None, BEIT_WHERE),
}

# The official denoisers: file name -> (preset, where it comes from)
DENOISERS = {
    "cifar10_uncond_50M_500K.pt": (
        "cifar10", "improved-diffusion's CIFAR-10 model: "
                   "https://openaipublic.blob.core.windows.net/diffusion/march-2021/cifar10_uncond_50M_500K.pt into MODELS/"),
    "256x256_diffusion_uncond.pt": (
        "imagenet", "guided-diffusion's unconditional 256x256 model: "
                    "https://openaipublic.blob.core.windows.net/diffusion/jul-2021/256x256_diffusion_uncond.pt into MODELS/"),
}

# The data sets: dataset kind -> where it comes from
DATASETS = {
    "cifar10": "the CIFAR-10 python version (https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz), extracted into DATA "
               "(DATA/cifar-10-batches-py/test_batch)",
    "imagenet": "the ILSVRC2012 validation images in one folder per class (Cohen et al.'s README: run valprep.sh) as "
                "DATA/imagenet/val",
}

# Official key lists (tests/data/keys/) by the architecture a checkpoint records, and by UNet preset
CLASSIFIER_KEYS = {"cifar_resnet110": "cohen_cifar_resnet110", "cifar_resnet20": "cohen_cifar_resnet20",
                   "resnet50": "cohen_imagenet_resnet50"}
UNET_KEYS = {"cifar10": "cifar10_uncond_50M_500K", "imagenet": "256x256_diffusion_uncond"}

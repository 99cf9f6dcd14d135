"""The tiny images and centroid classifiers the shared fixtures (conftest.py) build from, importable by
any test module (a test cannot import `conftest` reliably: tests/fuzz has its own)."""

import numpy as np
import torch

TINY_UNET = {"image_size": 8, "model_channels": 32, "num_res_blocks": 1, "channel_mult": [1, 2],
             "attention_resolutions": [4], "dropout": 0.0}
SIGMA = 0.25          # the tests' smoothing sigma: the votes of the tiny classifiers spread at this level


def random_unet(**config):
    """A cifar10-family UNet (`config` overrides, TINY_UNET by default) at seed 0, its zero-initialised output
    convolutions drawn too so that eps is not trivially zero."""
    from diffsmooth.engine.models.unet import UNetModel, unet_config

    torch.manual_seed(0)
    unet = UNetModel(unet_config("cifar10", **(config or TINY_UNET)))
    with torch.no_grad():
        for p in unet.parameters():
            if p.abs().sum() == 0:
                p.normal_(0, 0.02)
    return unet


def tiny_images() -> np.ndarray:
    """Six 8x8 RGB images: a saturated colour each, half mixed with random texture."""
    rng = np.random.default_rng(0)
    colours = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 0], [0, 1, 1], [1, 0, 1]]) * 255
    texture = rng.integers(0, 256, size=(6, 8, 8, 3))
    return (0.5 * colours[:, None, None, :] + 0.5 * texture).astype(np.uint8)


def centroid_classifier(seed: int, images: np.ndarray, sigma: float, purify):
    """A cifar_resnet20 (random body, `seed`) whose fc scores -||f(x) - c_k||^2 for the mean
    feature c_k of noisy copies of image k, raw and denoised by `purify` (so rs and dds both
    spread); classes beyond the images never win."""
    from diffsmooth.engine.models.resnet import NormalizedClassifier, build_classifier_net, normalization_layer

    torch.manual_seed(seed)
    net = NormalizedClassifier(normalization_layer("normalize", "cifar10"), build_classifier_net("cifar_resnet20", 10, 3))
    net.eval()
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255
    fc = net.net.fc
    net.net.fc = torch.nn.Identity()
    with torch.no_grad():
        noisy = [xi.unsqueeze(0) + sigma * torch.randn(100, *xi.shape) for xi in x]
        centroids = torch.stack([torch.cat([net(h), net(purify(h))]).mean(0) for h in noisy])
        net.net.fc = fc
        k = len(centroids)
        fc.weight.zero_()
        fc.bias.fill_(-1e4)
        fc.weight[:k] = 2 * centroids
        fc.bias[:k] = -(centroids ** 2).sum(1)
    return net

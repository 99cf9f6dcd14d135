"""Shared fixtures: tiny real models (the project's UNet and ResNet at toy sizes) saved in the
official checkpoint formats, and a small .npz dataset the tests write.

The classifiers are untrained ResNet-20 bodies whose last layer is set to a nearest-centroid rule
over the six test images' noisy features: image i mostly votes class i, with enough doubt that
votes, predictions and radii differ between images (some abstain). Equality tests (batch sizes,
resume, shards, ranks) therefore compare files that a wrong noise index or batch offset changes;
`cli_helpers.assert_rows_spread` checks that this stays true.
"""

import json

import numpy as np
import pytest
import torch

TINY_UNET = {"image_size": 8, "model_channels": 32, "num_res_blocks": 1, "channel_mult": [1, 2],
             "attention_resolutions": [4], "dropout": 0.0}
SIGMA = 0.25          # the tests' smoothing sigma: the votes of the tiny classifiers spread at this level


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


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """Paths of a tiny cifar10-family UNet state dict, two Cohen-style classifiers and an npz."""
    from diffsmooth.engine.base_classifier.denoise import PRESET_SCHEDULES, DiffusionDenoiser
    from diffsmooth.engine.models.checkpoints import save_cohen_checkpoint, save_unet_state
    from diffsmooth.engine.models.unet import UNetModel, unet_config

    root = tmp_path_factory.mktemp("tiny")
    torch.manual_seed(0)
    unet = UNetModel(unet_config("cifar10", **TINY_UNET))
    with torch.no_grad():                    # the official init zeroes output convs; make eps non-trivial
        for p in unet.parameters():
            if p.abs().sum() == 0:
                p.normal_(0, 0.02)
    save_unet_state(root / "unet.pt", unet)
    images = tiny_images()
    purify = DiffusionDenoiser(unet, PRESET_SCHEDULES["cifar10"]).purifier(SIGMA)
    save_cohen_checkpoint(root / "clf.pt", centroid_classifier(0, images, SIGMA, purify), "cifar_resnet20")
    save_cohen_checkpoint(root / "clf_b.pt", centroid_classifier(1, images, SIGMA, purify), "cifar_resnet20")
    np.savez(root / "data.npz", images=images, labels=np.arange(6))
    return {"unet": root / "unet.pt", "classifier": root / "clf.pt", "classifier_b": root / "clf_b.pt",
            "data": root / "data.npz", "sigma": str(SIGMA),
            "unet_config": json.dumps(TINY_UNET), "root": root}


@pytest.fixture
def tiny_cli_args(tiny_models):
    """CLI options naming the tiny models, data and sigma (method and --out are added by each test)."""
    return ["--denoiser", str(tiny_models["unet"]), "--preset", "cifar10",
            "--unet-config", tiny_models["unet_config"], "--classifier", str(tiny_models["classifier"]),
            "--dataset", "npz", "--data", str(tiny_models["data"]), "--sigma", tiny_models["sigma"]]


@pytest.fixture(scope="session")
def tiny_stages():
    """(config, denoiser, classifier) of diffsmooth stages (fresh local noise, m=3) on a tiny UNet
    and a small conv classifier whose votes spread (tests/stage_fixtures.py)."""
    from stage_fixtures import build_tiny_stages
    return build_tiny_stages()

"""Shared fixtures: tiny real models (the project's UNet and ResNet at toy sizes) saved in the
official checkpoint formats, and a small .npz dataset the tests write."""

import json

import numpy as np
import pytest
import torch

TINY_UNET = {"image_size": 8, "model_channels": 32, "num_res_blocks": 1, "channel_mult": [1, 2],
             "attention_resolutions": [4], "dropout": 0.0}


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """Paths of a tiny cifar10-family UNet state dict, a Cohen-style classifier and an npz."""
    from diffsmooth.engine.models.checkpoints import save_cohen_checkpoint, save_unet_state
    from diffsmooth.engine.models.resnet import NormalizedClassifier, build_classifier_net, normalization_layer
    from diffsmooth.engine.models.unet import UNetModel, unet_config

    root = tmp_path_factory.mktemp("tiny")
    torch.manual_seed(0)
    unet = UNetModel(unet_config("cifar10", **TINY_UNET))
    with torch.no_grad():                    # the official init zeroes output convs; make eps non-trivial
        for p in unet.parameters():
            if p.abs().sum() == 0:
                p.normal_(0, 0.02)
    save_unet_state(root / "unet.pt", unet)
    net = NormalizedClassifier(normalization_layer("normalize", "cifar10"), build_classifier_net("cifar_resnet20", 10, 3))
    net.eval()
    save_cohen_checkpoint(root / "clf.pt", net, "cifar_resnet20")
    torch.manual_seed(1)
    other = NormalizedClassifier(normalization_layer("normalize", "cifar10"), build_classifier_net("cifar_resnet20", 10, 3))
    save_cohen_checkpoint(root / "clf_b.pt", other.eval(), "cifar_resnet20")
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(6, 8, 8, 3), dtype=np.uint8)
    np.savez(root / "data.npz", images=images, labels=np.array([0, 1, 2, 3, 4, 5]))
    return {"unet": root / "unet.pt", "classifier": root / "clf.pt", "classifier_b": root / "clf_b.pt",
            "data": root / "data.npz",
            "unet_config": json.dumps(TINY_UNET), "root": root}


@pytest.fixture
def tiny_cli_args(tiny_models):
    """CLI options naming the tiny models and data (method and --out are added by each test)."""
    return ["--denoiser", str(tiny_models["unet"]), "--preset", "cifar10",
            "--unet-config", tiny_models["unet_config"], "--classifier", str(tiny_models["classifier"]),
            "--dataset", "npz", "--data", str(tiny_models["data"])]

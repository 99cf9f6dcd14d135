"""Shared fixtures: tiny real models (the project's UNet and ResNet at toy sizes) saved in the
official checkpoint formats, and a small .npz dataset the tests write.

The classifiers are untrained ResNet-20 bodies whose last layer is set to a nearest-centroid rule
over the six test images' noisy features: image i mostly votes class i, with enough doubt that
votes, predictions and radii differ between images (some abstain). Equality tests (batch sizes,
resume, shards, ranks) therefore compare files that a wrong noise index or batch offset changes;
`cli_helpers.assert_rows_spread` checks that this stays true.
"""

import json
import os

# Under pytest-xdist every worker process gets one core's share: one intra-op thread (and its children, through
# OMP_NUM_THREADS), so two workers on two cores do not each spin two OpenMP threads. Set before torch's import.
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    os.environ["OMP_NUM_THREADS"] = "1"

from diffsmooth.engine.host_memory import KEEP_FREED_BYTES, keep_freed_memory  # noqa: E402  (imports no torch)

# Freed host memory kept for the next batch (engine/host_memory.py: half a CPU run's time went to page faults): in this
# process as every command does, and in the processes the tests start (the README's example, scripts, ranks) through
# GLIBC_TUNABLES, which glibc reads at their start.
os.environ.setdefault("GLIBC_TUNABLES", f"glibc.malloc.mmap_threshold={KEEP_FREED_BYTES}:"
                                        f"glibc.malloc.trim_threshold={KEEP_FREED_BYTES}:glibc.malloc.arena_max=1")
keep_freed_memory()

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    torch.set_num_threads(1)        # in case a plugin imported torch before OMP_NUM_THREADS was set
from suite_order import heavy_first  # noqa: E402
from tiny_fixtures import SIGMA, TINY_UNET, centroid_classifier, random_unet, tiny_images  # noqa: E402,F401


def pytest_collection_modifyitems(config, items):
    """The heaviest modules first (tests/suite_order.py)."""
    heavy_first(items)


@pytest.fixture
def one_thread():
    """One intra-op thread: tiny tensors gain nothing from two, and on a busy machine every parallel
    region waits for a descheduled worker (spinning OpenMP threads crawl). A module opts in with
    `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """Paths of a tiny cifar10-family UNet state dict, two Cohen-style classifiers and an npz."""
    from diffsmooth.engine.base_classifier.denoise import PRESET_SCHEDULES, DiffusionDenoiser
    from diffsmooth.engine.models.checkpoints import save_cohen_checkpoint, save_unet_state

    root = tmp_path_factory.mktemp("tiny")
    unet = random_unet()
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

"""The shipped demo models (engine/demo/assets) load strictly, reproduce MODELS.json, and denoise; the trainers work.

Recorded accuracies are compared within ACC_TOL (a few of the 500 embedded images), which absorbs
float rounding differences between machines and thread counts; MSEs within MSE_RTOL relative.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import torch

from diffsmooth.engine.base_classifier.denoise import PRESET_SCHEDULES, DiffusionDenoiser
from diffsmooth.engine.data import load_arrays, load_dataset
from diffsmooth.engine.demo import shipped as demo_assets
from diffsmooth.engine.demo.training import classifier_accuracy, mse, one_shot_denoise, train_classifier, train_denoiser
from diffsmooth.engine.hashing import sha256_file
from diffsmooth.engine.models.checkpoints import (
    load_classifier,
    load_unet,
    read_checkpoint,
    save_cohen_checkpoint,
    save_unet_state,
)
from diffsmooth.engine.models.unet import unet_config

ACC_TOL = 0.01        # 5 of 500 images
MSE_RTOL = 0.02
SIGMAS = demo_assets.DEMO_TRAINING_SIGMAS
ASSET_FILES = [demo_assets.DEMO_UNET, demo_assets.DEMO_MANIFEST,
               *(demo_assets.demo_classifier_path(s) for s in SIGMAS)]
needs_assets = pytest.mark.skipif(
    not all(p.exists() for p in ASSET_FILES),
    reason="embedded demo models absent from engine/demo/assets: run `diffsmooth train-demo` to build them")


@pytest.fixture(scope="module")
def manifest():
    return json.loads(demo_assets.DEMO_MANIFEST.read_text())


@pytest.fixture(scope="module")
def subset():
    return load_arrays(load_dataset("embedded"))


@needs_assets
def test_manifest_matches_files(manifest):
    """Every shipped file is in the manifest with its hash, and the weights stay small."""
    total = 0
    for path in ASSET_FILES[:1] + ASSET_FILES[2:]:
        entry = manifest["models"][path.name]
        assert entry["sha256"] == sha256_file(path)
        assert entry["file_bytes"] == path.stat().st_size
        assert entry["training"]["wall_time_s"] > 0
        total += path.stat().st_size
    assert total < 8_000_000
    assert len(manifest["data"]["sha256"]) == 4 and manifest["data"]["train_images"] == 60000
    assert "train-demo" in manifest["equivalent_command"]


@needs_assets
@pytest.mark.slow
@pytest.mark.parametrize("sigma", SIGMAS)
def test_shipped_classifier_reproduces_manifest(manifest, subset, sigma):
    """Cohen-format checkpoint, loaded strictly, gets the recorded clean/noisy accuracy on the subset."""
    path = demo_assets.demo_classifier_path(sigma)
    raw = read_checkpoint(path)
    assert raw["arch"] == "cifar_resnet20" and isinstance(raw["epoch"], int)
    assert all(k.startswith("1.") for k in raw["state_dict"])
    clf = load_classifier(path, dataset="fashion-mnist")
    assert clf[1].conv1.weight.shape[1] == 1 and clf[1].fc.out_features == 10
    x, y = subset
    rec = manifest["models"][path.name]["metrics"]
    seed = manifest["evaluation"]["noise_seed"]
    clean = classifier_accuracy(clf, x, y)
    assert clean == pytest.approx(rec["embedded_clean_accuracy"], abs=ACC_TOL)
    assert clean >= 0.8
    if sigma > 0:
        noisy = classifier_accuracy(clf, x, y, sigma, seed)
        assert noisy == pytest.approx(rec["embedded_noisy_accuracy"], abs=ACC_TOL)
        assert noisy >= 0.6


@needs_assets
@pytest.mark.slow
def test_shipped_denoiser_denoises(manifest, subset):
    """Plain state dict, strict load, and one-shot denoising at sigma 0.5 beats the noisy input."""
    raw = read_checkpoint(demo_assets.DEMO_UNET)
    assert "input_blocks.0.0.weight" in raw and "state_dict" not in raw
    denoiser = DiffusionDenoiser(load_unet(demo_assets.DEMO_UNET, "demo"), PRESET_SCHEDULES["demo"])
    x, _ = subset
    seed = manifest["evaluation"]["noise_seed"]
    noisy, den = one_shot_denoise(denoiser, x, 0.5, seed)
    assert mse(den, x) < 0.5 * mse(noisy, x)
    rec = manifest["models"]["demo_unet.pt"]["metrics"]["0.50"]
    assert mse(den, x) == pytest.approx(rec["embedded_denoised_mse"], rel=MSE_RTOL)


def _toy_data(n: int = 32, size: int = 8):
    """Two easy classes of grey images: bright left half vs bright right half, plus mild noise."""
    g = torch.Generator().manual_seed(0)
    y = torch.arange(n) % 2
    x = 0.1 * torch.rand(n, 1, size, size, generator=g)
    x[y == 0, :, :, : size // 2] += 0.8
    x[y == 1, :, :, size // 2:] += 0.8
    return x, y


@pytest.fixture
def one_thread():
    """Tiny models gain nothing from threads, and spinning OpenMP threads crawl on a busy machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.slow
def test_trainers_smoke(tmp_path, one_thread):
    """A few optimisation steps lower both losses and the checkpoints load back via the project loaders."""
    x, y = _toy_data()
    cfg = unet_config("demo", image_size=8, channel_mult=(1, 2), attention_resolutions=(4,))
    res = train_denoiser(x, config=cfg, steps=20, batch_size=16, lr=3e-3, warmup=3,
                         focus=(1000, 3000), focus_prob=1.0, progress=False)
    assert sum(res.losses[-5:]) < sum(res.losses[:5])
    save_unet_state(tmp_path / "unet.pt", res.model)
    unet = load_unet(tmp_path / "unet.pt", None, **dataclasses.asdict(cfg))
    t = torch.full((4,), 300.0)
    assert torch.equal(unet(x[:4], t), res.model(x[:4], t))

    res_c = train_classifier(x, y, 0.25, steps=10, batch_size=16, lr=0.05, progress=False)
    assert sum(res_c.losses[-3:]) < sum(res_c.losses[:3])
    save_cohen_checkpoint(tmp_path / "clf.pt", res_c.model, "cifar_resnet20", epoch=1)
    clf = load_classifier(tmp_path / "clf.pt", dataset="fashion-mnist")
    with torch.no_grad():
        assert torch.equal(clf(x), res_c.model.eval()(x))


def test_train_command_import_is_light():
    """The CLI lists train-demo without importing torch (the CLI stays fast)."""
    code = ("import sys, diffsmooth.cli as m; "
            "assert 'train-demo' in m.main.list_commands(None); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"

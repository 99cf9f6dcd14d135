"""The shipped demo models (engine/demo/assets) load strictly, reproduce MODELS.json, and denoise; the trainers work.

Recorded accuracies are compared within ACC_TOL (a few of the 500 embedded images), which absorbs
float rounding differences between machines and thread counts; MSEs within MSE_RTOL relative.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import shlex
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest
import torch
from cli_helpers import invoke_ok
from click.testing import CliRunner

from diffsmooth.cli import main
from diffsmooth.cli.train_demo import train_demo as train_demo_command
from diffsmooth.engine.base_classifier.denoise import PRESET_SCHEDULES, DiffusionDenoiser
from diffsmooth.engine.data import load_arrays, load_dataset
from diffsmooth.engine.demo import shipped as demo_assets
from diffsmooth.engine.demo import training
from diffsmooth.engine.demo.training import (
    ClassifierTraining,
    DenoiserTraining,
    classifier_accuracy,
    mse,
    one_shot_denoise,
    train_classifier,
    train_denoiser,
)
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.hashing import sha256_file, sha256_path
from diffsmooth.engine.models.checkpoints import (
    load_classifier,
    load_unet,
    read_checkpoint,
    save_cohen_checkpoint,
    save_unet_state,
)
from diffsmooth.engine.models.unet import unet_config
from diffsmooth.engine.pipelines import load_demo_classifier

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
    ddpm = manifest["models"][demo_assets.DEMO_DDPM.name]
    assert ddpm["sha256"] == sha256_path(demo_assets.DEMO_DDPM)
    assert ddpm["file_bytes"] == training.model_bytes(demo_assets.DEMO_DDPM) and ddpm["training"]["wall_time_s"] > 0
    total += ddpm["file_bytes"]
    assert total < 12_000_000
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
    assert clean >= (0.8 if sigma <= 0.5 else 0.7)     # sigma 1.0 trades clean accuracy for robustness
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


@pytest.mark.slow
@pytest.mark.skipif(not demo_assets.DEMO_DDPM.exists(), reason="the demo's diffusers denoiser is not built")
def test_shipped_diffusers_denoiser_denoises(manifest, subset):
    """The diffusers pipeline folder loads through load_denoiser (safetensors, diffusers' configs), its
    t* is the paper's rule on its own schedule, and one-shot denoising reproduces MODELS.json and beats
    the noisy input at every recorded sigma."""
    pytest.importorskip("diffusers")
    from diffsmooth.engine.base_classifier.denoise import load_denoiser
    entry = manifest["models"][demo_assets.DEMO_DDPM.name]
    denoiser = load_denoiser(demo_assets.DEMO_DDPM)
    x, _ = subset
    for key, rec in entry["metrics"].items():
        sigma = float(key)
        assert int(denoiser.timestep(sigma)) == rec["t_star"]
        noisy, den = one_shot_denoise(denoiser, x, sigma, manifest["evaluation"]["noise_seed"])
        assert mse(den, x) < 0.5 * mse(noisy, x)
        assert mse(den, x) == pytest.approx(rec["embedded_denoised_mse"], rel=MSE_RTOL)


def _toy_data(n: int = 32, size: int = 8):
    """Two easy classes of grey images: bright left half vs bright right half, plus mild noise."""
    g = torch.Generator().manual_seed(0)
    y = torch.arange(n) % 2
    x = 0.1 * torch.rand(n, 1, size, size, generator=g)
    x[y == 0, :, :, : size // 2] += 0.8
    x[y == 1, :, :, size // 2:] += 0.8
    return x, y


@pytest.mark.slow
def test_trainers_smoke(tmp_path, one_thread):
    """A few optimisation steps lower both losses and the checkpoints load back via the project loaders."""
    x, y = _toy_data()
    cfg = unet_config("demo", image_size=8, channel_mult=(1, 2), attention_resolutions=(4,))
    res = train_denoiser(x, DenoiserTraining(steps=20, batch_size=16, lr=3e-3, warmup=3, focus=(1000, 3000),
                                             focus_prob=1.0), config=cfg, progress=False)
    assert sum(res.losses[-5:]) < sum(res.losses[:5])
    save_unet_state(tmp_path / "unet.pt", res.model)
    unet = load_unet(tmp_path / "unet.pt", None, **dataclasses.asdict(cfg))
    t = torch.full((4,), 300.0)
    assert torch.equal(unet(x[:4], t), res.model(x[:4], t))

    res_c = train_classifier(x, y, 0.25, ClassifierTraining(steps=10, batch_size=16, lr=0.05), progress=False)
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


# --------------------------------------------------------------------------------------------
# The demo's noise levels: one list (DEMO_TRAINING_SIGMAS), and `train-demo --only-missing`

needs_manifest = pytest.mark.skipif(not demo_assets.DEMO_MANIFEST.exists(),
                                    reason="engine/demo/assets/MODELS.json absent: the demo models are not built")


@needs_manifest
def test_demo_sigmas_are_one_list(manifest):
    """Every sigma of DEMO_TRAINING_SIGMAS has its shipped classifier (recorded with that sigma and the seed
    scheme), the classifier rule picks it for each method's noise level, and training, the manifest and the
    help texts list exactly these sigmas."""
    from diffsmooth.engine.base_classifier.methods import MethodConfig, method_named
    names = [demo_assets.demo_classifier_name(s) for s in SIGMAS]
    assert 1.0 in SIGMAS and list(SIGMAS) == sorted(SIGMAS) and len(set(SIGMAS)) == len(SIGMAS)
    assert training.CLASSIFIER_SIGMAS == SIGMAS
    assert [job["name"] for job in training._jobs(0)] == ["demo_unet.pt", *names, training.DDPM_FOLDER]
    for i, s in enumerate(SIGMAS):
        path = demo_assets.demo_classifier_at(s)
        assert path == demo_assets.ASSETS / names[i] and path.is_file(), path
        entry = manifest["models"][path.name]
        assert entry["noise_sigma"] == s and entry["training"]["noise_sigma"] == s
        assert manifest["seeds"][path.name] == entry["training"]["seed"] == manifest["seed"] + 1 + i
        if s > 0:                       # RS's classifier sees sigma (> 0), DiffSmooth's sigma', DDS's none
            assert method_named("rs").demo_classifier(MethodConfig("rs", s, local_sigma=0.25)) == path
            assert method_named("dds").demo_classifier(MethodConfig("dds", s)) == demo_assets.ASSETS / names[0]
        assert method_named("diffsmooth").demo_classifier(MethodConfig("diffsmooth", 0.5, local_sigma=s)) == path
    assert method_named("rs").demo_classifier(MethodConfig("rs", 1.0)).name == "demo_classifier_s1.00.pt"
    assert sorted(p.name for p in demo_assets.ASSETS.glob("demo_classifier_s*.pt")) == sorted(names)
    assert sorted(n for n, e in manifest["models"].items() if e["kind"] == "classifier") == sorted(names)
    assert f"sigma {demo_assets.demo_sigmas_text()}, on" in manifest["description"]
    help_text = " ".join(CliRunner().invoke(train_demo_command, ["--help"]).output.split())
    assert demo_assets.demo_sigmas_text(s for s in SIGMAS if s > 0) in help_text
    with pytest.raises(UserError, match="the demo ships 0, 0.25, 0.5, 1"):
        method_named("rs").demo_classifier(MethodConfig("rs", 0.75))
    assert load_demo_classifier(SIGMAS[-1])[1].fc.out_features == 10


@needs_manifest
def test_manifest_commands_exist(manifest):
    """Every command MODELS.json records is a `diffsmooth train-demo` command line that parses, with the
    recorded seed and budget: `command` trains every model from scratch, each only-missing run adds models."""
    def options(command):
        argv = shlex.split(command)
        assert argv[:2] == ["diffsmooth", "train-demo"], command
        return train_demo_command.make_context("train-demo", argv[2:]).params

    budget = manifest["budget"]
    runs = manifest.get("only_missing_runs", [])
    for command in [manifest["command"], manifest["equivalent_command"]] + [r[k] for r in runs
                                                                          for k in ("command", "equivalent_command")]:
        params = options(command)
        assert params["seed"] == manifest["seed"]
        if "--unet-steps" in command:
            assert params["unet_steps"] == budget["unet_steps"]
            assert params["classifier_epochs"] == budget["classifier_epochs"]
            assert params["classifier_batch_size"] == budget["classifier_batch_size"]
    assert not options(manifest["command"])["only_missing"]
    assert all(options(r["equivalent_command"])["only_missing"] for r in runs)
    added = [name for r in runs for name in r["models"]]
    assert len(added) == len(set(added)) and set(added) <= set(manifest["models"])


def _write_idx_gz(path, arr: np.ndarray) -> None:
    head = bytes([0, 0, 0x08, arr.ndim]) + struct.pack(">" + "I" * arr.ndim, *arr.shape)
    with gzip.open(path, "wb") as f:
        f.write(head + arr.astype(np.uint8).tobytes())


@pytest.fixture
def tiny_idx_dir(tmp_path):
    """A Fashion-MNIST-shaped IDX folder: 48 train and 20 test images, 28x28, labels 0..9."""
    rng = np.random.default_rng(0)
    root = tmp_path / "idx"
    root.mkdir()
    for prefix, n in (("train", 48), ("t10k", 20)):
        _write_idx_gz(root / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28), dtype=np.uint8))
        _write_idx_gz(root / f"{prefix}-labels-idx1-ubyte.gz", (np.arange(n) % 10).astype(np.uint8))
    return root


def _files(out):
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(out.glob("*.pt"))}


@pytest.mark.slow
def test_train_demo_only_missing(tmp_path, tiny_idx_dir, one_thread):
    """--only-missing trains only the models absent from --out, leaves the present files byte-identical
    (not even rewritten) and merges the new entry into MODELS.json, the kept entries unchanged."""
    out = tmp_path / "assets"
    args = ["train-demo", "--quick", "--test-limit", "8", "--data", tiny_idx_dir, "--out", out, "--workers", "1",
            "--threads", "1", "--no-progress"]
    invoke_ok(args)                                     # the pre-made files: a complete quick run
    full = json.loads((out / "MODELS.json").read_text())
    newest = demo_assets.demo_classifier_name(SIGMAS[-1])
    newest_bytes = (out / newest).read_bytes()
    (out / newest).unlink()
    ddpm = out / training.DDPM_FOLDER
    ddpm_sha = sha256_path(ddpm)
    shutil.rmtree(ddpm)                                 # a folder is trained again like a file
    # a kept classifier that retraining would change: s0.50's weights under s0.25's name, as recorded
    swapped = demo_assets.demo_classifier_name(SIGMAS[1])
    (out / swapped).write_bytes((out / demo_assets.demo_classifier_name(SIGMAS[2])).read_bytes())
    full["models"][swapped]["sha256"] = sha256_file(out / swapped)
    (out / "MODELS.json").write_text(json.dumps(full, indent=2) + "\n")
    before = _files(out)

    invoke_ok(["train-demo", "--only-missing", *args[1:]])
    after = _files(out)
    assert set(after) == set(before) | {newest}
    assert all(after[name] == before[name] for name in before)
    assert after[newest][0] == newest_bytes             # the seed scheme gives the same weights as a full run
    assert sha256_path(ddpm) == ddpm_sha      # diffusers' training and save_pretrained too
    manifest = json.loads((out / "MODELS.json").read_text())
    assert list(manifest["models"]) == ["demo_unet.pt", *(demo_assets.demo_classifier_name(s) for s in SIGMAS),
                                        training.DDPM_FOLDER]
    assert manifest["models"][training.DDPM_FOLDER]["sha256"] == ddpm_sha
    assert set(manifest["models"][training.DDPM_FOLDER]["metrics"]) == {"0.25", "0.50", "1.00"}
    assert all(manifest["models"][name] == full["models"][name] for name in before)
    entry, like = manifest["models"][newest], full["models"][swapped]
    assert entry["sha256"] == sha256_file(out / newest) and entry["file_bytes"] == len(newest_bytes)
    assert set(entry) == set(like) and set(entry["training"]) == set(like["training"])
    assert set(entry["metrics"]) == set(like["metrics"]) and entry["metrics"]["test_noisy_accuracy"] is not None
    assert entry["noise_sigma"] == SIGMAS[-1] and entry["training"]["steps"] == like["training"]["steps"]
    assert manifest["seeds"] == full["seeds"] and entry["training"]["seed"] == len(SIGMAS)
    for key in ("budget", "data", "evaluation", "software", "seed"):
        assert manifest[key] == full[key], key
    (run,) = manifest["only_missing_runs"]
    assert run["models"] == [newest, training.DDPM_FOLDER] and "--only-missing" in run["equivalent_command"]
    assert "--only-missing" not in manifest["command"] and "train-demo" in manifest["command"]

    mtime = (out / "MODELS.json").stat().st_mtime_ns
    invoke_ok(["train-demo", "--only-missing", *args[1:]])      # nothing missing: nothing written
    assert _files(out) == after and (out / "MODELS.json").stat().st_mtime_ns == mtime
    (out / newest).unlink()
    refused = CliRunner().invoke(main, [str(a) for a in ["train-demo", "--only-missing", *args[1:],
                                                          "--classifier-steps", "4"]])
    assert refused.exit_code == 2 and "budget" in refused.output, refused.output
    assert not (out / newest).exists() and _files(out) == before

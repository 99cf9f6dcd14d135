"""Checkpoints fuzzed, through `diffsmooth certify --classifier / --denoiser`: truncated files, wrong
keys, wrong shapes, NaN / inf weights, non-tensor values, garbage, and pickles that would run code
(refused by weights_only loading, and never run). The models really load (build_voter runs); a valid
checkpoint is accepted where certify would start counting votes (execute, stubbed)."""

import os
import pickle

import pytest
import torch
from fuzz_helpers import DEMO_CLASSIFIER, DEMO_CLASSIFIER_CLEAN, DEMO_UNET, FUZZ, Accepted, check
from hypothesis import given, settings
from hypothesis import strategies as st


@pytest.fixture
def stop_before_votes(monkeypatch):
    import diffsmooth.cli.certify as certify

    def accept(*args, **kwargs):
        raise Accepted()
    monkeypatch.setattr(certify, "execute", accept)


pytestmark = pytest.mark.usefixtures("stop_before_votes")

FAST = ["--n0", "10", "--n", "20", "--max", "1", "--batch", "30", "--quiet", "--validate-samples", "0"]


class Marker:
    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


CLASSIFIER = torch.load(DEMO_CLASSIFIER, weights_only=True)
UNET = torch.load(DEMO_UNET, weights_only=True)

DAMAGE = ["none", "legacy_format", "float64", "truncated", "nan_weight", "inf_weight", "nan_buffer", "renamed_key",
          "dropped_key", "extra_key", "wrong_shape", "non_tensor", "code", "plain_pickle", "garbage", "empty",
          "empty_state_dict", "not_a_dict", "unknown_arch", "no_arch", "directory"]
VALID = {"none", "legacy_format", "float64"}


def damaged(kind, checkpoint, folder, draw):
    """Write `checkpoint` (a classifier dict or a UNet state dict) with damage `kind`; returns its path."""
    path = folder / "model.pt"
    is_classifier = "state_dict" in checkpoint
    obj = {k: (dict(v) if isinstance(v, dict) else v) for k, v in checkpoint.items()}
    sd = obj["state_dict"] if is_classifier else obj
    floats = [k for k, v in sd.items() if v.is_floating_point() and v.numel()]
    name = draw(st.sampled_from(floats))
    if kind in ("nan_weight", "inf_weight", "nan_buffer"):
        if kind == "nan_buffer":
            name = draw(st.sampled_from([k for k in floats if "running" in k] or floats))
        tensor = sd[name].clone()
        tensor.view(-1)[draw(st.integers(0, tensor.numel() - 1))] = float("nan") if kind != "inf_weight" else \
            draw(st.sampled_from([float("inf"), float("-inf")]))
        sd[name] = tensor
    elif kind == "renamed_key":
        sd[name + "_renamed"] = sd.pop(name)
    elif kind == "dropped_key":
        sd.pop(name)
    elif kind == "extra_key":
        sd[draw(st.text(alphabet="abcxyz._", min_size=1, max_size=8)) + ".extra"] = torch.zeros(2)
    elif kind == "wrong_shape":
        sd[name] = torch.zeros(*(s + 1 for s in sd[name].shape))
    elif kind == "non_tensor":
        sd[name] = draw(st.sampled_from([1.5, "weights", [1, 2], None]))
    elif kind == "float64":
        for k in floats:
            sd[k] = sd[k].double()
    elif kind == "empty_state_dict":
        sd.clear()
    elif kind == "unknown_arch" and is_classifier:
        obj["arch"] = draw(st.sampled_from(["resnet9000", "", "timm:", "cifar_resnet20 "]))
    elif kind == "no_arch" and is_classifier:
        obj.pop("arch")
    if kind == "code":
        obj = {"state_dict": sd, "arch": "cifar_resnet20", "payload": Marker(folder / "ran")} if is_classifier else \
            {**sd, "payload": Marker(folder / "ran")}
    if kind == "not_a_dict":
        obj = list(sd.values())
    if kind == "plain_pickle":
        path.write_bytes(pickle.dumps({k: v.numpy() if hasattr(v, "numpy") else v for k, v in sd.items()}))
    elif kind == "garbage":
        path.write_bytes(bytes(draw(st.lists(st.integers(0, 255), min_size=1, max_size=64))))
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "directory":
        path.mkdir()
    else:
        torch.save(obj, path, _use_new_zipfile_serialization=kind != "legacy_format")
    if kind == "truncated":
        data = path.read_bytes()
        path.write_bytes(data[:draw(st.integers(0, len(data) - 1))])
    return path


@pytest.mark.parametrize("damage", DAMAGE)
@settings(FUZZ, max_examples=4)
@given(data=st.data())
def test_classifier_checkpoints(tmp_path_factory, damage, data):
    folder = tmp_path_factory.mktemp("ckpt")
    path = damaged(damage, CLASSIFIER, folder, data.draw)
    args = ["certify", "--method", "rs", "--sigma", "0.5", "--classifier", path, "--stats", "fashion-mnist",
            *FAST, "--out", folder / "out" / "r.tsv"]
    result = check(f"checkpoint classifier {damage}", args, damage in VALID, folder)
    assert not (folder / "ran").exists(), "loading the checkpoint ran code"
    if damage in ("nan_weight", "inf_weight", "nan_buffer"):
        assert "NaN/inf" in result.stderr and str(path) in result.stderr     # names the file and a parameter


UNET_DAMAGE = [d for d in DAMAGE if d not in ("unknown_arch", "no_arch")]


@pytest.mark.parametrize("damage", UNET_DAMAGE)
@settings(FUZZ, max_examples=2)
@given(data=st.data())
def test_denoiser_checkpoints(tmp_path_factory, damage, data):
    folder = tmp_path_factory.mktemp("unet")
    path = damaged(damage, UNET, folder, data.draw)
    args = ["certify", "--method", "dds", "--sigma", "0.5", "--denoiser", path, "--preset", "demo",
            "--classifier", DEMO_CLASSIFIER_CLEAN, *FAST, "--out", folder / "out" / "r.tsv"]
    result = check(f"checkpoint denoiser {damage}", args, damage in VALID, folder)
    assert not (folder / "ran").exists(), "loading the checkpoint ran code"
    if damage in ("nan_weight", "inf_weight", "nan_buffer"):
        assert "NaN/inf" in result.stderr and "parameter" in result.stderr

"""Checkpoint loading tests: official formats load, and every bad file gives a one-line UserError."""

from __future__ import annotations

import pickle
from collections import OrderedDict
from pathlib import Path

import pytest
import torch

from diffsmooth.engine.errors import UserError
from diffsmooth.engine.models.checkpoints import (
    extract_state_dict,
    load_classifier,
    load_unet,
    load_weights,
    read_checkpoint,
    save_cohen_checkpoint,
    save_unet_state,
)
from diffsmooth.engine.models.resnet import (
    InputCenterLayer,
    NormalizedClassifier,
    NormalizeLayer,
    build_classifier_net,
    normalization_layer,
)
from diffsmooth.engine.models.unet import PRESETS, UNetConfig, UNetModel

TINY = dict(
    image_size=32, in_channels=3, model_channels=32, num_res_blocks=1, attention_resolutions=(16,),
    channel_mult=(1, 2), num_heads=2, learn_sigma=True, dropout=0.0,
)


def _user_error(fn, *args, **kwargs) -> str:
    """Run fn expecting a UserError with a one-line message; return the message."""
    with pytest.raises(UserError) as info:
        fn(*args, **kwargs)
    msg = str(info.value)
    assert msg and "\n" not in msg
    return msg


def _random_state(module: torch.nn.Module, seed: int = 0) -> OrderedDict:
    g = torch.Generator().manual_seed(seed)
    return OrderedDict(
        (k, torch.randn(v.shape, generator=g) * 0.05 if v.is_floating_point() else v.clone())
        for k, v in module.state_dict().items()
    )


@pytest.fixture(scope="module")
def tiny_unet_state():
    return _random_state(UNetModel(UNetConfig(**TINY)))


@pytest.fixture(scope="module")
def resnet20():
    net = build_classifier_net("cifar_resnet20")
    net.load_state_dict(_random_state(net, 1))
    with torch.no_grad():  # plausible BN statistics
        for name, buf in net.named_buffers():
            if name.endswith("running_var"):
                buf.uniform_(0.5, 1.5)
    return NormalizedClassifier(normalization_layer("normalize", "cifar10"), net).eval()


def _unet_out(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, model.config.in_channels, 32, 32, generator=g)
    with torch.no_grad():
        return model(x, torch.tensor([496.0, 12.0]))


# --------------------------------------------------------------------------- UNet


def test_official_format_unet_loads(tmp_path, tiny_unet_state):
    path = tmp_path / "ema_0.9999.pt"
    torch.save(tiny_unet_state, path)  # the official files are plain state dicts
    model = load_unet(path, preset=None, **TINY)
    assert not model.training
    ref = UNetModel(UNetConfig(**TINY)).eval()
    ref.load_state_dict(tiny_unet_state)
    assert torch.equal(_unet_out(model), _unet_out(ref))
    assert all(p.dtype == torch.float32 and p.device.type == "cpu" for p in model.parameters())


def test_unet_with_module_prefix_and_fp16_weights_loads(tmp_path, tiny_unet_state):
    path = tmp_path / "ddp.pt"
    torch.save({"model": {f"module.{k}": v.half() for k, v in tiny_unet_state.items()}}, path)
    model = load_unet(path, preset=None, **TINY)
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_save_unet_state_roundtrip(tmp_path):
    cfg = UNetConfig(**{**TINY, "in_channels": 1, "learn_sigma": False})
    model = UNetModel(cfg).eval()
    model.load_state_dict(_random_state(model, 3))
    path = tmp_path / "sub" / "demo_unet.pt"
    save_unet_state(path, model)
    assert set(torch.load(path, weights_only=True)) == set(model.state_dict())
    loaded = load_unet(path, preset="demo", **{k: v for k, v in TINY.items() if k not in ("in_channels", "learn_sigma")})
    assert torch.equal(_unet_out(loaded), _unet_out(model))


def test_unet_wrong_preset_names_the_config(tmp_path, tiny_unet_state):
    path = tmp_path / "tiny.pt"
    torch.save(tiny_unet_state, path)
    msg = _user_error(load_unet, path, preset="cifar10")
    assert "preset 'cifar10'" in msg and "missing" in msg and "mis-shaped" in msg
    assert "time_embed.0.weight checkpoint [128, 32] vs model [512, 128]" in msg


def test_unet_bad_preset_or_key(tmp_path, tiny_unet_state):
    path = tmp_path / "tiny.pt"
    torch.save(tiny_unet_state, path)
    assert "known presets" in _user_error(load_unet, path, preset="lsun")
    assert "valid keys" in _user_error(load_unet, path, preset="cifar10", num_channels=3)


# --------------------------------------------------------------------------- classifiers


def test_cohen_checkpoint_loads_with_arch_from_file(tmp_path, resnet20):
    path = tmp_path / "checkpoint.pth.tar"
    state = resnet20.state_dict()
    assert all(k.startswith("1.") for k in state)
    optimizer = {"state": {}, "param_groups": [{"lr": 0.1}]}
    torch.save({"epoch": 90, "arch": "cifar_resnet20", "state_dict": state, "optimizer": optimizer}, path)
    model = load_classifier(path)
    assert isinstance(model, NormalizedClassifier) and not model.training
    assert isinstance(model.normalization, NormalizeLayer)
    x = torch.rand(3, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(model(x), resnet20(x))


def test_dataparallel_prefix_and_legacy_format(tmp_path, resnet20):
    path = tmp_path / "legacy.pth.tar"
    state = OrderedDict((f"1.module.{k[2:]}", v) for k, v in resnet20.state_dict().items())
    torch.save({"arch": "cifar_resnet20", "state_dict": state}, path, _use_new_zipfile_serialization=False)
    model = load_classifier(path, normalization="center")
    assert isinstance(model.normalization, InputCenterLayer)
    for k, v in resnet20.net.state_dict().items():
        assert torch.equal(model.net.state_dict()[k], v)


def test_extract_state_dict_variants(resnet20):
    bare = resnet20.net.state_dict()
    for obj in (
        bare,
        {"state_dict": resnet20.state_dict(), "arch": "cifar_resnet20"},
        {"model": OrderedDict((f"module.{k}", v) for k, v in bare.items())},
        OrderedDict((f"1.module.{k}", v) for k, v in bare.items()),
    ):
        sd, arch = extract_state_dict(obj)
        assert list(sd) == list(bare)
    assert extract_state_dict({"state_dict": bare, "arch": "cifar_resnet20"})[1] == "cifar_resnet20"
    assert extract_state_dict(bare)[1] is None
    assert "no state dict" in _user_error(extract_state_dict, {"epoch": 3, "arch": "x"})
    assert "list" in _user_error(extract_state_dict, [1, 2])


def test_save_cohen_checkpoint_roundtrip(tmp_path, resnet20):
    path = tmp_path / "out" / "checkpoint.pth.tar"
    save_cohen_checkpoint(path, resnet20, "cifar_resnet20", epoch=5)
    raw = torch.load(path, weights_only=True)
    assert raw["arch"] == "cifar_resnet20" and raw["epoch"] == 5
    assert list(raw["state_dict"]) == list(resnet20.state_dict())
    save_cohen_checkpoint(tmp_path / "bare.pt", resnet20.net, "cifar_resnet20")
    assert all(k.startswith("1.") for k in torch.load(tmp_path / "bare.pt", weights_only=True)["state_dict"])
    model = load_classifier(path)
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(model(x), resnet20(x))


def test_inferred_classes_and_channels(tmp_path):
    net = build_classifier_net("cifar_resnet20", num_classes=10, in_channels=1)
    save_cohen_checkpoint(tmp_path / "fm.pt", net, "cifar_resnet20")
    model = load_classifier(tmp_path / "fm.pt", dataset="fashion-mnist")
    assert model.net.conv1.in_channels == 1 and model.net.fc.out_features == 10
    assert model.normalization.mean.shape == (1, 1, 1, 1)
    msg = _user_error(load_classifier, tmp_path / "fm.pt", dataset="cifar10")
    assert "3 channel" in msg and "takes 1" in msg


def test_wrong_arch_and_shapes(tmp_path, resnet20):
    path = tmp_path / "c.pt"
    torch.save({"arch": "cifar_resnet20", "state_dict": resnet20.state_dict()}, path)
    msg = _user_error(load_classifier, path, arch="cifar_resnet110")  # explicit arch wins
    assert "cifar_resnet110" in msg and "missing" in msg and "layer1.3.conv1.weight" in msg
    msg = _user_error(load_classifier, path, num_classes=100)
    assert "fc.weight checkpoint [10, 64] vs model [100, 64]" in msg and "2 mis-shaped" in msg
    msg = _user_error(load_classifier, path, arch="resnet50")
    assert "resnet50" in msg and "unexpected" in msg
    assert "known" in _user_error(load_classifier, path, arch="vgg16")
    assert "normalize, center, none" in _user_error(load_classifier, path, normalization="zscore")
    assert "unknown dataset" in _user_error(load_classifier, path, dataset="mnist")


def test_missing_arch(tmp_path, resnet20):
    path = tmp_path / "plain.pt"
    torch.save(resnet20.state_dict(), path)
    assert "arch" in _user_error(load_classifier, path)
    assert isinstance(load_classifier(path, arch="cifar_resnet20"), NormalizedClassifier)


def test_load_weights_reports_counts():
    net = build_classifier_net("cifar_resnet20")
    sd = dict(net.state_dict())
    sd.pop("fc.bias")
    sd["extra.weight"] = torch.zeros(2)
    msg = _user_error(load_weights, net, sd, "my net")
    assert msg.startswith("checkpoint does not match my net: 1 missing, 1 unexpected, 0 mis-shaped")
    assert "fc.bias [10]" in msg and "extra.weight [2]" in msg


# --------------------------------------------------------------------------- bad files


def _mark_executed(path):
    """Harmless stand-in for os.system: would create a marker file if a loader ran pickled code."""
    Path(path).write_text("executed")
    return {}


class _CodeRunner:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (_mark_executed, (self.marker,))


def test_code_executing_pickle_is_refused(tmp_path):
    marker = tmp_path / "marker"
    path = tmp_path / "evil.pt"
    torch.save({"arch": "cifar_resnet20", "state_dict": _CodeRunner(marker)}, path)
    msg = _user_error(read_checkpoint, path)
    assert "refusing" in msg and "_mark_executed" in msg
    raw = tmp_path / "evil.pkl"
    raw.write_bytes(pickle.dumps(_CodeRunner(marker)))
    assert "refusing" in _user_error(load_classifier, raw)
    assert not marker.exists()


def test_truncated_file(tmp_path, tiny_unet_state):
    good = tmp_path / "good.pt"
    torch.save(tiny_unet_state, good)
    data = good.read_bytes()
    bad = tmp_path / "trunc.pt"
    bad.write_bytes(data[: len(data) // 2])
    assert "truncated" in _user_error(load_unet, bad, preset=None, **TINY)
    legacy = tmp_path / "legacy.pt"
    torch.save(tiny_unet_state, legacy, _use_new_zipfile_serialization=False)
    bad.write_bytes(legacy.read_bytes()[: len(legacy.read_bytes()) // 2])
    assert "truncated" in _user_error(read_checkpoint, bad)


def test_non_torch_files(tmp_path):
    text = tmp_path / "notes.pt"
    text.write_text("this is not a checkpoint")
    assert str(text) in _user_error(read_checkpoint, text)
    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    assert "empty" in _user_error(read_checkpoint, empty)
    import zipfile

    z = tmp_path / "data.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr("readme.txt", "hello")
    assert "not a PyTorch checkpoint" in _user_error(read_checkpoint, z)
    assert "not found" in _user_error(read_checkpoint, tmp_path / "nope.pt")
    assert "directory" in _user_error(read_checkpoint, tmp_path)
    lst = tmp_path / "list.pt"
    torch.save([torch.zeros(1)], lst)
    assert "list" in _user_error(load_unet, lst)


def test_wrong_preset_hints_the_matching_one(tmp_path):
    demo = UNetModel(PRESETS["demo"])
    path = tmp_path / "demo.pt"
    save_unet_state(path, demo)
    msg = _user_error(load_unet, path, preset="cifar10")
    assert msg.endswith("the checkpoint fits preset 'demo'")
    assert isinstance(load_unet(path, preset="demo"), UNetModel)


def test_assigned_weights_stay_writable_in_place_when_the_file_held_expanded_tensors():
    """A file may hold a tensor expanded from one element (stride 0); assigned as a parameter it could
    not take a table's next run's weights in place (model_set.copy_weights)."""
    from diffsmooth.engine.models.checkpoints import load_weights

    module = torch.nn.Linear(4, 3)
    state = {"weight": torch.zeros(1).expand(3, 4), "bias": torch.zeros(3)}
    load_weights(module, state, "a linear layer", assign=True)
    with torch.no_grad():
        module.weight.copy_(torch.arange(12.0).reshape(3, 4))
    assert module.weight[2, 3] == 11 and module.weight[0, 0] == 0

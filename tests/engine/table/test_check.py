"""`diffsmooth table SPEC --check` and the shipped specs (specs/paper/): the check passes on the official
layout (checkpoints built from the official key lists, tests/data/keys/) and says in one line per
problem, exit 2, what is wrong; every shipped spec parses and reports its missing files cleanly."""

import json
import pickle
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from table_fixtures import write_cifar10_test_batch

from diffsmooth.cli import main
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.table.check import check_table, named_files, official_shapes
from diffsmooth.engine.table.spec import load_spec, parse_spec

ROOT = Path(__file__).resolve().parents[3]
KEYS = ROOT / "tests" / "data" / "keys"
SPECS = sorted((ROOT / "specs" / "paper").rglob("*.toml"))
TABLE1 = ROOT / "specs" / "paper" / "cifar10-table1.toml"
OFFICIAL = ("cohen_cifar_resnet110", "cohen_cifar_resnet20", "cohen_imagenet_resnet50", "cifar10_uncond_50M_500K",
            "256x256_diffusion_uncond")


def key_list(name):
    """The official key list: [(name as stored, shape, dtype)]."""
    return [(k, tuple(shape), dtype) for k, shape, dtype in json.loads((KEYS / f"{name}.json").read_text())["entries"]]


def state_dict_from(name, change=None):
    """A zero-weight state dict with the official names, shapes and dtypes; each tensor is one element
    expanded (stride 0), so the file stays small. `change(entries)` edits the (name, shape, dtype) list."""
    entries = key_list(name)
    if change:
        entries = change(entries)
    zero = lambda dtype: torch.zeros((), dtype=getattr(torch, dtype))
    return {k: zero(dtype).expand(shape) for k, shape, dtype in entries}


def save_cohen(path, name="cohen_cifar_resnet110", arch="cifar_resnet110", change=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"arch": arch, "state_dict": state_dict_from(name, change), "epoch": 90}, path)


@pytest.fixture(scope="module")
def layout(tmp_path_factory):
    """MODELS and DATA folders as docs/paper-tables.md lays them out for the CIFAR-10 specs: the official
    UNet, every classifier (one Cohen-format ResNet-110 file, linked under each official name) and a
    CIFAR-10 test batch of 10,000 images."""
    root = tmp_path_factory.mktemp("paper")
    models, data = root / "models", root / "data"
    torch.save(state_dict_from("cifar10_uncond_50M_500K"), models.mkdir(parents=True) or models / "cifar10_uncond_50M_500K.pt")
    save_cohen(root / "resnet110.pth.tar")
    spec = load_spec(TABLE1, {"models": str(models), "data": str(data)})
    for path, use in named_files(spec).items():
        if use.kind == "classifier":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).symlink_to(root / "resnet110.pth.tar")
    write_cifar10_test_batch(data)
    return models, data


def check(spec, models, data, *extra):
    return CliRunner().invoke(main, ["table", str(spec), "--check", "--no-preflight", "--models", str(models),
                                     "--data", str(data), *extra])


def errors(result):
    return [line for line in result.output.splitlines() if line.startswith("error:")]


def replace(path: Path, write):
    """Put another file where a layout's (linked) file was; returns a function that restores it."""
    target = path.resolve()
    path.unlink()
    write(path)

    def restore():
        path.unlink()
        path.symlink_to(target)
    return restore


# -- the official key lists ------------------------------------------------------------------------

@pytest.mark.parametrize("name", OFFICIAL)
def test_the_check_compares_with_the_official_key_lists(name):
    """The check's expected tensors (the engine's architectures on the meta device, prefixes stripped)
    are exactly the official key lists."""
    expected = {}
    for key, shape, _ in key_list(name):
        for prefix in ("1.module.", "1."):
            if key.startswith(prefix):
                key = key[len(prefix):]
                break
        expected[key] = shape
    assert official_shapes(name) == expected


# -- the check on the official layout ------------------------------------------------------------

def test_check_passes_on_the_official_layout_and_writes_nothing(layout, tmp_path):
    models, data = layout
    out = tmp_path / "table"
    result = check(TABLE1, models, data, "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "check passed" in result.output and not errors(result)
    assert "matches the official cohen_cifar_resnet110 key list" in result.output
    assert "matches the official cifar10_uncond_50M_500K key list" in result.output
    assert "500 images" in result.output
    assert "run: DiffSmooth (SmoothAdv), sigma' = sigma/2, sigma 0.25: diffsmooth" in result.output
    assert "normalization center" in result.output and "normalization normalize" in result.output
    assert not out.exists()                         # nothing written


@pytest.mark.parametrize("spec", [p for p in SPECS if p.name.startswith("cifar10")], ids=lambda p: p.stem)
def test_every_shipped_cifar10_spec_passes_the_check_on_the_official_layout(layout, spec):
    result = check(spec, *layout)
    assert result.exit_code == 0, result.output


def _one_error(result, *words):
    assert result.exit_code == 2, result.output
    lines = errors(result)
    assert len(lines) == 1, result.output
    assert "Traceback" not in result.output
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def test_a_missing_file_is_one_line_saying_where_it_comes_from(layout):
    models, data = layout
    path = models / "cohen" / "models" / "cifar10" / "resnet110" / "noise_0.00" / "checkpoint.pth.tar"
    target = path.resolve()
    path.unlink()
    try:
        _one_error(check(TABLE1, models, data), "missing classifier", str(path), "locuslab/smoothing", "DDS (Standard)")
    finally:
        path.symlink_to(target)
    denoiser = models / "cifar10_uncond_50M_500K.pt"
    moved = denoiser.rename(denoiser.with_suffix(".moved"))
    try:
        _one_error(check(TABLE1, models, data), "missing denoiser", "openaipublic.blob.core.windows.net")
    finally:
        moved.rename(denoiser)


def _rename_first(entries):
    return [("1.conv0.weight", *entries[0][1:])] + entries[1:]


def _widen_fc(entries):
    return [(k, (100, 64) if k == "1.fc.weight" else s, d) for k, s, d in entries]


@pytest.mark.parametrize("change,words", [
    (_rename_first, ["1 missing, 1 unexpected, 0 mis-shaped", "conv1.weight", "conv0.weight"]),
    (_widen_fc, ["0 missing, 0 unexpected, 1 mis-shaped", "fc.weight [100, 64] (official [10, 64])"]),
], ids=["wrong-key", "wrong-shape"])
def test_a_wrong_key_or_shape_is_one_line_naming_it(layout, change, words):
    models, data = layout
    path = models / "smoothadv" / "pretrained_models" / "cifar10" / "PGD_10steps_multiNoiseSamples" / "4-multitrain" / \
        "eps_64" / "cifar10" / "resnet110" / "noise_0.12" / "checkpoint.pth.tar"
    restore = replace(path, lambda p: save_cohen(p, change=change))
    try:
        _one_error(check(TABLE1, models, data), "does not match the official cohen_cifar_resnet110 key list", *words)
    finally:
        restore()


class NotWeights:
    """Any class: unpickling it would run code, so weights-only loading refuses the file."""


def test_a_file_that_is_not_weights_only_is_one_line(layout):
    models, data = layout
    path = models / "cohen" / "models" / "cifar10" / "resnet110" / "noise_1.00" / "checkpoint.pth.tar"
    restore = replace(path, lambda p: torch.save({"arch": "cifar_resnet110", "state_dict": {}, "x": NotWeights()}, p))
    try:
        _one_error(check(TABLE1, models, data), "refusing to load", str(path), "NotWeights")
    finally:
        restore()


def test_a_missing_data_folder_or_image_is_one_line(layout, tmp_path):
    models, _ = layout
    _one_error(check(TABLE1, models, tmp_path), "missing data folder", "cifar-10-python.tar.gz",
               f"extracted into {tmp_path} ({tmp_path}/cifar-10-batches-py/test_batch)")
    short = tmp_path / "cifar-10-batches-py"
    short.mkdir()
    (short / "test_batch").write_bytes(pickle.dumps({"data": np.zeros((5000, 3072), np.uint8), "labels": [0] * 5000}))
    _one_error(check(TABLE1, models, tmp_path), "the selection holds 250 images", "expects 500")


def test_a_normalisation_other_than_the_sources_is_one_line(layout, tmp_path):
    models, data = layout
    text = TABLE1.read_text().replace('source = "smoothadv"\n', 'source = "smoothadv"\nnormalization = "normalize"\n', 1)
    spec = tmp_path / "wrong.toml"
    spec.write_text(text)
    _one_error(check(spec, models, data), "line 'SmoothAdv (Salman et al.)': normalization 'normalize'", "center")


# -- every shipped spec ----------------------------------------------------------------------------

@pytest.mark.parametrize("spec", SPECS, ids=lambda p: str(p.relative_to(ROOT / "specs" / "paper")))
def test_every_shipped_spec_parses_and_reports_its_missing_files(spec, tmp_path):
    """With empty folders: one `error: missing ...` line per file and one for the data, exit 2."""
    (tmp_path / "m").mkdir()
    (tmp_path / "d").mkdir()
    parsed = load_spec(spec, {"models": str(tmp_path / "m"), "data": str(tmp_path / "d")})
    assert parsed.data.get("images") == 500 and parsed.alpha == 0.001 and parsed.n0 == 100
    assert all(line.source for line in parsed.lines)
    result = check(spec, tmp_path / "m", tmp_path / "d")
    assert result.exit_code == 2 and "Traceback" not in result.output
    lines = errors(result)
    assert len(lines) == len(named_files(parsed)) + 1, result.output
    assert all(line.startswith("error: missing ") and "get it from" in line for line in lines), result.output


def test_a_lines_source_sets_its_runs_normalisation(tmp_path):
    """cohen: divide by the std; smoothadv: subtract the mean; beit: the timm model's own statistics, even
    where [models] names a normalisation; a line's own `normalization` wins."""
    folders = {"models": str(tmp_path), "data": str(tmp_path)}
    table1 = load_spec(TABLE1, folders)
    layers = {line.name: table1.request_options(line, 0.5).get("normalization") for line in table1.lines}
    assert layers["Gaussian (Cohen et al.)"] == "normalize" and layers["SmoothAdv (Salman et al.)"] == "center"
    beit_file = tmp_path / "beit.toml"
    beit_file.write_text((ROOT / "specs" / "paper" / "imagenet-table2-beit.toml").read_text()
                         .replace('preset = "imagenet"', 'preset = "imagenet"\nnormalization = "normalize"'))
    beit = load_spec(beit_file, folders)
    assert beit.models["normalization"] == "normalize"
    assert all("normalization" not in beit.request_options(line, 0.5) for line in beit.lines)
    own = parse_spec({"line": [{"method": "rs", "source": "smoothadv", "normalization": "none"}],
                      "data": {"dataset": "embedded"}})
    assert own.request_options(own.lines[0], 0.5)["normalization"] == "none"
    with pytest.raises(UserError, match="source must be one of cohen, smoothadv, beit"):
        parse_spec({"line": [{"method": "rs", "source": "madry"}]})


def test_check_and_out(tmp_path):
    """--check needs no --out; a table without --check needs one; the demo passes the check."""
    result = CliRunner().invoke(main, ["table", "--demo"])
    assert result.exit_code == 2 and result.output.count("\n") == 1 and "give --out DIR" in result.output
    result = CliRunner().invoke(main, ["table", "--demo", "--check", "--no-preflight"])
    assert result.exit_code == 0 and "check passed" in result.output and "run: DiffSmooth, sigma 1: diffsmooth" in result.output


def test_a_placeholder_without_its_folder_is_one_line(tmp_path):
    with pytest.raises(UserError, match=r"uses \{models\}: give --models DIR"):
        load_spec(TABLE1, {"data": str(tmp_path)})
    result = CliRunner().invoke(main, ["table", str(TABLE1), "--check", "--data", str(tmp_path)])
    assert result.exit_code == 2 and result.output.count("\n") == 1 and "give --models DIR" in result.output


def test_specs_without_the_new_keys_keep_their_fingerprint():
    """`source` / `normalization` / `images` left out: the spec's dict (and fingerprint) is as before."""
    spec = parse_spec({"line": [{"method": "rs"}], "data": {"dataset": "embedded", "skip": 50}})
    assert set(spec.as_dict()["lines"][0]) == {"name", "method", "classifier", "local_sigma", "m", "local_noise"}
    report = check_table(spec)
    assert not report.problems and any(line.startswith("data: embedded") for line in report.plan)


def test_beit_checkpoints_are_compared_with_the_timm_model(tmp_path):
    """BEiT-L/16 has no official key list: its files must hold the installed timm model's tensors
    (after timm's own renaming of older checkpoints), built on the meta device."""
    from diffsmooth.engine.table.check import timm_net
    try:
        net = timm_net("beit_large_patch16_224")
    except UserError as exc:
        pytest.skip(f"timm is not installed: {exc}")
    spec_path = ROOT / "specs" / "paper" / "imagenet-sigma-prime" / "beit-sigma-0.25.toml"
    models = tmp_path / "m"
    models.mkdir()
    torch.save(state_dict_from("256x256_diffusion_uncond"), models / "256x256_diffusion_uncond.pt")
    tensors = {f"1.{k}": torch.zeros((), dtype=v.dtype).expand(v.shape) for k, v in net.state_dict().items()}
    spec = load_spec(spec_path, {"models": str(models), "data": str(tmp_path)})
    files = [path for path, use in named_files(spec).items() if use.kind == "classifier"]
    for path in files:
        Path(path).parent.mkdir(parents=True)
        torch.save({"arch": "beit_large_patch16_224", "state_dict": tensors}, path)
    report = check_table(spec)
    assert [p for p in report.problems if not p.startswith("missing data folder")] == []
    assert sum("matches the timm beit_large_patch16_224 key list" in line for line in report.plan) == 2
    assert any("matches the official 256x256_diffusion_uncond key list" in line for line in report.plan)
    del tensors["1.head.weight"]
    torch.save({"arch": "beit_large_patch16_224", "state_dict": tensors}, files[0])
    torch.save({"arch": "resnet50", "state_dict": tensors}, files[1])
    problems = [p for p in check_table(spec).problems if not p.startswith("missing data folder")]
    assert len(problems) == 2
    assert "does not match the timm beit_large_patch16_224 key list: 1 missing" in problems[0]
    assert "records architecture 'resnet50', not a timm model" in problems[1]


@pytest.mark.parametrize("spec", SPECS, ids=lambda p: str(p.relative_to(ROOT / "specs" / "paper")))
def test_shipped_specs_have_the_papers_settings(spec, tmp_path):
    """n (100,000 on CIFAR-10, 10,000 on ImageNet; a same-N spec's N, with N x m that number), Cohen et al.'s
    500-image selection, m = 21 outside the m ablation and the same-N tables, and every DiffSmooth line's local
    noise at its classifier's training level plus the paper's shift (CIFAR-10 + 0.03; ImageNet + 0.01 at sigma
    0.25, + 0.02 above; none in the appendix's table without it, imagenet-sigma-prime-noshift/)."""
    parsed = load_spec(spec, {"models": str(tmp_path), "data": str(tmp_path)})
    cifar = parsed.data["dataset"] == "cifar10"
    same_n = re.fullmatch(r".*n-(\d+)-m-(\d+)\.toml", spec.name) if spec.parent.name.endswith("same-n") else None
    paper_n = 100000 if cifar else 10000
    n, m = map(int, same_n.groups()) if same_n else (paper_n, 21)
    assert (parsed.n_max, parsed.data["skip"]) == ((n, 20) if cifar else (n, 100))
    assert not same_n or n * m == paper_n or spec.name == "resnet50-smoothadv-n-20000-m-5.toml"   # the row as printed
    assert parsed.sigmas == (0.25, 0.5, 1.0) or len(parsed.sigmas) == 1
    for line in parsed.lines:
        if line.method != "diffsmooth":
            continue
        for sigma in parsed.sigmas:
            path, = line.classifier[sigma]
            level = float(path.rsplit("noise_", 1)[1].split("/")[0].removeprefix("sd"))
            shift = 0.0 if spec.parent.name.endswith("noshift") else 0.03 if cifar else (0.01 if sigma == 0.25 else 0.02)
            assert line.local_sigma[sigma] == (pytest.approx(level + shift),), (line.name, sigma)
            assert level <= sigma
            assert line.m[sigma] == ((int(line.name.rsplit("m = ", 1)[1]),) if "ablation" in spec.name else (m,))

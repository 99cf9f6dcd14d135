"""Every shipped spec (specs/paper/) against files laid out as docs/paper-tables.md says, built from the
official key lists with random weights: `--dry-run --plan fixed` predicts each table's samples, and the
CIFAR-10 specs run end to end with `--smoke` on the real architectures (the CIFAR-10 UNet, ResNet-110)
and write every output in its layout. The ImageNet specs run with the official UNet and ResNet-50 on images
cropped to 32x32 (at 224 one UNet sample takes about a minute on these CPUs); the BEiT ones keep 224. The suite
runs three specs end to end; DIFFSMOOTH_PAPER_SMOKE=all runs every one (docs/paper-tables.md, "Smoke runs"). Every
SmoothAdv checkpoint a spec names is the model the paper's appendix selects for its noise level."""

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_helpers import invoke_ok
from click.testing import CliRunner
from table_fixtures import write_cifar10_test_batch

from diffsmooth.cli import main
from diffsmooth.engine.table.check import named_files
from diffsmooth.engine.table.spec import SMOKE_BATCH, SMOKE_IMAGENET_SIZE, SMOKE_IMAGES, SMOKE_N, SMOKE_N0, load_spec, smoke_spec

ROOT = Path(__file__).resolve().parents[3]
KEYS = ROOT / "tests" / "data" / "keys"
SPECS = sorted((ROOT / "specs" / "paper").rglob("*.toml"))
CIFAR = [p for p in SPECS if p.name.startswith("cifar10") or p.parent.name.startswith("cifar10")]
IMAGENET = [p for p in SPECS if p not in CIFAR]
# A smoke run costs about 30 CPU-seconds per line and sigma with the full-size CIFAR-10 models on these
# CPUs, so every CIFAR-10 spec (141 runs) takes tens of CPU-minutes: the suite runs the smallest one (6 runs, both
# classifier sources, groups); DIFFSMOOTH_PAPER_SMOKE=all runs them all.
SMOKE_DEFAULT = ("cifar10-sigma-prime/sigma-0.25.toml", "cifar10-m-ablation.toml")     # about a minute each
# a small ImageNet spec (3 lines, 1 sigma: both SmoothAdv models of the paper's sigma = 0.25)
SMOKE_IMAGENET_DEFAULT = "imagenet-sigma-prime/resnet50-sigma-0.25.toml"
SMOKE_ALL = os.environ.get("DIFFSMOOTH_PAPER_SMOKE") == "all"


def _entries(name):
    return json.loads((KEYS / f"{name}.json").read_text())["entries"]


def random_state_dict(name, seed=0):
    """The official names, shapes and dtypes with random weights (BatchNorm statistics mean 0, variance 1),
    so the classifier's votes depend on its input."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for key, shape, dtype in _entries(name):
        if dtype != "float32":
            out[key] = torch.zeros(shape, dtype=getattr(torch, dtype))
        elif key.endswith("running_var"):
            out[key] = torch.ones(shape)
        elif key.endswith("running_mean"):
            out[key] = torch.zeros(shape)
        else:
            out[key] = 0.2 * torch.randn(shape, generator=g)
    return out


def zero_state_dict(name):
    """The official names and shapes, zeros (a UNet whose noise estimate is 0: the pipeline runs as with
    trained weights, the denoised image is the rescaled noisy one)."""
    return {k: torch.zeros(shape, dtype=getattr(torch, dtype)) for k, shape, dtype in _entries(name)}


@pytest.fixture(scope="module")
def cifar_layout(tmp_path_factory):
    """MODELS and DATA for every CIFAR-10 spec: the official UNet's tensors (zero, 210 MB), one random-weight
    Cohen-format ResNet-110 linked under every classifier name, and a random CIFAR-10 test batch."""
    root = tmp_path_factory.mktemp("paper")
    models, data = root / "models", root / "data"
    models.mkdir()
    torch.save(zero_state_dict("cifar10_uncond_50M_500K"), models / "cifar10_uncond_50M_500K.pt")
    torch.save({"arch": "cifar_resnet110", "state_dict": random_state_dict("cohen_cifar_resnet110"), "epoch": 90},
               root / "resnet110.pth.tar")
    for spec in CIFAR:
        for path, use in named_files(load_spec(spec, {"models": str(models), "data": str(data)})).items():
            if use.kind == "classifier" and not Path(path).exists():
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                Path(path).symlink_to(root / "resnet110.pth.tar")
    write_cifar10_test_batch(data)
    return models, data


@pytest.fixture(scope="module")
def imagenet_layout(tmp_path_factory):
    """MODELS and DATA for every ImageNet spec: the official UNet's tensors (zero, each one element expanded:
    2.2 GB otherwise), a random-weight ResNet-50 with the official names and shapes, BEiT-L/16's tensors as
    the installed timm model has them (zero, expanded; the BEiT specs skip without timm), and a validation
    folder of 1,000 classes x 50 images, each a link to one small PNG."""
    from PIL import Image

    from diffsmooth.engine.errors import UserError
    from diffsmooth.engine.table.check import timm_net
    root = tmp_path_factory.mktemp("imagenet")
    models, data = root / "models", root / "data"
    models.mkdir()
    expanded = lambda name: {k: torch.zeros((), dtype=getattr(torch, d)).expand(shape) for k, shape, d in _entries(name)}
    torch.save(expanded("256x256_diffusion_uncond"), models / "256x256_diffusion_uncond.pt")
    torch.save({"arch": "resnet50", "state_dict": random_state_dict("cohen_imagenet_resnet50")}, root / "resnet50.pth.tar")
    try:
        net = timm_net("beit_large_patch16_224")
        beit = {f"1.{k}": torch.zeros((), dtype=v.dtype).expand(v.shape) for k, v in net.state_dict().items()}
        torch.save({"arch": "beit_large_patch16_224", "state_dict": beit}, root / "beit.pth.tar")
    except UserError:
        pass
    for spec in IMAGENET:
        for path, use in named_files(load_spec(spec, {"models": str(models), "data": str(data)})).items():
            source = root / ("beit.pth.tar" if "beit" in path else "resnet50.pth.tar")
            if use.kind == "classifier" and source.exists() and not Path(path).exists():
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                Path(path).symlink_to(source)
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 48, 3), dtype=np.uint8)).save(root / "image.png")
    for k in range(1000):
        folder = data / "imagenet" / "val" / f"n{k:08d}"
        folder.mkdir(parents=True)
        for j in range(50):
            (folder / f"{j:02d}.png").symlink_to(root / "image.png")
    return models, data


def _table(spec, layout, out, *extra):
    models, data = layout
    return invoke_ok(["table", str(spec), "--models", str(models), "--data", str(data), "--out", str(out), "--quiet",
                      "--no-preflight", *extra])       # the stand-in weights' preflight would only say they are wrong


@pytest.mark.parametrize("spec", CIFAR, ids=lambda p: str(p.relative_to(ROOT / "specs" / "paper")))
def test_dry_run_predicts_the_fixed_n_samples_of_every_cifar10_spec(spec, cifar_layout, tmp_path):
    parsed = load_spec(spec, {"models": "m", "data": "d"})
    result = _table(spec, cifar_layout, tmp_path / "t", "--plan", "fixed", "--dry-run")
    runs = len(parsed.lines) * len(parsed.sigmas)
    samples = 500 * (parsed.n0 + parsed.n_max) * runs
    assert f"main phase predicted {samples:,} samples" in result.output
    assert not (tmp_path / "t" / "table.md").exists() and not list((tmp_path / "t" / "runs").iterdir())


@pytest.mark.slow                   # the check and the dry run each decode the 500 selected images: seconds each
@pytest.mark.parametrize("spec", IMAGENET, ids=lambda p: str(p.relative_to(ROOT / "specs" / "paper")))
def test_dry_run_predicts_the_fixed_n_samples_of_every_imagenet_spec(spec, imagenet_layout, tmp_path):
    parsed = load_spec(spec, {"models": "m", "data": "d"})
    if any(line.source == "beit" for line in parsed.lines) and not list(imagenet_layout[0].glob("beit*")):
        pytest.skip("timm is not installed (the BEiT specs need it)")
    result = _table(spec, imagenet_layout, tmp_path / "t", "--plan", "fixed", "--dry-run")
    runs = len(parsed.lines) * len(parsed.sigmas)
    assert f"main phase predicted {500 * (parsed.n0 + parsed.n_max) * runs:,} samples" in result.output
    assert not (tmp_path / "t" / "table.md").exists()


# The paper's appendix: tab:selected_smoothadv (noise level -> attack, steps, eps, training noise samples m) and
# tab:cifar_self (the self-training models, "extra data": attack, steps, eps, weight). The paper's "DNN" is SmoothAdv's
# DDN. At sigma = 0.25 on ImageNet the appendix's text names eps 64 instead of 512: the lines and specs marked eps 64.
SELECTED_SMOOTHADV = {("cifar10", "0.12"): ("PGD", 10, 64, 4), ("cifar10", "0.25"): ("PGD", 10, 255, 8),
                      ("cifar10", "0.50"): ("PGD", 10, 512, 2), ("cifar10", "1.00"): ("PGD", 10, 512, 2),
                      ("imagenet", "0.25"): ("DDN", 2, 512, 1), ("imagenet", "0.50"): ("PGD", 1, 255, 1),
                      ("imagenet", "1.00"): ("PGD", 1, 512, 1)}
CIFAR_SELF_TRAINING = {"0.12": ("PGD", 8, 64, 1.0), "0.25": ("PGD", 4, 127, 1.0), "0.50": ("PGD", 2, 255, 0.5),
                       "1.00": ("PGD", 8, 512, 0.5)}
SMOOTHADV_PATHS = {  # the release's folders (docs/paper-tables.md): what each says of the model
    "self": re.compile(r"/cifar10/self_training/(PGD)_(\d+)steps/weight_([\d.]+)/eps_(\d+)/cifar10/resnet110/noise_(\d\.\d\d)/"),
    "cifar10": re.compile(r"/cifar10/(PGD)_(\d+)steps_multiNoiseSamples/(\d+)-multitrain/eps_(\d+)/cifar10/resnet110/"
                          r"noise_(\d\.\d\d)/"),
    "imagenet": re.compile(r"/imagenet/(PGD|DDN)_(\d+)steps?/eps_(\d+)/resnet50/noise_(\d\.\d\d)/")}


def _smoothadv_model(path):
    """(dataset, noise level, extra data, (attack, steps, eps, m or weight)) of a SmoothAdv checkpoint path."""
    if match := SMOOTHADV_PATHS["self"].search(path):
        attack, steps, weight, eps, level = match.groups()
        return "cifar10", level, True, (attack, int(steps), int(eps), float(weight))
    if match := SMOOTHADV_PATHS["cifar10"].search(path):
        attack, steps, m, eps, level = match.groups()
        return "cifar10", level, False, (attack, int(steps), int(eps), int(m))
    attack, steps, eps, level = SMOOTHADV_PATHS["imagenet"].search(path).groups()
    return "imagenet", level, False, (attack, int(steps), int(eps), 1)


@pytest.mark.parametrize("spec", SPECS, ids=lambda p: str(p.relative_to(ROOT / "specs" / "paper")))
def test_every_smoothadv_checkpoint_is_the_papers_selected_model(spec):
    """Per line and sigma: the SmoothAdv model's attack, steps, eps and m (or self-training weight) are the appendix's
    for its noise level, extra-data models exactly on the lines named so, and eps 64 exactly where a line or spec
    takes the appendix's reading of ImageNet at sigma 0.25."""
    parsed = load_spec(spec, {"models": "m", "data": "d"})
    for line in parsed.lines:
        for sigma in parsed.sigmas:
            path, = line.classifier[sigma]
            if line.source != "smoothadv":
                assert "/smoothadv/" not in path, (line.name, sigma)
                continue
            dataset, level, extra, model = _smoothadv_model(path)
            assert dataset == parsed.data["dataset"] and extra == ("extra data" in line.name), (line.name, sigma)
            expected = CIFAR_SELF_TRAINING[level] if extra else SELECTED_SMOOTHADV[(dataset, level)]
            if dataset == "imagenet" and sigma == 0.25 and ("eps 64" in line.name or spec.name.endswith("-eps64.toml")):
                expected = expected[:2] + (64,) + expected[3:]
            assert model == expected, (line.name, sigma, path)


def test_the_smoke_size_keeps_every_run_and_file_and_moves_to_the_cpu_without_cuda():
    spec = load_spec(ROOT / "specs" / "paper" / "cifar10-table1.toml", {"models": "/m", "data": "/d"})
    smoke, notes = smoke_spec(spec, cuda=False)
    assert (smoke.n0, smoke.n_max, smoke.data["images"], smoke.data["max"]) == (SMOKE_N0, SMOKE_N, SMOKE_IMAGES, 40)
    assert smoke.lines == spec.lines and smoke.sigmas == spec.sigmas and smoke.radii == spec.radii
    assert smoke.models == spec.models and smoke.run == {"device": "cpu", "batch": SMOKE_BATCH}
    assert "not the paper's numbers" in smoke.title and smoke.fingerprint() != spec.fingerprint()
    assert len(notes) == 2 and "no CUDA device here" in notes[1]
    on_gpu, notes = smoke_spec(spec, cuda=True)
    assert on_gpu.run == {"device": "cuda", "batch": SMOKE_BATCH} and len(notes) == 1
    result = CliRunner().invoke(main, ["table", "--demo", "--smoke", "--out", "x"])
    assert result.exit_code == 2 and result.output.count("\n") == 1 and "--smoke belongs to a SPEC" in result.output


def test_imagenet_smoke_runs_crop_to_a_small_size_on_the_cpu_only_and_never_for_beit():
    folders = {"models": "/m", "data": "/d"}
    resnet = load_spec(ROOT / "specs" / "paper" / "imagenet-table2-resnet50.toml", folders)
    smoke, notes = smoke_spec(resnet, cuda=False)
    assert smoke.data["image_size"] == SMOKE_IMAGENET_SIZE and "cropped to 32x32" in notes[-1]
    assert smoke.request_options(smoke.lines[0], smoke.sigmas[0])["image_size"] == SMOKE_IMAGENET_SIZE
    assert "image_size" not in smoke_spec(resnet, cuda=True)[0].data
    beit = load_spec(ROOT / "specs" / "paper" / "imagenet-table2-beit.toml", folders)
    assert "image_size" not in smoke_spec(beit, cuda=False)[0].data
    from diffsmooth.engine.errors import UserError
    from diffsmooth.engine.runs.request import RunRequest
    from diffsmooth.engine.runs.resolve import open_dataset
    with pytest.raises(UserError, match="`image_size` is for ImageNet-style folders"):
        open_dataset(RunRequest.parse("certify", out="x.tsv", image_size=16))
    with pytest.raises(UserError, match="image_size"):
        RunRequest.parse("certify", out="x.tsv", image_size=0)


@pytest.mark.slow
@pytest.mark.parametrize("spec", CIFAR, ids=lambda p: str(p.relative_to(ROOT / "specs" / "paper")))
def test_every_cifar10_spec_runs_end_to_end_at_the_smoke_size(spec, cifar_layout, tmp_path):
    if not SMOKE_ALL and spec.relative_to(ROOT / "specs" / "paper").as_posix() not in SMOKE_DEFAULT:
        pytest.skip("tens of CPU-minutes for every spec: DIFFSMOOTH_PAPER_SMOKE=all runs them")
    _smoke_and_check_layout(spec, cifar_layout, tmp_path / "t")


@pytest.mark.slow
@pytest.mark.parametrize("spec", IMAGENET, ids=lambda p: str(p.relative_to(ROOT / "specs" / "paper")))
def test_every_imagenet_spec_runs_end_to_end_at_the_smoke_size(spec, imagenet_layout, tmp_path):
    """The official ImageNet UNet and ResNet-50 (their real shapes) on images cropped to SMOKE_IMAGENET_SIZE;
    the BEiT specs keep 224 (BEiT's position tables fix it), where one UNet sample takes about a minute."""
    parsed = load_spec(spec, {"models": "m", "data": "d"})
    beit = any(line.source == "beit" for line in parsed.lines)
    if beit and not list(imagenet_layout[0].glob("beit*")):
        pytest.skip("timm is not installed (the BEiT specs need it)")
    if not SMOKE_ALL and spec.relative_to(ROOT / "specs" / "paper").as_posix() != SMOKE_IMAGENET_DEFAULT:
        pytest.skip("minutes of CPU per spec (8 to 19 for BEiT's): DIFFSMOOTH_PAPER_SMOKE=all runs them")
    result = _smoke_and_check_layout(spec, imagenet_layout, tmp_path / "t")
    assert (f"cropped to {SMOKE_IMAGENET_SIZE}x{SMOKE_IMAGENET_SIZE}" in result.output) != beit or torch.cuda.is_available()
    settings = json.loads(next((tmp_path / "t" / "runs").glob("*.settings.json")).read_text())
    assert settings.get("image_size") == (None if beit else SMOKE_IMAGENET_SIZE)


def _smoke_and_check_layout(spec, files, out):
    """`--plan fixed --smoke` on SPEC, then every output's layout: rows, radii, ACR, the per-configuration table."""
    parsed = load_spec(spec, {"models": "m", "data": "d"})
    result = _table(spec, files, out, "--plan", "fixed", "--smoke")
    assert "smoke: no CUDA device here" in result.output or torch.cuda.is_available()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["images"] == SMOKE_IMAGES
    runs = len(parsed.lines) * len(parsed.sigmas)
    assert summary["samples"]["total"] == SMOKE_IMAGES * (SMOKE_N0 + SMOKE_N) * runs
    # table.md: a row per line, a column per radius and the ACR (fixed-n)
    assert [row["name"] for row in summary["rows"]] == [line.name for line in parsed.lines]
    assert all([c["radius"] for c in row["cells"]] == list(parsed.radii) and row["acr"] is not None
               for row in summary["rows"])
    md = (out / "table.md").read_text().splitlines()
    assert md[2] == "| method | " + " | ".join(f"r = {r:g}" for r in parsed.radii) + " | ACR |"
    # table_by_config: a row per sigma and line (no shipped line sweeps), sigma' and m as the spec says
    layout = summary["by_config"]
    diffsmooth = lambda line, values, sigma: values[sigma][0] if line.method == "diffsmooth" else None
    expected = [(line.group, sigma, line.name, diffsmooth(line, line.local_sigma, sigma), diffsmooth(line, line.m, sigma))
                for group in dict.fromkeys(line.group for line in parsed.lines)
                for sigma in parsed.sigmas for line in parsed.lines if line.group == group]
    got = [(r["group"], r["sigma"], r["line"], r["local_sigma"], r["m"]) for r in layout["rows"]]
    assert got == expected
    assert layout["no_acr"] is None and all(r["acr"] is not None for r in layout["rows"])
    by_config = (out / "table_by_config.md").read_text()
    assert by_config.count("\n| ") == 1 + len(got) and f"[smoke: {SMOKE_IMAGES} images" in by_config
    tex = (out / "table_by_config.tex").read_text()
    assert tex.count("\\midrule") == len({(g, s) for g, s, *_ in got}) and "\\end{tabular}" in tex
    for name in ("table.tex", "curves.png", "table.json", "cost.json"):
        assert (out / name).is_file(), name
    return result

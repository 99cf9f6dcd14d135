"""Sweeps: one denoising pass serves every configuration, and each configuration's rows equal a
separate single-configuration run with the same seed."""

import json
import shutil
from decimal import Decimal
from pathlib import Path

import pytest
import torch
from cli_helpers import assert_rows_spread, rows_without_time
from cli_helpers import invoke_ok as invoke
from click.testing import CliRunner

from diffsmooth.cli import main
from diffsmooth.engine.base_classifier.configurations import Configuration, configurations
from diffsmooth.engine.base_classifier.methods import MethodConfig
from diffsmooth.engine.certify.noise import fixed_local_noise
from diffsmooth.engine.runs.results import RADIUS_FORMAT, RADIUS_FORMAT_KEY, read_rows

FAST = ["--n0", "8", "--n", "40", "--batch", "16", "--quiet", "--max", "3"]


def _model_args(tiny_models, classifiers):
    args = ["--denoiser", tiny_models["unet"], "--preset", "cifar10", "--unet-config", tiny_models["unet_config"],
            "--dataset", "npz", "--data", tiny_models["data"], "--sigma", tiny_models["sigma"]]
    for c in classifiers:
        args += ["--classifier", c]
    return args


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fixed", "fresh"])
def test_sweep_rows_equal_single_runs(tmp_path, tiny_models, mode):
    clfs = [tiny_models["classifier"], tiny_models["classifier_b"]]
    sweep_dir = tmp_path / "sweep"
    invoke(["certify", *_model_args(tiny_models, clfs), "--method", "rs", "--method", "dds", "--method", "diffsmooth",
            "--local-sigma", "0.12", "--local-sigma", "0.25", "--m", "1", "--m", "3", "--local-noise", mode,
            *FAST, "--out", sweep_dir])
    index = json.loads((sweep_dir / "index.json").read_text())
    assert len(index["entries"]) == 2 * (1 + 1 + 2 * 2)
    checks = [("rs", clfs[0], []), ("dds", clfs[1], []),
              ("diffsmooth", clfs[0], ["--local-sigma", "0.12", "--m", "3"]),
              ("diffsmooth", clfs[1], ["--local-sigma", "0.12", "--m", "1"])]
    for method, clf, extra in checks:
        single = tmp_path / f"{method}-{clf.stem}-{len(extra)}.tsv"
        invoke(["certify", *_model_args(tiny_models, [clf]), "--method", method, *extra, "--local-noise", mode,
                *FAST, "--out", single])
        name = f"{method}__{clf.stem}" + (f"__ls{extra[1]}__m{extra[3]}" if extra else "")
        assert_rows_spread(single)
        assert rows_without_time(sweep_dir / f"{name}.tsv") == rows_without_time(single), name
    table = invoke(["analyze", sweep_dir, "--radii", "0,0.25"]).output
    assert "best configuration per radius" in table and "not the accuracy of one certified classifier" in table


def test_sweep_resume_and_settings_guard(tmp_path, tiny_models):
    args = ["certify", *_model_args(tiny_models, [tiny_models["classifier"]]), "--method", "dds", "--method", "rs",
            "--n0", "8", "--n", "40", "--batch", "16", "--quiet"]
    out = tmp_path / "s"
    invoke([*args, "--max", "2", "--out", out])
    assert len(read_rows(out / f"dds__{tiny_models['classifier'].stem}.tsv")) == 2
    result = invoke([*args, "--out", out])
    assert "2 already done" in result.output
    assert len(read_rows(out / f"rs__{tiny_models['classifier'].stem}.tsv")) == 6
    bad = CliRunner().invoke(main, [str(a) for a in [*args, "--sigma", "0.5", "--out", out]])
    assert bad.exit_code == 2 and "other settings" in bad.output


def test_configurations_and_nested_fixed_noise():
    configs = configurations(["diffsmooth", "dds"], 0.5, lambda method: {"local_sigma": [0.25, 0.5], "m": [1, 5]},
                             lambda config: ["a", "b"])
    assert len(configs) == 2 * 2 * 2 + 2
    # sigma', then the classifier, then m (the order of a sweep's index and files)
    assert [c.name for c in configs[:4]] == ["diffsmooth__a__ls0.25__m1", "diffsmooth__a__ls0.25__m5",
                                             "diffsmooth__b__ls0.25__m1", "diffsmooth__b__ls0.25__m5"]
    assert Configuration(MethodConfig("diffsmooth", 0.5, 5, 0.25), "a").name == "diffsmooth__a__ls0.25__m5"
    assert Configuration(MethodConfig("rs", 0.5), "a").name == "rs__a"
    # the reference's seed-42 draw is prefix-consistent for the shapes the sweep shares it on
    assert torch.equal(fixed_local_noise(21, (1, 32, 32))[:5], fixed_local_noise(5, (1, 32, 32)))


STORED = Path(__file__).resolve().parents[2] / "data" / "sweep_rows"
# the stored folders hold images 0, 2, ..., 18 (--max 20 --skip 2); the test reruns the first five (--max 10):
# each image's row depends only on its own noise, so they are the stored rows of those images
STORED_ARGS = ["--method", "rs", "--method", "dds", "--method", "diffsmooth", "--local-sigma", "0.25", "--local-sigma",
               "0.5", "--m", "1", "--m", "3", "--sigma", "0.5", "--batch", "64", "--max", "10", "--skip", "2", "--quiet"]
RERUN_IMAGES = 5


def _assert_rows_equal_but_rounded_down(new_path, stored_path):
    """Rows without `time` equal the stored ones of the same images in the stored columns (columns added since
    are not in them), except that the stored rows print the radius rounded to nearest and new rows round it
    down: each new radius (a number) is the stored one or one unit in its 3rd significant digit lower."""
    new = sorted(rows_without_time(new_path), key=lambda r: int(r["idx"]))
    assert len(new) == RERUN_IMAGES
    images = {r["idx"] for r in new}
    stored = sorted((r for r in rows_without_time(stored_path) if r["idx"] in images), key=lambda r: int(r["idx"]))
    new = [{k: r[k] for k in stored[0]} for r in new]
    assert [{k: v for k, v in r.items() if k != "radius"} for r in new] == \
        [{k: v for k, v in r.items() if k != "radius"} for r in stored]
    for a, b in zip(new, stored):
        got, was = Decimal(a["radius"]), Decimal(b["radius"])
        assert got == was or 0 < got < was and was - got <= Decimal(1).scaleb(got.adjusted() - 2), (a, b)


@pytest.mark.slow
@pytest.mark.parametrize("name,extra", [
    ("fixed", ["--n0", "10", "--n", "100"]),
    ("fresh_sequential", ["--local-noise", "fresh", "--n0", "10", "--sequential", "--radii", "0.25,0.5",
                          "--n-max", "500", "--bound", "split-cp", "--futility", "pace"])])   # the rule they were stored with
def test_sweep_rows_equal_rows_stored_before_the_one_voter(tmp_path, name, extra):
    """Sweeps moved onto the one voter and scheduler: every configuration's rows equal those the engine
    wrote before (tests/data/sweep_rows/README.md) apart from the radius now being rounded down, and
    the old folder's index.json is what a run writes today plus `radius_format`; the old folder itself
    (radii rounded to nearest) is refused instead of resumed."""
    out = tmp_path / name
    invoke(["certify", *STORED_ARGS, *extra, "--out", out])
    stored = STORED / name
    files = sorted(p.name for p in stored.glob("*.tsv"))
    assert files == sorted(p.name for p in out.glob("*.tsv")) and len(files) == 6
    for f in files:
        _assert_rows_equal_but_rounded_down(out / f, stored / f)
    assert_rows_spread(out / files[-1], min_classes=3)          # the rows compared spread over classes
    index, old_index = json.loads((out / "index.json").read_text()), json.loads((stored / "index.json").read_text())
    assert index["settings"].pop(RADIUS_FORMAT_KEY) == RADIUS_FORMAT and index == old_index
    resumed = invoke(["certify", *STORED_ARGS, *extra, "--out", out])
    assert f"0 rows ({RERUN_IMAGES} already done)" in resumed.output
    old = shutil.copytree(stored, tmp_path / f"{name}_old")
    refused = CliRunner().invoke(main, ["certify", *STORED_ARGS, *extra, "--out", str(old)])
    assert refused.exit_code == 2 and "rounded to nearest" in refused.output, refused.output

"""The CLI end to end on tiny real models: all methods, batch independence, resume, analyze,
and bad inputs that must give one `error:` line and exit code 2."""

import json

import pytest
from cli_helpers import assert_rows_spread, rows_without_time
from click.testing import CliRunner

from diffsmooth.cli import main
from diffsmooth.engine.runs.results import read_rows

FAST = ["--n0", "8", "--n", "40", "--batch", "16", "--quiet"]


def invoke(args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.mark.parametrize("method,extra", [("rs", []), ("dds", []), ("diffsmooth", ["--m", "3"]),
                                          ("diffsmooth", ["--m", "2", "--local-noise", "fresh"])])
def test_certify_every_method(tmp_path, tiny_cli_args, method, extra):
    out = tmp_path / "sub" / "res.tsv"
    result = invoke(["certify", *tiny_cli_args, "--method", method, *extra, *FAST, "--out", out])
    assert result.exit_code == 0, result.output
    rows = read_rows(out)
    assert [int(r["idx"]) for r in rows] == list(range(6))
    for r in rows:
        assert int(r["predict"]) in range(-1, 10)
        assert int(r["correct"]) == int(int(r["predict"]) == int(r["label"]))
        assert float(r["radius"]) >= 0
        if int(r["predict"]) == -1:
            assert float(r["radius"]) == 0.0          # abstain carries radius 0
        assert ":" in r["time"]
    assert_rows_spread(out, abstain=True)             # the abstain branch is reached, not just allowed
    assert out.read_text().splitlines()[0] == "idx\tlabel\tpredict\tradius\tcorrect\ttime"


def test_batch_size_does_not_change_results(tmp_path, tiny_cli_args):
    a, b = tmp_path / "a.tsv", tmp_path / "b.tsv"
    base = ["certify", *tiny_cli_args, "--method", "diffsmooth", "--m", "2", "--n0", "8", "--n", "40", "--quiet"]
    assert invoke([*base, "--batch", "7", "--out", a]).exit_code == 0
    assert invoke([*base, "--batch", "48", "--out", b]).exit_code == 0
    assert_rows_spread(a)
    assert rows_without_time(a) == rows_without_time(b)


def test_resume_continues_without_duplicates(tmp_path, tiny_cli_args):
    whole, part = tmp_path / "whole.tsv", tmp_path / "part.tsv"
    base = ["certify", *tiny_cli_args, "--method", "dds", *FAST]
    assert invoke([*base, "--out", whole]).exit_code == 0
    assert invoke([*base, "--max", "3", "--out", part]).exit_code == 0
    assert len(read_rows(part)) == 3
    result = invoke([*base, "--out", part])
    assert "3 already done" in result.output
    assert_rows_spread(whole)
    assert rows_without_time(part) == rows_without_time(whole)


def test_skip_and_max_select_like_cohen(tmp_path, tiny_cli_args):
    out, whole = tmp_path / "r.tsv", tmp_path / "whole.tsv"
    assert invoke(["certify", *tiny_cli_args, "--method", "rs", *FAST, "--skip", "2", "--max", "5",
                   "--out", out]).exit_code == 0
    assert [int(r["idx"]) for r in read_rows(out)] == [0, 2, 4]
    # an image's noise is keyed by its dataset index, not by its position in the run
    assert invoke(["certify", *tiny_cli_args, "--method", "rs", *FAST, "--out", whole]).exit_code == 0
    assert_rows_spread(whole)
    assert rows_without_time(out) == [r for r in rows_without_time(whole) if int(r["idx"]) in (0, 2, 4)]


def test_predict_keys_noise_by_dataset_index(tmp_path, tiny_cli_args):
    whole, part = tmp_path / "whole.tsv", tmp_path / "part.tsv"
    base = ["predict", *tiny_cli_args, "--method", "dds", *FAST]
    assert invoke([*base, "--out", whole]).exit_code == 0
    assert_rows_spread(whole, abstain=True)
    assert invoke([*base, "--skip", "2", "--out", part]).exit_code == 0
    assert rows_without_time(part) == [r for r in rows_without_time(whole) if int(r["idx"]) % 2 == 0]


def test_predict_and_analyze(tmp_path, tiny_cli_args):
    pred = tmp_path / "pred.tsv"
    assert invoke(["predict", *tiny_cli_args, "--method", "rs", *FAST, "--out", pred]).exit_code == 0
    assert pred.read_text().splitlines()[0] == "idx\tlabel\tpredict\tcorrect\ttime"
    cert = tmp_path / "cert.tsv"
    assert invoke(["certify", *tiny_cli_args, "--method", "rs", *FAST, "--out", cert]).exit_code == 0
    result = invoke(["analyze", cert, "--radii", "0,0.25"])
    assert result.exit_code == 0 and "| cert | 6 |" in result.output
    result = invoke(["analyze", cert, "--json", "--plot", tmp_path / "curve.png"])
    data = json.loads(result.output.split("wrote")[0])
    assert data[0]["rows"] == 6 and (tmp_path / "curve.png").stat().st_size > 1000


def _error(args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [l for l in result.output.splitlines() if l.strip()]
    return lines[-1]


@pytest.mark.parametrize("extra,message", [
    (["--sigma", "0"], "sigma must be > 0"),
    (["--sigma", "-1"], "sigma must be > 0"),
    (["--local-sigma", "-0.1"], "local sigma must be >= 0"),
    (["--m", "0"], "m (local noises) must be >= 1"),
    (["--alpha", "1.5"], "alpha must be in (0, 1)"),
    (["--n", "0"], "must be >= 1"),
    (["--n0", "0"], "must be >= 1"),
    (["--batch", "0"], "must be >= 1"),
])
def test_bad_parameters(tmp_path, tiny_cli_args, extra, message):
    line = _error(["certify", *tiny_cli_args, *FAST, *extra, "--out", tmp_path / "x.tsv"])
    assert message in line


def test_bad_files_and_shapes(tmp_path, tiny_models, tiny_cli_args):
    out = ["--out", tmp_path / "x.tsv", *FAST]
    args = list(tiny_cli_args)
    missing = list(args)
    missing[missing.index("--classifier") + 1] = str(tmp_path / "nope.pt")
    assert "nope.pt" in _error(["certify", *missing, *out])
    swapped = list(args)                          # a classifier checkpoint where the UNet should be
    swapped[swapped.index("--denoiser") + 1] = str(tiny_models["classifier"])
    assert _error(["certify", *swapped, *out]).startswith("error:")
    import numpy as np
    grey = tmp_path / "grey.npz"                  # 1-channel images for a 3-channel model
    np.savez(grey, images=np.zeros((2, 8, 8), np.uint8), labels=np.array([0, 1]))
    wrong = list(args)
    wrong[wrong.index("--data") + 1] = str(grey)
    assert "shape" in _error(["certify", *wrong, *out])
    nolabels = tmp_path / "bad.npz"
    np.savez(nolabels, images=np.zeros((2, 8, 8, 3), np.uint8))
    bad = list(args)
    bad[bad.index("--data") + 1] = str(nolabels)
    assert "labels" in _error(["certify", *bad, *out])
    assert "--dataset" in _error(["certify", "--data", str(tiny_models["data"]), *out])

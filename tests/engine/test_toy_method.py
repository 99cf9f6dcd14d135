"""A method defined in this file alone, with one new part, a head (docs/extending.md): registered, it certifies
through the command line and the Python API on the engine's keyed noise, its own head runs, and both paths write
the same rows; unregistered, every path refuses it in one line."""

import pytest
import torch
from cli_helpers import assert_rows_spread, invoke_ok, rows_without_time
from click.testing import CliRunner
from torch import nn

from diffsmooth.cli import main
from diffsmooth.engine.base_classifier.methods import Method, MethodConfig, method_named, method_names, register, unregister
from diffsmooth.engine.base_classifier.methods.logits_head import LogitsHead
from diffsmooth.engine.base_classifier.methods.no_purifier import NoPurifier
from diffsmooth.engine.certify.noise import STREAM_SMOOTHING, gaussian
from diffsmooth.engine.data import load_dataset
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.models.checkpoints import load_classifier
from diffsmooth.engine.pipelines import SmoothedClassifier
from diffsmooth.engine.runs.results import read_json, settings_path

FAST = ["--n0", "8", "--n", "40", "--batch", "16", "--quiet"]


class ClampedHead(nn.Module):
    """The classifier on the noisy sample clipped to the image range [0, 1]."""

    def __init__(self, classifier: nn.Module):
        super().__init__()
        self.classifier = classifier

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(x.clamp(0.0, 1.0)).float()


class ClampedLogits(LogitsHead):
    """A head: the classifier's logits on its samples clipped to [0, 1]."""

    def module(self, classifier, image_shape, copies):
        return ClampedHead(classifier)


class ClampedSmoothing(Method):
    """Randomized smoothing whose classifier sees the noisy sample clipped to [0, 1]: no denoiser, one call."""

    name = "clamped-rs"
    line_name = "RS, clipped"
    purifier = NoPurifier
    head = ClampedLogits
    flip_rates = {"fp16": 1e-3, "bf16": 1e-2}


class ClampedSmoothingAPI(SmoothedClassifier):
    method = "clamped-rs"


@pytest.fixture
def clamped():
    register(ClampedSmoothing)
    yield ClampedSmoothing.name
    unregister(ClampedSmoothing.name)


def _classifier(tiny_models):
    return load_classifier(tiny_models["classifier"], dataset="cifar10")


def test_a_method_in_one_file_certifies_through_the_command_line_and_the_api(clamped, tiny_models, tiny_cli_args,
                                                                             tmp_path):
    assert clamped in method_names()
    cli_rows, rs_rows = tmp_path / "cli.tsv", tmp_path / "rs.tsv"
    invoke_ok(["certify", *tiny_cli_args, "--method", clamped, *FAST, "--out", cli_rows])
    invoke_ok(["certify", *tiny_cli_args, "--method", "rs", *FAST, "--out", rs_rows])
    assert_rows_spread(cli_rows, min_classes=3)
    recorded = read_json(settings_path(cli_rows))
    assert recorded["method"] == clamped and "m" not in recorded
    assert rows_without_time(cli_rows) != rows_without_time(rs_rows)         # its head, not RS's, voted

    # the Python API, the same settings: the same rows
    dataset = load_dataset("npz", str(tiny_models["data"]))
    api = ClampedSmoothingAPI(classifier=_classifier(tiny_models), sigma=float(tiny_models["sigma"]), batch=16)
    api_rows = tmp_path / "api.tsv"
    api.certify_dataset(dataset, api_rows, n0=8, n=40, alpha=0.001)
    assert rows_without_time(api_rows) == rows_without_time(cli_rows)


def test_the_engine_runs_the_toy_head_on_the_keyed_noise(clamped, tiny_models):
    """The votes the engine counts for the toy method are those of its head on x + sigma * eps, eps the engine's
    keyed Gaussian noise (seed, image, sample), computed here without the engine's pipeline."""
    sigma = float(tiny_models["sigma"])
    dataset = load_dataset("npz", str(tiny_models["data"]))
    classifier = _classifier(tiny_models).eval()
    api = ClampedSmoothingAPI(classifier=classifier, sigma=sigma, batch=16, seed=5)
    spread = set()
    for index in range(len(dataset)):
        x = dataset[index][0]
        counts = api.smooth_for(x.shape).pipeline.count(x, index, 0, 48, 16)[0]
        eps = gaussian(5, STREAM_SMOOTHING, index, 0, 48, tuple(x.shape))
        with torch.no_grad():
            votes = classifier((x + sigma * eps).clamp(0, 1)).argmax(-1)
        assert counts.tolist() == torch.bincount(votes, minlength=len(counts)).tolist(), index
        spread.add(int(counts.argmax()))
    assert len(spread) >= 3, spread


def test_an_unknown_method_is_refused_in_one_line_on_every_path(tiny_models, tiny_cli_args, tmp_path):
    assert "clamped-rs" not in method_names()
    result = CliRunner().invoke(main, ["certify", *tiny_cli_args, "--method", "clamped-rs", *FAST,
                                       "--out", str(tmp_path / "r.tsv")])
    assert result.exit_code == 2 and "'clamped-rs' is not one of" in result.output, result.output
    with pytest.raises(UserError, match="unknown method 'clamped-rs': choose one of rs, dds, diffsmooth"):
        MethodConfig("clamped-rs", 0.5)
    with pytest.raises(UserError, match="unknown method 'clamped-rs'"):
        ClampedSmoothingAPI(classifier=_classifier(tiny_models), sigma=0.5)
    spec = tmp_path / "spec.toml"
    spec.write_text('title = "t"\nsigmas = [0.5]\n[data]\ndataset = "embedded"\n[[line]]\nmethod = "clamped-rs"\n')
    result = CliRunner().invoke(main, ["table", str(spec), "--check", "--out", str(tmp_path / "t")])
    assert result.exit_code == 2 and f"method must be one of {', '.join(method_names())}, got 'clamped-rs'" in \
        result.output, result.output
    assert len([line for line in result.output.splitlines() if line.strip()]) == 1, result.output


def test_a_method_without_flip_rates_is_refused_when_registered_in_one_line():
    """An fp16 / bf16 run checks its votes against eager fp32 at the method's flip rate: without one, registering fails
    at once (not as a KeyError on the first fp16 run)."""
    class NoRates(ClampedSmoothing):
        name = "no-rates"
        flip_rates = {"fp16": 1e-3}

    with pytest.raises(UserError, match=r"^method 'no-rates' needs `flip_rates` for bf16 \(") as refused:
        register(NoRates)
    assert "\n" not in str(refused.value)
    with pytest.raises(UserError):
        method_named("no-rates")

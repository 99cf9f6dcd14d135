"""A method's own settings (MethodOption, docs/extending.md): a method defined in this file alone with one setting
takes it from `--option NAME=VALUE`, a spec line's key and a Python keyword, the same rows each way; the value
reaches its score head and its result file records it (a resume with another value is refused); a wrong name or
value is refused in one line; the built-in methods record nothing new. And the purifier's own noise stream
(RowNoise): draw d of a row is keyed by (seed, image, sample, d) alone."""

import pytest
import torch
from cli_helpers import assert_rows_spread, invoke_ok, rows_without_time
from click.testing import CliRunner
from torch import nn

from diffsmooth.cli import main
from diffsmooth.engine.base_classifier.methods import Method, MethodConfig, register, unregister
from diffsmooth.engine.base_classifier.methods.config import MethodOption
from diffsmooth.engine.base_classifier.methods.logits_head import LogitsHead
from diffsmooth.engine.base_classifier.methods.no_purifier import NoPurifier
from diffsmooth.engine.certify.noise import STREAM_PURIFY, NoiseKeys, RowNoise, gaussian, gaussian_rows
from diffsmooth.engine.data import load_dataset
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.models.checkpoints import load_classifier
from diffsmooth.engine.pipelines import smoothed_classifier
from diffsmooth.engine.runs.results import read_json, settings_path

FAST = ["--n0", "8", "--n", "40", "--batch", "16", "--quiet"]


class GainHead(nn.Module):
    """The classifier on 0.5 + gain * (x - 0.5): gain 1 is randomized smoothing itself."""

    def __init__(self, classifier: nn.Module, gain: float):
        super().__init__()
        self.classifier, self.gain = classifier, float(gain)

    def forward(self, x):
        return self.classifier(0.5 + self.gain * (x - 0.5)).float()


class Gain(LogitsHead):
    """A head with a setting of its own: the classifier on its samples' contrast scaled by `gain`."""

    options = (MethodOption("gain", float, 1.0, 0.0, 4.0, "contrast of the noisy sample"),)

    def module(self, classifier, image_shape, copies):
        return GainHead(classifier, self.gain)


class GainSmoothing(Method):
    name = "gain-rs"
    purifier = NoPurifier
    head = Gain
    flip_rates = {"fp16": 1e-3, "bf16": 1e-2}


@pytest.fixture
def gain():
    register(GainSmoothing)
    yield GainSmoothing.name
    unregister(GainSmoothing.name)


def test_a_methods_setting_reaches_it_from_the_command_line_a_spec_and_the_api(gain, tiny_models, tiny_cli_args,
                                                                                 tmp_path):
    rows = {}
    for name, extra in (("rs", ["--method", "rs"]), ("one", ["--method", gain]),
                        ("changed", ["--method", gain, "--option", "gain=0.9"])):
        rows[name] = tmp_path / f"{name}.tsv"
        invoke_ok(["certify", *tiny_cli_args, *extra, *FAST, "--out", rows[name]])
    assert_rows_spread(rows["changed"], min_classes=3)
    assert rows_without_time(rows["one"]) == rows_without_time(rows["rs"])        # its default: RS itself
    assert rows_without_time(rows["changed"]) != rows_without_time(rows["one"])      # the value reached its head
    assert read_json(settings_path(rows["changed"]))["gain"] == 0.9
    assert "gain" not in read_json(settings_path(rows["rs"]))
    result = CliRunner().invoke(main, ["certify", *tiny_cli_args, "--method", gain, "--option", "gain=0.5", *FAST,
                                       "--out", str(rows["changed"])])
    assert result.exit_code != 0 and "gain" in result.output and "Traceback" not in result.output, result.output

    dataset = load_dataset("npz", str(tiny_models["data"]))
    classifier = load_classifier(tiny_models["classifier"], dataset="cifar10")
    api = smoothed_classifier(gain, classifier=classifier, sigma=float(tiny_models["sigma"]), batch=16, gain=0.9)
    api_rows = tmp_path / "api.tsv"
    api.certify_dataset(dataset, api_rows, n0=8, n=40, alpha=0.001)
    assert rows_without_time(api_rows) == rows_without_time(rows["changed"])

    spec = tmp_path / "spec.toml"
    spec.write_text(f'title = "t"\nsigmas = [0.5]\n[data]\ndataset = "embedded"\n[[line]]\nmethod = "{gain}"\n'
                    'gain = 0.9\n')
    from diffsmooth.engine.table.spec import load_spec
    assert load_spec(spec).lines[0].options == (("gain", 0.9),)
    spec.write_text(spec.read_text().replace("gain = 0.9", "gain = 9.0"))
    with pytest.raises(UserError, match="line 1: gain-rs setting gain must be 0..4, got 9.0"):
        load_spec(spec)


def test_a_wrong_setting_is_refused_in_one_line(gain, tiny_cli_args, tmp_path):
    with pytest.raises(UserError, match="method gain-rs has no setting 'gian': its settings are gain"):
        MethodConfig(gain, 0.5, options=(("gian", 1.0),))
    with pytest.raises(UserError, match="gain-rs setting gain must be a number, got 'x'"):
        MethodConfig(gain, 0.5, options=(("gain", "x"),))
    with pytest.raises(UserError, match="method rs has no setting 'gain': it has no settings of its own"):
        MethodConfig("rs", 0.5, options=(("gain", 1.0),))
    for args, text in (([gain, "--option", "gain=7"], "gain-rs setting gain must be 0..4, got 7.0"),
                       (["rs", "--option", "gain=1"], "method rs has no setting 'gain'"),
                       ([gain, "--option", "gain=1", "--option", "gain=2"], "a setting is given twice")):
        result = CliRunner().invoke(main, ["certify", *tiny_cli_args, "--method", *args, *FAST,
                                           "--out", str(tmp_path / "x.tsv")])
        assert result.exit_code != 0 and text in result.output and "Traceback" not in result.output, result.output


def test_the_built_in_methods_record_what_they_did():
    assert MethodConfig("rs", 0.5).as_dict() == {"method": "rs", "sigma": 0.5}
    assert MethodConfig("dds", 0.5).as_dict() == {"method": "dds", "sigma": 0.5}
    assert set(MethodConfig("diffsmooth", 0.5).as_dict()) == {"method", "sigma", "m", "local_sigma", "local_noise",
                                                              "local_noise_seed"}


def test_a_rows_purifier_noise_is_keyed_by_seed_image_sample_and_draw():
    keys = NoiseKeys(3, STREAM_PURIFY, "cpu")
    images, samples = torch.tensor([2, 2, 5]), torch.tensor([1, 6, 1])
    noise = RowNoise(keys, images, samples)
    first = noise.normal(0, (2, 3, 3))
    # draw 0 is the stream's plain draw, so a one-shot purifier noise would equal gaussian()'s
    assert torch.equal(first[1:2], gaussian(3, STREAM_PURIFY, 2, 6, 1, (2, 3, 3)))
    for d in (1, 7):
        drawn = noise.normal(d, (2, 3, 3))
        assert not torch.equal(drawn, first)
        for r in range(3):
            assert torch.equal(drawn[r:r + 1], gaussian_rows(keys, images[r:r + 1], samples[r:r + 1], (2, 3, 3), draw=d))
    with pytest.raises(ValueError, match="32-bit element counter"):
        noise.normal(2 ** 31, (4,) * 4)


def test_a_methods_score_tolerance_reaches_the_agreement_check(gain, tiny_models):
    """A method whose scores are not logits or probabilities says how far a fast path's may move (Method.
    score_tolerance); its stages carry it and the run-time check judges with it instead of the default."""
    import numpy as np

    from diffsmooth.engine.backends.torch.runner import TorchRunner
    from diffsmooth.engine.backends.torch.stages import build_torch_stages
    from diffsmooth.engine.runs.fast_path import judge_each_configuration

    classifier = load_classifier(tiny_models["classifier"], dataset="cifar10")
    config = MethodConfig(gain, 0.25)
    assert build_torch_stages(config, classifier, None, TorchRunner("cpu"), (3, 8, 8)).score_tolerance is None
    Gain.score_tolerance = lambda self, copies: 0.5
    try:
        assert build_torch_stages(config, classifier, None, TorchRunner("cpu"), (3, 8, 8)).score_tolerance == 0.5
    finally:
        del Gain.score_tolerance
    reference = np.tile(np.array([[4.0, 1.0, 0.0]]), (20, 1))[:, None, :]       # [samples, E, K]
    fast = reference + np.array([0.0, 1.0, 0.0])                                 # 1 / (1 + 4) apart, no vote moved
    counts = [np.array([[20, 0, 0]])]
    assert not judge_each_configuration(counts, [fast], [reference], [0]).ok
    assert judge_each_configuration(counts, [fast], [reference], [0], score_tolerance=0.5).ok

"""DensePure (engine/base_classifier/methods/densepure.py) on the engine's paths: its majority vote breaks ties as
DensePure's merge script does; its chain's noise is keyed by (image, sample, run, step), so counts are equal
across batch sizes and shards; the command line, a table spec and the Python API run it with its own settings
(`--option`, spec keys, keywords) and write the same rows; where it cannot run it is refused in one line."""

import random

import numpy as np
import pytest
import torch
from cli_helpers import assert_rows_spread, invoke_ok, rows_without_time
from click.testing import CliRunner
from torch import nn

from diffsmooth.cli import main
from diffsmooth.engine.base_classifier.methods import MethodConfig, method_named
from diffsmooth.engine.base_classifier.methods.majority_vote_head import MajorityVoteModule
from diffsmooth.engine.base_classifier.methods.reverse_chains_purifier import MAX_STEPS
from diffsmooth.engine.certify.noise import STREAM_PURIFY, NoiseKeys, RowNoise, gaussian_rows
from diffsmooth.engine.data import load_dataset
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.models.checkpoints import load_classifier
from diffsmooth.engine.pipelines import smoothed_classifier
from diffsmooth.engine.runs.results import read_json, settings_path, shard_path

RUNS, STEPS = 3, 2
OPTIONS = ["--option", f"reverse_runs={RUNS}", "--option", f"steps={STEPS}"]
FAST = ["--n0", "6", "--n", "24", "--alpha", "0.2", "--batch", "8", "--quiet"]


class LabelReader(nn.Module):
    """A classifier that returns the label written in each image's first pixel (as one-hot logits)."""

    def forward(self, x):
        return nn.functional.one_hot(x[:, 0, 0, 0].round().long(), 7).float() * 5


def test_the_majority_vote_is_densepures_with_its_tie_break():
    rng = random.Random(0)
    head = MajorityVoteModule(LabelReader(), 4)
    lists = [[rng.randrange(7) for _ in range(4)] for _ in range(400)] + [[3, 1, 1, 3], [2, 5, 5, 2], [6, 0, 4, 1]]
    images = torch.tensor(lists, dtype=torch.float32).view(-1, 4, 1, 1, 1).expand(-1, 4, 1, 2, 2)
    votes = head(images).argmax(dim=1).tolist()
    expected = [max(labels, key=labels.count) for labels in lists]         # results/merge_results.py
    assert votes == expected
    assert votes[-3:] == [3, 2, 6]                  # ties go to the label that came first
    assert len(set(expected)) == 7


def test_a_rows_chain_noise_is_keyed_by_image_sample_run_and_step():
    keys = NoiseKeys(11, STREAM_PURIFY, "cpu")
    images, samples = torch.tensor([4, 9, 4]), torch.tensor([0, 3, 7])
    noise = RowNoise(keys, images, samples)
    draw = 2 * MAX_STEPS + 1                        # run 2, step 1
    together = noise.normal(draw, (3, 5, 5))
    for r in range(3):                              # the same values whatever else shares the batch
        alone = gaussian_rows(keys, images[r:r + 1], samples[r:r + 1], (3, 5, 5), draw=draw)
        assert torch.equal(together[r:r + 1], alone)
    assert not torch.equal(noise.normal(draw + 1, (3, 5, 5)), together)         # the next step's
    assert not torch.equal(noise.normal(draw + MAX_STEPS, (3, 5, 5)), together)  # the next run's
    other = RowNoise(NoiseKeys(11, 0, "cpu"), images, samples)                  # the smoothing stream's
    assert not torch.equal(other.normal(draw, (3, 5, 5)), together)


def _api(tiny_models, **settings):
    classifier = load_classifier(tiny_models["classifier"], dataset="cifar10")
    import json

    from diffsmooth.engine.base_classifier.denoise import load_denoiser
    denoiser = load_denoiser(tiny_models["unet"], "cifar10", **json.loads(tiny_models["unet_config"]))
    return smoothed_classifier("densepure", denoiser=denoiser, classifier=classifier,
                               sigma=float(tiny_models["sigma"]), reverse_runs=RUNS, steps=STEPS, **settings)


def test_counts_are_equal_across_batch_sizes_and_spread(tiny_models):
    dataset = load_dataset("npz", str(tiny_models["data"]))
    pipeline = _api(tiny_models, batch=8).smooth_for(dataset[0][0].shape).pipeline
    winners = set()
    for index in range(len(dataset)):
        x = dataset[index][0]
        by_batch = [pipeline.count(x, index, 5, 21, batch)[0] for batch in (4, 7, 21)]
        assert all(np.array_equal(by_batch[0], c) for c in by_batch[1:]), index
        winners.add(int(by_batch[0].argmax()))
    assert len(winners) >= 3, winners


def test_the_command_line_and_the_api_write_the_same_rows(tiny_models, tiny_cli_args, tmp_path):
    cli = tmp_path / "cli.tsv"
    invoke_ok(["certify", *tiny_cli_args, "--method", "densepure", *OPTIONS, *FAST, "--out", cli])
    assert_rows_spread(cli, min_classes=3)
    recorded = read_json(settings_path(cli))
    assert (recorded["method"], recorded["reverse_runs"], recorded["steps"]) == ("densepure", RUNS, STEPS)
    assert "m" not in recorded and "local_sigma" not in recorded
    api = tmp_path / "api.tsv"
    dataset = load_dataset("npz", str(tiny_models["data"]))
    _api(tiny_models, batch=8).certify_dataset(dataset, api, n0=6, n=24, alpha=0.2)
    assert rows_without_time(api) == rows_without_time(cli)
    # two shards merged, and a run stopped after three images then resumed, give the same rows
    merged, resumed = tmp_path / "merged.tsv", tmp_path / "resumed.tsv"
    for i in range(2):
        invoke_ok(["certify", *tiny_cli_args, "--method", "densepure", *OPTIONS, *FAST, "--shard", f"{i}/2",
                   "--out", merged])
    invoke_ok(["merge", merged, *[shard_path(merged, i, 2) for i in range(2)]])
    invoke_ok(["certify", *tiny_cli_args, "--method", "densepure", *OPTIONS, *FAST, "--max", "3", "--out", resumed])
    assert len(rows_without_time(resumed)) == 3
    invoke_ok(["certify", *tiny_cli_args, "--method", "densepure", *OPTIONS, *FAST, "--out", resumed])
    assert rows_without_time(merged) == rows_without_time(resumed) == rows_without_time(cli)
    # another number of runs is another base classifier: a resume with it is refused, not mixed in
    result = CliRunner().invoke(main, ["certify", *tiny_cli_args, "--method", "densepure", "--option", "reverse_runs=5",
                                       "--option", f"steps={STEPS}", *FAST, "--out", str(cli)])
    assert result.exit_code != 0 and "reverse_runs" in result.output, result.output


def test_its_settings_are_checked_in_one_line_on_every_path(tiny_models, tiny_cli_args, tmp_path):
    def refused(args, text):
        result = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "x.tsv")])
        assert result.exit_code != 0 and text in result.output, result.output
        assert "Traceback" not in result.output

    base = ["certify", *tiny_cli_args, *FAST]
    refused([*base, "--method", "densepure", "--option", "steps=0"], "densepure setting steps must be 1..100, got 0")
    refused([*base, "--method", "densepure", "--option", "runs=3"], "has no setting 'runs'")
    refused([*base, "--method", "dds", "--option", "steps=3"], "has no setting 'steps'")
    refused([*base, "--method", "densepure", "--option", "steps"], "is not NAME=VALUE")
    refused([*base, "--method", "densepure", "--method", "dds"], "purify each sample differently")
    refused([*base, "--method", "densepure", "--option", "steps=2,3"], "densepure setting steps takes one value")
    refused([*base, "--method", "densepure", "--option", "reverse_runs=3,3"], "repeats a value")
    refused([*base, "--method", "densepure", "--backend", "onnxruntime", "--onnx-dir", str(tmp_path)],
            "holds no exported graphs")
    with pytest.raises(UserError, match="densepure setting reverse_runs must be an integer"):
        MethodConfig("densepure", 0.5, options=(("reverse_runs", 2.5),))
    with pytest.raises(UserError, match="has no setting 'm_runs'"):
        _api(tiny_models, m_runs=2)


def test_a_table_spec_line_takes_its_settings(tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text('title = "t"\nsigmas = [0.5]\nradii = [0.25]\nn_max = 40\n'
                    '[data]\ndataset = "embedded"\nskip = 250\nimages = 2\n'
                    '[[line]]\nmethod = "densepure"\nreverse_runs = 4\nsteps = 3\n')
    result = CliRunner().invoke(main, ["table", str(spec), "--check", "--no-preflight", "--out", str(tmp_path / "t")])
    assert result.exit_code == 0, result.output
    from diffsmooth.engine.table.spec import load_spec
    line = load_spec(spec).lines[0]
    assert line.options == (("reverse_runs", 4), ("steps", 3))
    spec.write_text(spec.read_text().replace("reverse_runs = 4", "reverse_runs = [2, 4]"))
    result = CliRunner().invoke(main, ["table", str(spec), "--check", "--no-preflight", "--out", str(tmp_path / "t")])
    assert result.exit_code == 0, result.output
    assert load_spec(spec).lines[0].options == (("reverse_runs", (2, 4)), ("steps", 3))     # a sweep on the line
    spec.write_text(spec.read_text().replace("steps = 3", "steps = 300"))
    result = CliRunner().invoke(main, ["table", str(spec), "--check", "--no-preflight", "--out", str(tmp_path / "t")])
    assert result.exit_code == 2 and "line 1: densepure setting steps must be 1..100, got 300" in result.output, \
        result.output
    spec.write_text(spec.read_text().replace("steps = 300", "m = 3"))
    result = CliRunner().invoke(main, ["table", str(spec), "--check", "--no-preflight", "--out", str(tmp_path / "t")])
    assert result.exit_code == 2 and "local_sigma and m belong to diffsmooth lines" in result.output, result.output


def test_its_costs_and_file_tags():
    config = MethodConfig("densepure", 0.5, options=(("reverse_runs", 4), ("steps", 5)))
    method = method_named("densepure")
    assert (config.purifier.unet_calls(), method.classifier_calls(config)) == (20, 4)
    assert config.purifier.purified_shape((3, 32, 32)) == (4, 3, 32, 32)
    assert method.config_tag(config) == "__K4__S5"
    assert MethodConfig("densepure", 0.5).options == (("reverse_runs", 10), ("steps", 2))     # DensePure's defaults


@pytest.mark.slow
def test_one_compiled_graph_serves_every_step_and_votes_as_eager(tiny_models):
    """The fast path's compiled step: the timestep and coefficients are inputs, so S steps compile one graph, and
    the compiled chain's samples, and the votes on them, are eager fp32's (CPU; the classifier is not compiled here,
    its compiled forms have tests of their own)."""
    from diffsmooth.engine.backends.torch.recompile_limit import compiled_graphs
    from diffsmooth.engine.backends.torch.runner import TorchRunner

    api = _api(tiny_models)
    config = MethodConfig("densepure", api.sigma, options=(("reverse_runs", 2), ("steps", 3)))
    x = torch.rand(4, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    noise = RowNoise(NoiseKeys(0, STREAM_PURIFY, "cpu"), torch.tensor([0, 0, 1, 2]), torch.tensor([0, 1, 0, 5]))
    method = config.method
    before = compiled_graphs()
    compiled = config.purifier.stage(config.sigma, api.denoiser, TorchRunner("cpu", compile=True))
    eager = config.purifier.stage(config.sigma, api.denoiser, TorchRunner("cpu"))
    fast_x, slow_x = compiled(x, noise), eager(x, noise)
    assert compiled_graphs() - before == 1                      # three steps, one graph
    assert (fast_x - slow_x).abs().max() <= 1e-4
    head = method.score_head(config, api.classifier.eval(), (3, 8, 8))
    with torch.no_grad():
        assert torch.equal(head(fast_x).argmax(-1), head(slow_x).argmax(-1))


def test_the_agreement_check_allows_a_few_flipped_runs_not_another_noise():
    """Its scores are vote counts: a sample whose runs flip here and there stays within the check's tolerance; a
    sample scored on other noise (other labels throughout) does not."""
    from diffsmooth.engine.runs.fast_path import judge_each_configuration

    head = MajorityVoteModule(LabelReader(), 10)
    rng = random.Random(1)
    labels = [[rng.choice([1, 1, 1, 2]) for _ in range(10)] for _ in range(50)]
    flipped = [list(row) for row in labels]
    for row in flipped[:5]:
        for k in (0, 3, 7):
            row[k] = 4
    other = [[rng.choice([2, 2, 3]) for _ in range(10)] for _ in range(50)]

    def scores(rows):
        x = torch.tensor(rows, dtype=torch.float32).view(-1, 10, 1, 1, 1).expand(-1, 10, 1, 2, 2)
        return head(x).numpy()[:, None, :]

    tolerance = method_named("densepure").score_tolerance(MethodConfig("densepure", 0.5))
    reference = scores(labels)
    counts = [np.bincount(reference[:, 0].argmax(-1), minlength=7)[None]]
    assert judge_each_configuration(counts, [scores(flipped)], [reference], [0], 1e-1, tolerance).ok
    assert not judge_each_configuration(counts, [scores(other)], [reference], [0], 1e-1, tolerance).ok
    assert not judge_each_configuration(counts, [scores(flipped)], [reference], [0], 1e-1).ok     # the default's


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_densepure_on_cuda_agrees_with_eager_fp32(precision):
    """DensePure on the demo models on CUDA, the default fast path (compiled step, CUDA graphs, streams): votes
    spread, an identical run repeats, and the votes agree with eager fp32 within its design flip rate (estimated:
    this test's report is its first measurement)."""
    from diffsmooth.engine.demo import shipped as demo_assets
    from diffsmooth.engine.runs.assemble import ModelSources, load_models
    from diffsmooth.engine.runs.fast_path import FastPath, measure_agreement
    from diffsmooth.engine.runs.stage_build import build_smooth
    from diffsmooth.engine.runs.vote_agreement import design_flip_rate
    if not demo_assets.DEMO_UNET.exists():
        pytest.skip("embedded demo weights not built")
    config = MethodConfig("densepure", 0.5)
    sources = ModelSources.demo()
    models = load_models(config, sources)
    fast = build_smooth(config, sources, (1, 32, 32), 10, device="cuda", precision=precision,
                        fast=FastPath.resolve("cuda"), models=models).pipeline
    fp32 = build_smooth(config, sources, (1, 32, 32), 10, device="cuda", precision="fp32", fast=FastPath(),
                        models=models).pipeline
    data = load_dataset("embedded")
    x = data[2][0]
    counts = fast.count(x, 2, 0, 500, 250)
    assert (counts > 0).sum() >= 2, f"votes do not spread: {counts}"
    np.testing.assert_array_equal(counts, fast.count(x, 2, 0, 500, 250))
    report = measure_agreement(fast, fp32, [(2, x), (9, data[9][0])], 500, 250, design_flip_rate(precision, ["densepure"]))
    print(f"densepure {precision}: {report.line()}")
    assert report.ok, report.problems


@pytest.mark.slow
def test_a_run_killed_mid_way_and_started_again_writes_the_uninterrupted_rows(tiny_models, tiny_cli_args, tmp_path):
    """SIGKILL after the first finished row (and a torn last line, the worst case), then a restart: the same rows
    as one uninterrupted run, every image once."""
    import signal
    import subprocess
    import sys
    import time

    from diffsmooth.engine.runs.results import read_rows

    args = ["certify", *tiny_cli_args, "--method", "densepure", *OPTIONS, "--n0", "6", "--n", "150", "--alpha", "0.2",
            "--batch", "8", "--window", "1", "--threads", "1", "--quiet"]
    whole, killed = tmp_path / "whole.tsv", tmp_path / "killed.tsv"
    invoke_ok([*args, "--out", whole])
    cli = [sys.executable, "-m", "diffsmooth.cli", *[str(a) for a in args], "--out", str(killed)]
    proc = subprocess.Popen(cli, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and not (killed.exists() and len(killed.read_text().splitlines()) >= 2):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert 1 <= len(read_rows(killed)) < 6                      # killed mid-way, with rows written
    with open(killed, "a") as f:
        f.write("5\t5\t")
    assert subprocess.run(cli, capture_output=True).returncode == 0
    assert_rows_spread(whole, min_classes=3)
    assert rows_without_time(killed) == rows_without_time(whole)
    indices = [int(r["idx"]) for r in read_rows(killed)]
    assert len(indices) == len(set(indices)) == 6


@pytest.mark.slow
def test_two_gloo_ranks_under_torchrun_write_one_process_rows(tiny_cli_args, tmp_path):
    """torchrun, two gloo ranks: each rank computes its share of every image's samples (the chains' noises keyed by
    image and sample, not by rank), rank 0 writes, and the file equals one process's."""
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as free:                   # a port no other test's torchrun holds
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    # torchrun's own parser rejects prefixes of its options (--n): the long alias
    args = ["certify", *tiny_cli_args, "--method", "densepure", *OPTIONS, "--n0", "6", "--num-samples", "24",
            "--alpha", "0.2", "--batch", "8", "--threads", "1", "--quiet"]
    whole, ranks = tmp_path / "whole.tsv", tmp_path / "ranks.tsv"
    invoke_ok([*args, "--out", whole])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
           str(port), "-m", "diffsmooth.cli", *[str(a) for a in args], "--out", str(ranks)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "wrote 6 rows" in proc.stderr and "the 2 ranks shared every image's samples" in proc.stderr
    assert_rows_spread(whole, min_classes=3)
    assert rows_without_time(ranks) == rows_without_time(whole)


def test_a_sweep_over_k_shares_the_chains_and_writes_each_ks_single_rows(tiny_models, tiny_cli_args, tmp_path):
    """`--option reverse_runs=1,3`: one purify stage of 3 chains (run k's noise does not depend on K), each K's
    majority on its first K runs; every configuration's rows equal its own single run's, and spread."""
    from diffsmooth.engine.backends.torch.runner import TorchRunner
    from diffsmooth.engine.backends.torch.stages import torch_stages
    from diffsmooth.engine.base_classifier.configurations import configurations
    from diffsmooth.engine.base_classifier.denoise import load_denoiser
    from diffsmooth.engine.runs.results import read_rows

    sweep = tmp_path / "sweep"
    quick = [*FAST[:-3], "--batch", "30", "--quiet"]             # one batch per image's estimate
    invoke_ok(["certify", *tiny_cli_args, "--method", "densepure", "--option", "reverse_runs=1,3",
               "--option", f"steps={STEPS}", *quick, "--out", sweep])
    for runs in (1, 3):
        single = tmp_path / f"K{runs}.tsv"
        invoke_ok(["certify", *tiny_cli_args, "--method", "densepure", "--option", f"reverse_runs={runs}",
                   "--option", f"steps={STEPS}", *quick, "--out", single])
        swept = sweep / f"densepure__clf__K{runs}__S{STEPS}.tsv"
        assert rows_without_time(swept) == rows_without_time(single), runs
    assert len({r["predict"] for r in read_rows(sweep / "densepure__clf__K3__S2.tsv")} - {"-1"}) >= 3
    configs = configurations(["densepure"], 0.25, lambda method: (("reverse_runs", "1,4,3"), ("steps", "2")),
                             lambda config: ["clf"])
    denoiser = load_denoiser(tiny_models["unet"], "cifar10", **__import__("json").loads(tiny_models["unet_config"]))
    classifier = load_classifier(tiny_models["classifier"], dataset="cifar10")
    stages = torch_stages(configs, {"clf": classifier}, denoiser, TorchRunner(), (3, 8, 8))
    assert stages.purify.runs == 4 and stages.purified_shape == (4, 3, 8, 8) and stages.purify_noise


def test_predict_on_the_command_line_and_in_python_agree(tiny_models, tiny_cli_args, tmp_path):
    """PREDICT with DensePure: `diffsmooth predict` rows and the API's `predict(x, n, alpha, image_index)` give the
    same class (or abstention) for every image, keyed by its dataset index; the classes spread."""
    from diffsmooth.engine.runs.results import read_rows

    out = tmp_path / "predict.tsv"
    invoke_ok(["predict", *tiny_cli_args, "--method", "densepure", *OPTIONS, "--n", "24", "--alpha", "0.2",
               "--batch", "8", "--quiet", "--out", out])
    rows = {int(r["idx"]): int(r["predict"]) for r in read_rows(out)}
    assert len(rows) == 6 and len(set(rows.values()) - {-1}) >= 3, rows
    classifier = _api(tiny_models, batch=8)
    dataset = load_dataset("npz", str(tiny_models["data"]))
    assert {i: classifier.predict(dataset[i][0], n=24, alpha=0.2, image_index=i) for i in range(6)} == rows

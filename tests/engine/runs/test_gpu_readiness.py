"""What a first GPU run would trip on, checked on CPU: the cuDNN fused-convolution kernel's inputs
and its probe, the fast-path agreement check (production counts vs eager fp32, TF32 off, planted
faults), compiled stages past dynamo's recompile limit, CUDA-graph capture failure and the
out-of-memory fallback, and bench/gpu_check.sh's time budget."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from diffsmooth.engine.models import folded_resnet
from diffsmooth.engine.models.folded_resnet import CUDNN_FUSION, FUSED_CALLS, check_fusion, fusion_verdict

# -- item 2: --fused-conv ---------------------------------------------------------------------------

def _fake_cudnn(monkeypatch):
    """cuDNN's fused calls as their documented maths on CPU, including what they add: z * alpha, with
    cudnn_convolution_relu's z being its own uninitialised output (NaN here, as garbage can be)."""
    calls = []

    def add_relu(x, weight, z, alpha, bias, stride, padding, dilation, groups):
        calls.append(("add_relu", z.clone()))
        out = F.conv2d(x, weight, bias, stride, padding, dilation, groups)
        return F.relu(out + alpha * z)

    def relu(x, weight, bias, stride, padding, dilation, groups):
        calls.append(("relu", None))
        out = F.conv2d(x, weight, bias, stride, padding, dilation, groups)
        garbage = torch.full_like(out, float("nan"))
        return F.relu(out + 0.0 * garbage)

    monkeypatch.setattr(torch, "cudnn_convolution_add_relu", add_relu)
    monkeypatch.setattr(torch, "cudnn_convolution_relu", relu)
    return calls


def _nhwc(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).contiguous(
        memory_format=torch.channels_last)


def test_fused_kernel_without_residual_adds_an_explicit_zero(monkeypatch):
    """The CUDA kernel's cuDNN call (run on CPU through fakes with cuDNN's maths) must not read
    uninitialised memory: no residual means an explicit zero z, and the output is finite and equal
    to conv2d + bias + relu."""
    calls = _fake_cudnn(monkeypatch)
    monkeypatch.setitem(CUDNN_FUSION, "enabled", True)
    x, weight, bias = _nhwc(4, 16, 8, 8), _nhwc(16, 16, 3, 3, seed=1), torch.randn(16)
    before = FUSED_CALLS["count"]
    out = folded_resnet._conv_bias_add_relu_cuda(x, weight, bias, None, 1, 1, True)
    assert FUSED_CALLS["count"] == before + 1 and calls, "the fused branch was not taken"
    assert [kind for kind, _ in calls] == ["add_relu"]
    assert torch.equal(calls[0][1], torch.zeros_like(calls[0][1]))
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, F.relu(F.conv2d(x, weight, bias, 1, 1)))
    assert out.is_contiguous(memory_format=torch.channels_last)
    residual = _nhwc(4, 16, 8, 8, seed=2)
    with_residual = folded_resnet._conv_bias_add_relu_cuda(x, weight, bias, residual, 1, 1, True)
    torch.testing.assert_close(with_residual, F.relu(F.conv2d(x, weight, bias, 1, 1) + residual))


def test_fusion_verdict_refuses_non_finite_outputs():
    expected = torch.randn(8, 10)
    nan = expected.clone()
    nan[3, 2] = float("nan")
    assert "NaN" in fusion_verdict(nan, expected)           # diff is NaN, and NaN > tol is False
    inf = expected.clone()
    inf[0, 0] = float("inf")
    assert "NaN/Inf" in fusion_verdict(inf, expected)
    assert "disagree" in fusion_verdict(expected + 1.0, expected)
    assert fusion_verdict(expected + 1e-4, expected) is None


class _FlagReader(torch.nn.Module):
    """Returns NaN in one output while cuDNN fusion is on: what reading uninitialised memory looks like."""

    def __init__(self):
        super().__init__()
        self.shapes = []

    def forward(self, x):
        self.shapes.append(tuple(x.shape))
        out = x.flatten(1)[:, :10].clone()
        if CUDNN_FUSION["enabled"]:
            out[0, 0] = float("nan")
        return out


def test_fusion_probe_turns_fusion_off_on_a_nan_output(monkeypatch):
    monkeypatch.setitem(CUDNN_FUSION, "enabled", True)
    messages = []
    net = _FlagReader()
    assert not check_fusion(net, torch.rand(12, 1, 8, 8), messages.append)
    assert not CUDNN_FUSION["enabled"] and "NaN/Inf" in messages[0] and net.shapes == [(12, 1, 8, 8)] * 2


def test_fusion_is_probed_at_the_runs_classifier_call(monkeypatch):
    """build_smooth hands the fused-conv probe the images per classifier call of the run (batch x m
    on CPU, where the classifier runs in one call)."""
    from stage_fixtures import randomized_bn_resnet

    from diffsmooth.engine.backends.torch import stages as torch_stages
    from diffsmooth.engine.base_classifier.methods import MethodConfig
    from diffsmooth.engine.runs.assemble import ModelSources
    from diffsmooth.engine.runs.fast_path import FastPath
    from diffsmooth.engine.runs.stage_build import build_smooth
    seen = []
    real = torch_stages.folded_classifier

    def recording(classifier, backend, image_shape, log=None, probe_batch=8):
        seen.append(probe_batch)
        return real(classifier, backend, image_shape, log, probe_batch)
    monkeypatch.setattr(torch_stages, "folded_classifier", recording)
    config = MethodConfig("rs", 0.25)
    build_smooth(config, ModelSources(), (3, 8, 8), 10, fast=FastPath(fused_conv=True),
                 models=(None, randomized_bn_resnet("cifar_resnet20")), batch=40)
    assert seen == [40]
    from diffsmooth.engine.runs.assemble import classifier_call_images
    assert classifier_call_images(MethodConfig("diffsmooth", 0.25, m=3, local_sigma=0.1), 40, (3, 8, 8), "cpu") == 120


# -- item 3: the agreement check ------------------------------------------------------------------

from stage_fixtures import image, make_pipeline  # noqa: E402

CHECK_IMAGES = [(0, 1), (3, 2), (7, 3)]         # (dataset index, image seed)
CHECK_SAMPLES, CHECK_BATCH = 64, 24


def _images():
    return [(i, image(seed)) for i, seed in CHECK_IMAGES]


def _check(fast, reference, **kw):
    from diffsmooth.engine.runs.fast_path import measure_agreement
    return measure_agreement(fast, reference, _images(), CHECK_SAMPLES, CHECK_BATCH, **kw)


def test_flip_budget_refuses_a_correct_fp16_path_less_than_once_in_10000_runs():
    from scipy.stats import binom

    from diffsmooth.engine.runs.vote_agreement import FALSE_REFUSAL, FP16_FLIP_RATE, flip_budget
    for samples in (180, 2000, 10_000):
        budget = flip_budget(samples)
        assert binom.sf(budget, samples, FP16_FLIP_RATE) <= FALSE_REFUSAL / 2        # two comparisons
        assert binom.sf(budget - 1, samples, FP16_FLIP_RATE) > FALSE_REFUSAL / 2 or budget == 0
    # the default check (4 images x 500 samples), simulated: 10^6 correct runs, flips ~ Binomial
    rng = np.random.default_rng(0)
    budget = flip_budget(2000)
    per_sample = rng.binomial(2000, FP16_FLIP_RATE, 10 ** 6)
    counts = rng.binomial(2000, FP16_FLIP_RATE, 10 ** 6)
    assert ((per_sample > budget) | (counts > budget)).mean() < FALSE_REFUSAL
    # the old check (1000 samples, >= 99.9% agreement) refused ~0.8% of them
    assert 0.005 < binom.sf(1, 1000, FP16_FLIP_RATE) < 0.01


def test_design_flip_rate_follows_precision_and_the_most_sensitive_method():
    """DDS (a clean-trained classifier behind the denoiser) flips more than the noise-trained classifiers, bf16
    more than fp16; an fp32 fast path is judged like fp16; a sweep takes its most sensitive method's rate, and
    the DDS bf16 check (2,000 samples) allows the 34 flips the H200 showed on the check's images, which the fp16
    rate refuses."""
    from diffsmooth.engine.base_classifier.methods import method_named
    from diffsmooth.engine.runs.vote_agreement import FP16_FLIP_RATE, design_flip_rate, flip_budget
    assert design_flip_rate("fp16", ["diffsmooth"]) == design_flip_rate("fp32", ["rs"]) == FP16_FLIP_RATE
    assert design_flip_rate("bf16", ["diffsmooth"]) == method_named("diffsmooth").flip_rates["bf16"]
    assert design_flip_rate("fp16", ["dds"]) > design_flip_rate("fp16", ["diffsmooth"])
    assert design_flip_rate("bf16", ["dds"]) > design_flip_rate("fp16", ["dds"])
    assert design_flip_rate("bf16", ["diffsmooth", "dds"]) == design_flip_rate("bf16", ["dds"])
    assert flip_budget(2000, design_flip_rate("bf16", ["dds"])) >= 34 > flip_budget(2000)


def test_a_run_checks_at_its_methods_rate_unless_given_one(monkeypatch, tmp_path):
    """certify's check expects the most sensitive method's measured rate (a sweep with DDS: DDS's), and
    `--expected-flip-rate` replaces it."""
    from click.testing import CliRunner

    from diffsmooth.cli import main
    from diffsmooth.engine.errors import UserError
    from diffsmooth.engine.runs import execute
    from diffsmooth.engine.runs.vote_agreement import design_flip_rate
    seen = []

    def record(voter, reference, images, batch, samples, rate, log):
        seen.append(rate)
        raise UserError("stopped by the test")
    monkeypatch.setattr(execute, "check_against_eager", record)
    common = ["certify", "--sigma", "0.5", "--n0", "10", "--n", "20", "--max", "1", "--compile", "--quiet"]
    for extra in (["--method", "rs"], ["--method", "rs", "--method", "dds"],
                  ["--method", "dds", "--expected-flip-rate", "0.3"]):
        result = CliRunner().invoke(main, [*common, *extra, "--out", str(tmp_path / f"run{len(seen)}")])
        assert "stopped by the test" in result.output, result.output
    assert seen == [design_flip_rate("fp32", ["rs"]), design_flip_rate("fp32", ["dds"]), 0.3]


def test_judge_allows_the_budget_and_refuses_one_flip_more():
    from diffsmooth.engine.runs.vote_agreement import flip_budget, judge_agreement
    rng = np.random.default_rng(1)
    ref = [rng.dirichlet(np.ones(5), 500) for _ in range(4)]
    budget = flip_budget(2000)

    def run(flips):
        """`flips` near-ties (margin 5e-4) that fp16 rounding turns round, as a correct fp16 path does."""
        reference, fast = [r.copy() for r in ref], [r.copy() for r in ref]
        for k in range(flips):                       # sample k // 4 of image k % 4
            r, f = reference[k % 4][k // 4], fast[k % 4][k // 4]
            top, second = np.argsort(r)[-1], np.argsort(r)[-2]
            r[second] = f[second] = r[top] - 5e-4
            f[second] = r[top] + 5e-4
        counts = [np.bincount(f.argmax(1), minlength=5) for f in fast]
        return judge_agreement(counts, fast, reference)
    assert run(0).ok and run(budget).ok and run(budget).flips == budget
    refused = run(budget + 1)
    assert not refused.ok and any("per-sample votes differ" in p for p in refused.problems)
    assert sum(refused.count_moved) <= budget + 1


def test_agreement_check_passes_the_production_path_and_a_simulated_fp16_one(tiny_stages):
    """Static batches with the padded tail kept (the production path) count like eager fp32; a path
    that rounds the classifier's inputs and scores to fp16 differs in its scores but stays in budget."""
    reference = make_pipeline(tiny_stages)
    report = _check(make_pipeline(tiny_stages, static_batch=True), reference)
    assert report.ok and report.flips == 0 and sum(report.count_moved) == 0 and report.max_abs_diff < 1e-5
    assert min(report.spread) >= 2, f"check images' votes must spread: {report.spread}"
    fp16 = make_pipeline(tiny_stages, static_batch=True)
    inner = fp16.stages.score

    class Fp16Rounding:
        name, device, precision = inner.name, inner.device, "fp16 (simulated)"

        def __call__(self, h, *rest):
            return inner(h.half().float(), *rest).half().float()
    fp16.stages.score = Fp16Rounding()
    rounded = _check(fp16, reference)
    assert rounded.ok, rounded.problems
    assert 0 < rounded.max_abs_diff < 1e-2


class _WrongImage:
    """A pipeline whose noisy samples are drawn around another image."""

    def __init__(self, pipe):
        self.pipe = pipe
        original = pipe.noisy
        pipe.noisy = lambda x_rows, rows: original(x_rows.flip(-1), rows)

    def __getattr__(self, name):
        return getattr(self.pipe, name)


class _DroppedBatch:
    """A production path that loses its last batch's votes (per-sample scores are right)."""

    def __init__(self, pipe):
        self.pipe = pipe

    def count_many(self, images, first, num, batch):
        counts = self.pipe.count_many(images, first, num, batch)
        x, index = images[-1][1], images[-1][0]
        last = self.pipe.all_scores(x, index, first + (num - 1) // batch * batch,
                                    num - (num - 1) // batch * batch, batch)[:, 0].argmax(1)
        counts[-1] = counts[-1] - np.bincount(last.numpy(), minlength=counts[-1].shape[-1])
        return counts

    def __getattr__(self, name):
        return getattr(self.pipe, name)


@pytest.mark.parametrize("fault", ["wrong image", "wrong noise seed", "dropped batch", "production noise of another index"])
def test_agreement_check_refuses_a_wrong_path(tiny_stages, fault):
    from diffsmooth.engine.errors import UserError
    from diffsmooth.engine.runs.fast_path import validate_fast_path
    reference = make_pipeline(tiny_stages)
    fast = make_pipeline(tiny_stages, static_batch=True)
    if fault == "wrong image":
        fast = _WrongImage(fast)
    elif fault == "wrong noise seed":
        fast.seed += 1
    elif fault == "dropped batch":
        fast = _DroppedBatch(fast)
    else:                       # the production path draws another image's noise; per-sample path right
        count_many = fast.count_many
        fast.count_many = lambda images, first, num, batch: count_many([(i + 1, x) for i, x in images], first, num,
                                                                       batch)
    report = _check(fast, reference)
    assert not report.ok
    if fault == "dropped batch":
        assert "dropped or repeated batch" in report.problems[0]
    messages = []
    with pytest.raises(UserError, match="disagrees with eager fp32"):
        validate_fast_path(fast, reference, _images(), CHECK_SAMPLES, CHECK_BATCH, log=messages.append)
    assert "REFUSED" in messages[0]


def test_reference_of_the_check_runs_with_tf32_off_and_restores_it(tiny_stages):
    seen = []
    reference = make_pipeline(tiny_stages)
    all_scores = reference.all_scores

    def recording(*args):
        seen.append((torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32))
        return all_scores(*args)
    reference.all_scores = recording
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    try:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        assert _check(make_pipeline(tiny_stages, static_batch=True), reference).ok
        assert seen and all(s == (False, False) for s in seen)
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (True, True)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def test_agreement_check_sees_wrong_noise_on_an_image_whose_votes_all_agree(tiny_stages):
    """Counts and votes cannot show wrong noise when every sample votes the same class; the scores can."""
    from stage_fixtures import spread_classifier
    one_class = spread_classifier(2)
    with torch.no_grad():
        one_class[3].bias[0] += 3.0
    reference = make_pipeline(tiny_stages, classifier=one_class)
    fast = make_pipeline(tiny_stages, classifier=one_class, static_batch=True)
    assert _check(fast, reference).ok
    fast.seed += 1
    report = _check(fast, reference)
    assert max(report.spread) == 1 and report.flips == 0 and sum(report.count_moved) == 0
    assert [p for p in report.problems if "scores differ" in p] == report.problems != []


# -- item 4: compiled stages past dynamo's recompile limit ----------------------------------------

class _LocalHead(torch.nn.Module):
    """Like a sweep's local-smoothing stage: one forward code, a Python float sigma' per instance."""

    def __init__(self, local_sigma):
        super().__init__()
        self.local_sigma = local_sigma
        self.linear = torch.nn.Linear(6, 3)

    def forward(self, x):
        return self.linear(x + self.local_sigma)


def _compiled_stages(monkeypatch, count):
    """`count` compiled TorchBackend (dynamo with its eager backend: the recompile limit is dynamo's,
    the backend does not matter, and this keeps the test fast); their messages and outputs."""
    import functools

    import torch._dynamo
    import torch._dynamo.config as config

    from diffsmooth.engine.backends.torch.runner import TorchStage
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    saved = config.save_config()                  # the stages raise dynamo's limits: restore them after
    torch._dynamo.reset()
    messages, outs = [], []
    x = torch.rand(4, 6)
    torch.manual_seed(0)
    try:
        for k in range(count):
            head = _LocalHead(0.01 * (k + 1))
            stage = TorchStage(head, f"local {k}", torch.device("cpu"), compile=True, log=messages.append)
            outs.append((stage(x), head(x).detach(), stage.compiled))
    finally:
        torch._dynamo.reset()
        config.load_config(saved)
    return messages, outs


def test_eleven_compiled_stages_stay_compiled(monkeypatch):
    """The paper's sweep grid compiles 11 stages of one forward code: all of them stay compiled."""
    from torch._dynamo.utils import counters
    before = counters["stats"]["unique_graphs"]
    messages, outs = _compiled_stages(monkeypatch, 11)
    assert counters["stats"]["unique_graphs"] - before == 11
    assert not messages and all(compiled for _, _, compiled in outs)
    for got, want, _ in outs:
        torch.testing.assert_close(got, want)


def test_a_stage_past_the_limit_says_it_runs_eager(monkeypatch):
    from diffsmooth.engine.backends.torch import recompile_limit
    monkeypatch.setattr(recompile_limit, "ENTRIES_PER_STAGE", 0)        # the limit no longer grows
    monkeypatch.setattr(recompile_limit, "BASE_LIMIT", 3)
    import torch._dynamo.config as config
    with config.patch(recompile_limit=3):
        messages, outs = _compiled_stages(monkeypatch, 5)
    assert [compiled for _, _, compiled in outs] == [True, True, True, False, False]
    assert len(messages) == 2 and all("runs eager" in m for m in messages)
    for got, want, _ in outs:
        torch.testing.assert_close(got, want)


# -- item 5: CUDA-graph capture failure, out-of-memory fallback -----------------------------------

class _FakeCuda:
    """torch.cuda's stream / graph calls as CPU fakes that record what the capture path does."""

    def __init__(self, monkeypatch, fail_capture=True, broken_stream=False):
        self.events = []
        fake = self

        class Stream:
            def __init__(self, *a, **k):
                pass

            def wait_stream(self, other):
                pass

            def synchronize(self):
                fake.events.append("stream sync")
                if broken_stream:
                    raise RuntimeError("CUDA error: operation failed due to a previous error during capture")

        class Graph:
            def reset(self):
                fake.events.append("graph reset")

            def replay(self):
                pass

        class Capture:
            def __init__(self, graph, *a, **k):
                pass

            def __enter__(self):
                if fail_capture:
                    raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

            def __exit__(self, *exc):
                return False

        import contextlib
        for name, value in {"current_stream": lambda *a: Stream(), "Stream": Stream,
                            "stream": lambda s: contextlib.nullcontext(), "CUDAGraph": Graph, "graph": Capture,
                            "synchronize": lambda *a: fake.events.append("synchronize"),
                            "empty_cache": lambda: fake.events.append("empty_cache"),
                            "is_current_stream_capturing": lambda: False}.items():
            monkeypatch.setattr(torch.cuda, name, value)


class _Doubling:
    name, device, precision = "tiny", torch.device("cpu"), "fp32"

    def __call__(self, x):
        return 2 * x


def test_failed_capture_discards_the_graph_checks_the_stream_and_runs_uncaptured(monkeypatch):
    from diffsmooth.engine.backends.torch.cuda_graphs import CudaGraphStage
    cuda = _FakeCuda(monkeypatch)
    messages = []
    graphed = CudaGraphStage(_Doubling(), log=messages.append)
    x = torch.rand(5, 3)
    torch.testing.assert_close(graphed(x), 2 * x)
    assert "not permitted" in next(iter(graphed.fallback.values())) and not graphed.graphs
    assert cuda.events[:3] == ["graph reset", "synchronize", "empty_cache"] and "stream sync" in cuda.events
    assert len(messages) == 1 and "discarded" in messages[0] and "checked usable" in messages[0]
    torch.testing.assert_close(graphed(x), 2 * x)                   # the shape stays uncaptured, no retry
    assert len(messages) == 1


def test_failed_capture_that_breaks_the_stream_is_one_user_error(monkeypatch):
    from diffsmooth.engine.backends.torch.cuda_graphs import CudaGraphStage
    from diffsmooth.engine.errors import UserError
    _FakeCuda(monkeypatch, broken_stream=True)
    with pytest.raises(UserError, match="`cuda_graphs` off"):
        CudaGraphStage(_Doubling())(torch.rand(5, 3))


def test_release_drops_captured_graphs(monkeypatch):
    from diffsmooth.engine.backends.torch.cuda_graphs import CudaGraphStage
    cuda = _FakeCuda(monkeypatch, fail_capture=False)
    graphed = CudaGraphStage(_Doubling(), log=lambda m: None)
    graphed(torch.rand(5, 3))
    assert len(graphed.graphs) == 1
    graphed.release()
    assert not graphed.graphs and "graph reset" in cuda.events


def test_out_of_memory_runs_the_smaller_chunks_on_the_eager_stage(tiny_stages):
    """After out-of-memory the halved chunks run on the stage's eager form (no new compiled shape or
    CUDA graph), its graphs released, with a message; the counts are unchanged."""
    pipe = make_pipeline(tiny_stages)
    inner = pipe.stages.score
    calls = []

    class Eager:
        name, device, precision = inner.name, inner.device, inner.precision

        def __call__(self, *inputs):
            calls.append(("eager", inputs[0].shape[0]))
            return inner(*inputs)

    class CompiledGraphed:
        name, device, precision = inner.name, inner.device, inner.precision
        eager = Eager()

        def __call__(self, *inputs):
            calls.append(("compiled", inputs[0].shape[0]))
            if inputs[0].shape[0] > 12:
                raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
            return inner(*inputs)

        def release(self):
            calls.append(("release", None))

    compiled = CompiledGraphed()
    pipe.stages.score = compiled
    messages = []
    pipe.log = messages.append
    x = image(4)
    counts = pipe.count(x, 2, 0, 96, 48)
    np.testing.assert_array_equal(counts, make_pipeline(tiny_stages).count(x, 2, 0, 96, 48))
    assert calls[:2] == [("compiled", 48), ("release", None)]
    assert all(kind == "eager" for kind, _ in calls[2:]) and {n for _, n in calls[2:]} == {24}
    assert pipe.stages.score is compiled.eager
    assert any("uncompiled and uncaptured" in m for m in messages) and any("out of memory" in m for m in messages)


# -- bench/gpu_check.sh: every part fits one 600 s device call ------------------------------------

import re  # noqa: E402
import subprocess  # noqa: E402
from pathlib import Path  # noqa: E402

GPU_CHECK = Path(__file__).resolve().parents[3] / "bench" / "gpu_check.sh"
STEP = re.compile(r"run_step\s+(\S+)\s+\$\{(\w+):-(\d+)\}")


def _function_steps(script: str, function: str):
    body = re.search(rf"^{function}\(\) \{{\n(.*?)^\}}", script, re.S | re.M)
    assert body, f"{function} not found in gpu_check.sh"
    return [(name, int(limit)) for name, _, limit in STEP.findall(body.group(1))]


@pytest.mark.parametrize("part", ["speed", "sequential", "table", "ablation", "fixes", "headline", "densepure",
                                  "preflight", "serve"])
def test_each_gpu_check_part_fits_one_device_call(part):
    script = GPU_CHECK.read_text()
    steps = _function_steps(script, "setup") + _function_steps(script, f"part_{part}") + \
        _function_steps(script, "summary")
    assert len(steps) >= 4 and [s for s, _ in steps[:2]] == ["install", "import"]
    assert sum(limit for _, limit in steps) <= 540, steps
    assert all(limit > 0 for _, limit in steps)
    every_step = [line for line in script.splitlines() if line.strip().startswith("run_step ")]
    assert len(every_step) == len(STEP.findall(script)), "a step without a parseable ${LIMIT:-seconds}"


def test_gpu_check_dry_run_prints_the_steps_and_runs_nothing(tmp_path):
    out = subprocess.run(["bash", str(GPU_CHECK), str(tmp_path / "out"), "speed"], env={"DRY_RUN": "1",
                         "PATH": "/usr/bin:/bin", "PYTHON": "false"}, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    names = re.findall(r"^== \S+ (\S+) \(limit (\d+) s", out.stdout, re.M)
    assert [n for n, _ in names] == ["install", "import", "cifar10-variants", "imagenet-variants", "agreement",
                                     "summary"]
    assert sum(int(limit) for _, limit in names) <= 540
    assert (tmp_path / "out" / "gpu_check.log").exists() and not (tmp_path / "out" / "steps.tsv").exists()


def test_gpu_check_serve_part_runs_the_load_study_on_cuda(tmp_path):
    out = subprocess.run(["bash", str(GPU_CHECK), str(tmp_path / "out"), "serve"], env={"DRY_RUN": "1",
                         "PATH": "/usr/bin:/bin", "PYTHON": "false", "SERVE_WHEELS": "wheels"},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    names = re.findall(r"^== \S+ (\S+) \(limit (\d+) s", out.stdout, re.M)
    assert [n for n, _ in names] == ["install", "import", "serve-wheels", "serve-import", "serve-load", "summary"]
    assert sum(int(limit) for _, limit in names) <= 540
    load = out.stdout.split("serve-load (limit")[1]
    assert "-m studies.serve_load" in load and "--device cuda" in load and "--concurrency 1,8" in load
    assert f"--out {tmp_path / 'out' / 'serve_load.md'}" in load


def test_gpu_check_stops_at_a_failed_install_with_one_line(tmp_path):
    out = subprocess.run(["bash", str(GPU_CHECK), str(tmp_path / "out"), "speed"],
                         env={"PATH": "/usr/bin:/bin", "PYTHON": "false"}, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert out.stdout.strip().splitlines()[-1].startswith("gpu_check: install failed, stopping")
    assert (tmp_path / "out" / "steps.tsv").read_text().splitlines() == [
        line for line in (tmp_path / "out" / "steps.tsv").read_text().splitlines() if line.startswith("install\t")]


def test_the_speed_part_measures_and_judges_every_variant_within_its_steps():
    """Issue 45: every CIFAR-10 and ImageNet variant of `speed` parses (bench/variants.py) and has its agreement
    row (its batch and classifier-batch tokens aside: they do not change a vote); each bench step's deadline
    leaves time before its step's limit."""
    from diffsmooth.bench.gpu_summary import arithmetic_part
    from diffsmooth.bench.variants import parse_variants
    script = GPU_CHECK.read_text()
    lists = dict(re.findall(r"^(\w+_VARIANTS)=\$\{\w+:-([^}]+)\}", script, re.M))
    cifar, imagenet, judged = (parse_variants(lists[k]) for k in ("CIFAR_VARIANTS", "IMAGENET_VARIANTS",
                                                                 "AGREEMENT_VARIANTS"))
    assert cifar[0] == imagenet[0] == "default" and len(cifar) >= 4
    for spec in cifar + imagenet:
        kept = arithmetic_part(spec, keep_classifier_batch=False)
        assert kept == "default" or kept in judged, spec        # gpu_summary joins the rows by name
    body = re.search(r"^part_speed\(\) \{\n(.*?)^\}", script, re.S | re.M).group(1)
    for limit_var in ("CIFAR_LIMIT", "IMAGENET_LIMIT"):
        assert re.search(rf"--deadline-s \$\(\( \$\{{{limit_var}:-\d+\}} - \d+ \)\)", body), limit_var
    assert "--variants \"$AGREEMENT_VARIANTS\"" in body


class _Drifting(torch.nn.Module):
    """Scores off the truth by `fp16` while fusion is off and by `fused` while it is on (a stand-in for a deep
    fp16 net whose fused and unfused kernels each drift from fp32)."""

    def __init__(self, fp16: float, fused: float):
        super().__init__()
        self.fp16, self.fused = fp16, fused

    def forward(self, x):
        truth = x.flatten(1)[:, :10].float()
        return truth + (self.fused if CUDNN_FUSION["enabled"] else self.fp16)


def test_fusion_probe_measures_both_paths_against_the_fp32_network(monkeypatch):
    """With the fp32 folded network, the probe keeps a fused path off fp32 by no more than twice the unfused fp16
    path's own drift (past the absolute term alone, which refused it on an H200), and still refuses one far
    worse."""
    monkeypatch.setitem(CUDNN_FUSION, "enabled", True)
    x, exact, messages = torch.rand(12, 1, 8, 8), _Drifting(0.0, 0.0), []
    assert check_fusion(_Drifting(0.1, -0.1), x, messages.append, exact) and CUDNN_FUSION["enabled"]
    assert not check_fusion(_Drifting(0.1, -0.1), x, messages.append) and "disagree" in messages[-1]
    CUDNN_FUSION["enabled"] = True
    assert not check_fusion(_Drifting(0.1, 0.5), x, messages.append, exact)
    assert not CUDNN_FUSION["enabled"] and "disagree with fp32" in messages[-1]

"""The GPU fast path's logic on CPU: static-shape padding, chunked classifier calls, the two-lane
schedule, the settings that switch it, the check against eager fp32, and (slow) torch.compile of
the stages and of the noise with inductor's C++ backend."""

import numpy as np
import pytest
import torch
from stage_fixtures import SHAPE, image, make_pipeline, spread_classifier  # noqa: F401

from diffsmooth.engine.backends.torch.runner import TorchRunner
from diffsmooth.engine.backends.torch.stages import build_torch_stages
from diffsmooth.engine.certify.lanes import SerialLanes
from diffsmooth.engine.certify.monte_carlo import MonteCarloPipeline
from diffsmooth.engine.certify.noise import STREAM_LOCAL, gaussian
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.runs.fast_path import FastPath, default_batch, validate_fast_path


def test_fixture_votes_spread(tiny_stages):
    counts = make_pipeline(tiny_stages).count(image(), 0, 0, 200, 50)
    assert (counts > 0).sum() >= 3, f"votes do not spread: {counts}"


def test_static_batch_counts_equal_unpadded(tiny_stages):
    plain = make_pipeline(tiny_stages)
    static = make_pipeline(tiny_stages, static_batch=True)
    x = image(1)
    for first, num, batch in ((0, 37, 16), (100, 90, 64)):
        a, b = plain.count(x, 4, first, num, batch), static.count(x, 4, first, num, batch)
        assert (a > 0).sum() >= 2
        np.testing.assert_array_equal(a, b)
        assert a.sum() == num


def test_padding_rows_are_dropped_not_counted(tiny_stages):
    """The votes of the padded tail are other samples': counting them would change the counts."""
    pipe = make_pipeline(tiny_stages, static_batch=True)
    x = image(2)
    short = pipe.count(x, 0, 0, 10, 40)
    full = make_pipeline(tiny_stages).count(x, 0, 0, 40, 40)
    assert short.sum() == 10 and full.sum() == 40
    assert not np.array_equal(short * 4, full)


def test_chunked_classifier_calls_give_identical_counts(tiny_stages):
    whole = make_pipeline(tiny_stages)
    chunked = make_pipeline(tiny_stages)
    chunked.score_chunks[48] = 4
    x = image(3)
    np.testing.assert_array_equal(whole.count(x, 1, 0, 96, 48), chunked.count(x, 1, 0, 96, 48))


def test_out_of_memory_halves_the_chunk_and_retries(tiny_stages):
    pipe = make_pipeline(tiny_stages)
    inner = pipe.stages.score
    seen = []

    class SmallMemoryStage:
        name, device, precision = inner.name, inner.device, inner.precision

        def __call__(self, *inputs):
            seen.append(inputs[0].shape[0])
            if inputs[0].shape[0] > 12:
                raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
            return inner(*inputs)

    pipe.stages.score = SmallMemoryStage()
    messages = []
    pipe.log = messages.append
    x = image(4)
    counts = pipe.count(x, 2, 0, 48, 48)
    np.testing.assert_array_equal(counts, make_pipeline(tiny_stages).count(x, 2, 0, 48, 48))
    assert pipe.score_chunks[48] == 4 and seen[:3] == [48, 24, 12]
    assert any("out of memory" in m for m in messages)


class RecordingLanes(SerialLanes):
    """SerialLanes that log which lane each call ran on and the tokens handed across."""

    overlapping = True

    def __init__(self):
        self.events, self.lane = [], None

    def _enter(self, lane):
        lanes = self

        class Ctx:                      # lanes nest (count rows grown on the consumer while planning)
            def __enter__(self):
                self.before, lanes.lane = lanes.lane, lane

            def __exit__(self, *exc):
                lanes.lane = self.before
        return Ctx()

    def producer(self):
        return self._enter("producer")

    def consumer(self):
        return self._enter("consumer")

    def handoff(self, tensors):
        token = len(self.events)
        self.events.append(("handoff", token, self.lane))
        return token

    def accept(self, token, tensors):
        self.events.append(("accept", token, self.lane))

    def begin(self):
        self.events.append(("begin", None, None))

    def end(self):
        self.events.append(("end", None, None))


def test_two_lane_schedule_hands_each_batch_across_once(tiny_stages):
    pipe = make_pipeline(tiny_stages, static_batch=True)
    lanes = RecordingLanes()
    pipe.lanes = lanes
    calls = []
    produce, classify = pipe.produce, pipe.classify
    pipe.produce = lambda x, rows: calls.append(("produce", int(rows.sample[0]), lanes.lane)) or produce(x, rows)
    pipe.classify = lambda h, rows: calls.append(("classify", int(rows.sample[0]), lanes.lane)) or classify(h, rows)
    x = image(5)
    counts = pipe.count(x, 0, 10, 70, 20)
    np.testing.assert_array_equal(counts, make_pipeline(tiny_stages).count(x, 0, 10, 70, 20))
    assert [c[0] for c in calls] == ["produce", "produce", "classify", "produce", "classify", "produce",
                                     "classify", "classify"]
    assert all(lane == "producer" for kind, _, lane in calls if kind == "produce")
    assert all(lane == "consumer" for kind, _, lane in calls if kind == "classify")
    assert [c[1] for c in calls if c[0] == "classify"] == [10, 30, 50, 70]
    handoffs = [e[1] for e in lanes.events if e[0] == "handoff"]
    accepts = [e[1] for e in lanes.events if e[0] == "accept"]
    assert handoffs == accepts and lanes.events[0][0] == "begin" and lanes.events[-1][0] == "end"


@pytest.mark.parametrize("n0,n,batch", [(4, 50, 16), (20, 20, 16), (5, 27, 8)])
def test_certify_computes_the_samples_the_bench_extrapolates(tiny_stages, n0, n, batch):
    """One CERTIFY job asks for selection and estimation at once: ceil((n0 + n) / batch) static
    batches, as the bench's extrapolation assumes."""
    from diffsmooth.bench.harness import _selection_and_estimation, computed_samples
    pipe = make_pipeline(tiny_stages, static_batch=True)
    x = image(4)
    selection, estimation = pipe.run_one(x, 2, _selection_and_estimation(n0, n), batch)
    assert pipe.samples_computed == computed_samples(n0, n, batch, static=True)
    plain = make_pipeline(tiny_stages)
    np.testing.assert_array_equal(selection, plain.count(x, 2, 0, n0, batch)[0])
    np.testing.assert_array_equal(estimation, plain.count(x, 2, n0, n, batch)[0])
    assert (estimation > 0).sum() >= 2 and plain.samples_computed == n0 + n


def test_fast_path_defaults_and_errors():
    cpu = FastPath.resolve("cpu")
    assert not cpu.compile and not cpu.cuda_graphs and cpu.streams == 1 and not cpu.static_batch
    compiled = FastPath.resolve("cpu", compile=True)
    assert compiled.compile and compiled.static_batch and not compiled.compiled_noise
    assert not cpu.fused_attention and not compiled.fused_attention and "fused_attention" not in cpu.as_dict()
    fused = FastPath.resolve("cpu", fused_attention=True)
    assert fused.fused_attention and fused.changes_arithmetic and fused.as_dict()["fused_attention"] is True
    assert "fused_conv" not in fused.as_dict() and FastPath.resolve("cpu", fused_conv=True).changes_arithmetic
    with pytest.raises(UserError, match="CUDA"):
        FastPath.resolve("cpu", cuda_graphs=True)
    with pytest.raises(UserError, match="streams"):
        FastPath.resolve("cpu", streams=3)
    assert default_batch("cpu", (3, 32, 32)) == 1000
    assert default_batch("cuda", (3, 32, 32)) == 2000 and default_batch("cuda", (3, 224, 224)) == 32


def test_validation_refuses_a_path_that_disagrees(tiny_stages):
    good = make_pipeline(tiny_stages)
    messages = []
    report = validate_fast_path(good, make_pipeline(tiny_stages), [(0, image(6))], 64, 32, log=messages.append)
    assert report.agree == 64 and report.max_abs_diff == 0.0 and "ok" in messages[0]
    config, denoiser, classifier = tiny_stages
    other = spread_classifier(0)
    wrong = MonteCarloPipeline(build_torch_stages(config, other, denoiser, TorchRunner(), SHAPE, 10), 0.5, seed=3)
    with pytest.raises(UserError, match="disagrees with eager fp32"):
        validate_fast_path(wrong, good, [(0, image(6))], 64, 32, log=messages.append)


@pytest.mark.slow
def test_compiled_noise_bit_identical_on_cpu():
    """Large seed, stream and image indices, and the last sample indices before 2**32: the compiled draw is the
    eager one, bit for bit. Shaped as tests/bench/test_bench.py's agreement check draws it (batches of 8 one-channel
    32x32 images): one compiled kernel serves both in a run."""
    for args in ((123456789012, STREAM_LOCAL, 7, 100, 8, (1, 32, 32)), (0, 0, 2**32 - 1, 2**32 - 8, 8, (1, 32, 32))):
        eager = gaussian(*args)
        compiled = gaussian(*args, compiled=True)
        assert torch.equal(eager, compiled)


def test_fused_attention_counts_equal_reference_attention_on_cpu(tiny_stages):
    """The denoiser stage with scaled_dot_product_attention votes like the legacy attention (fp32 CPU)."""
    x = image(9)
    fused = make_pipeline(tiny_stages, fused_attention=True).count(x, 0, 0, 120, 40)
    reference = make_pipeline(tiny_stages).count(x, 0, 0, 120, 40)
    assert (reference > 0).sum() >= 2
    np.testing.assert_array_equal(fused, reference)


def test_folded_resnet_classifier_counts_equal_the_unfolded_one_on_cpu(tiny_stages):
    """--fused-conv: the local-smoothing stage on the BatchNorm-folded ResNet votes like the original."""
    from stage_fixtures import randomized_bn_resnet
    resnet = randomized_bn_resnet("cifar_resnet20", seed=0)
    x = image(11)
    folded = make_pipeline(tiny_stages, fused_conv=True, classifier=resnet)
    assert "Folded" in type(folded.stages.score.module.classifier.net).__name__
    reference = make_pipeline(tiny_stages, classifier=resnet).count(x, 0, 0, 150, 50)
    assert (reference > 0).sum() >= 2
    np.testing.assert_array_equal(folded.count(x, 0, 0, 150, 50), reference)


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")          # as test_model_set.py's compiled tests, which reuse these graphs
def test_compiled_stages_match_eager_on_cpu(tiny_stages):
    """torch.compile (inductor C++) of both stages at one static shape, with fused attention as on
    CUDA: the same counts as eager with the reference attention. (test_model_set.py's compiled tests build
    these very graphs: batches of 32, fused attention; inductor's FX graph cache compiles them once a run.)"""
    fast = make_pipeline(tiny_stages, backend=TorchRunner(compile=True), fused_attention=True, static_batch=True)
    eager = make_pipeline(tiny_stages)
    x = image(8)
    report = validate_fast_path(fast, eager, [(0, x)], 64, 32, log=lambda m: None)
    assert report.ok and report.max_abs_diff < 1e-4
    a, b = fast.count(x, 0, 0, 90, 32), eager.count(x, 0, 0, 90, 32)
    assert (a > 0).sum() >= 2
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("change", [["--batch", "3"], ["--streams", "2"], ["--compile"], ["--fused-attention"],
                                    ["--fused-conv"]])
def test_resume_refuses_other_batch_or_fast_path(tmp_path, tiny_cli_args, change):
    """Counts repeat only at the same batch, precision and kernels: a resume must match them."""
    from cli_helpers import invoke_ok
    from click.testing import CliRunner

    from diffsmooth.cli import main
    out = tmp_path / "r.tsv"
    base = ["certify", *tiny_cli_args, "--method", "dds", "--n0", "4", "--n", "8", "--max", "1", "--quiet",
            "--out", out]
    invoke_ok([*base, "--batch", "4"])
    args = [*base, "--batch", "4"]
    if change[0] == "--batch":
        args = [*base, *change]
    else:
        args += change
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 2
    assert "use another --out" in result.output and ("batch" in result.output or "fast_path" in result.output)



"""GPU checks of the torch backend (skipped without CUDA): Philox noise bit-identical to the CPU's
integer stream; counts that repeat exactly for an identical run; fp16/bf16 votes that agree with
eager fp32 per sample; CUDA-graph replay equal to the uncaptured call; two streams equal to one.
The compiled fast path on the demo models is checked by `python -m diffsmooth.bench.agreement`
(bench/gpu_check.sh), which pays its compile once."""

import numpy as np
import pytest
import torch

from diffsmooth.engine.certify.noise import STREAM_SMOOTHING, gaussian, philox4x32
from diffsmooth.engine.runs.vote_agreement import design_flip_rate

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

# Per-sample vote flip rates against eager fp32 are the check's design rates, measured on an H200 per precision
# and method (engine/runs/vote_agreement.py); fp32 runs cuDNN's TF32 convolutions (torch's default, 10 mantissa
# bits like fp16) against the check's TF32-off reference, so it gets fp16's rate.


def test_philox_integer_stream_identical_on_cuda():
    c = [torch.arange(1000, dtype=torch.int64) * k for k in (1, 3, 5, 7)]
    cpu = philox4x32(*c, 123, 456)
    gpu = philox4x32(*[t.cuda() for t in c], 123, 456)
    assert all(torch.equal(a, b.cpu()) for a, b in zip(cpu, gpu))
    z_cpu = gaussian(1, STREAM_SMOOTHING, 2, 0, 16, (3, 8, 8))
    z_gpu = gaussian(1, STREAM_SMOOTHING, 2, 0, 16, (3, 8, 8), device="cuda").cpu()
    assert torch.allclose(z_cpu, z_gpu, atol=1e-5)


def _demo_pipelines(precision, **pipeline_options):
    from diffsmooth.engine.base_classifier.methods import MethodConfig
    from diffsmooth.engine.demo import shipped as demo_assets
    from diffsmooth.engine.runs.assemble import ModelSources, load_models
    from diffsmooth.engine.runs.fast_path import FastPath
    from diffsmooth.engine.runs.stage_build import build_smooth
    if not demo_assets.DEMO_UNET.exists():
        pytest.skip("embedded demo weights not built")
    config = MethodConfig("diffsmooth", 0.5, m=5, local_sigma=0.25)
    sources = ModelSources.demo()
    models = load_models(config, sources)
    fast = FastPath(**pipeline_options)
    test = build_smooth(config, sources, (1, 32, 32), 10, device="cuda", precision=precision, fast=fast, models=models)
    fp32 = build_smooth(config, sources, (1, 32, 32), 10, device="cuda", precision="fp32", fast=FastPath(),
                        models=models)
    return test.pipeline, fp32.pipeline


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_demo_pipeline_on_cuda(precision):
    from diffsmooth.engine.data import load_dataset
    from diffsmooth.engine.runs.fast_path import measure_agreement
    pipe, fp32 = _demo_pipelines(precision)
    x, _ = load_dataset("embedded")[0]
    counts = pipe.count(x, 0, 0, 1000, 250)
    assert (counts > 0).sum() >= 2, f"votes do not spread: {counts}"
    np.testing.assert_array_equal(counts, pipe.count(x, 0, 0, 1000, 250))     # an identical run repeats
    halves = pipe.count(x, 0, 0, 500, 250) + pipe.count(x, 0, 500, 500, 250)
    np.testing.assert_array_equal(counts, halves)                              # sample ranges on the device
    report = measure_agreement(pipe, fp32, [(0, x), (7, load_dataset("embedded")[7][0])], 1000, 250,
                               design_flip_rate(precision, ["diffsmooth"]))
    assert report.ok, report.problems


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_the_demo_diffusers_ddpm_on_cuda(precision):
    """DDS with the demo's diffusers DDPM folder on CUDA, the default fast path (compiled, CUDA graphs,
    streams): votes spread, an identical run repeats, and the votes agree with eager fp32 within the
    flip budget of DDS, measured on the engine's own UNet and the diffusers DDPM alike (issue: diffusers
    denoisers on every path the official UNets have)."""
    pytest.importorskip("diffusers")
    from diffsmooth.engine.base_classifier.methods import MethodConfig
    from diffsmooth.engine.data import load_dataset
    from diffsmooth.engine.demo import shipped as demo_assets
    from diffsmooth.engine.runs.assemble import ModelSources, load_models
    from diffsmooth.engine.runs.fast_path import FastPath, measure_agreement
    from diffsmooth.engine.runs.stage_build import build_smooth
    if not demo_assets.DEMO_DDPM.exists():
        pytest.skip("the demo's diffusers denoiser is not built")
    config = MethodConfig("dds", 0.5)
    sources = ModelSources(denoiser=str(demo_assets.DEMO_DDPM), stats=demo_assets.DEMO_STATS,
                           classifier=str(demo_assets.demo_classifier_path(0.0)))
    models = load_models(config, sources)
    fast = build_smooth(config, sources, (1, 32, 32), 10, device="cuda", precision=precision,
                        fast=FastPath.resolve("cuda"), models=models).pipeline
    fp32 = build_smooth(config, sources, (1, 32, 32), 10, device="cuda", precision="fp32", fast=FastPath(),
                        models=models).pipeline
    x, _ = load_dataset("embedded")[2]
    counts = fast.count(x, 2, 0, 1000, 250)
    assert (counts > 0).sum() >= 2, f"votes do not spread: {counts}"
    np.testing.assert_array_equal(counts, fast.count(x, 2, 0, 1000, 250))
    report = measure_agreement(fast, fp32, [(2, x), (9, load_dataset("embedded")[9][0])], 1000, 250,
                               design_flip_rate(precision, ["dds"]))
    assert report.ok, report.problems


def test_two_streams_count_like_one():
    from diffsmooth.engine.data import load_dataset
    two, _ = _demo_pipelines("fp32", streams=2, static_batch=True)
    one, _ = _demo_pipelines("fp32", streams=1, static_batch=True)
    assert two.lanes.overlapping and not one.lanes.overlapping
    x, _ = load_dataset("embedded")[3]
    a, b = two.count(x, 3, 0, 2300, 500), one.count(x, 3, 0, 2300, 500)
    assert (a > 0).sum() >= 2
    np.testing.assert_array_equal(a, b)


def test_cuda_graph_replay_matches_uncaptured_call():
    from diffsmooth.engine.backends.torch.cuda_graphs import CudaGraphStage
    from diffsmooth.engine.backends.torch.runner import TorchStage
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.GroupNorm(4, 16), torch.nn.SiLU(),
                              torch.nn.Flatten(), torch.nn.Linear(16 * 64, 10))
    stage = TorchStage(net, "tiny", torch.device("cuda"), "fp16")
    messages = []
    graphed = CudaGraphStage(stage, log=messages.append)
    for seed in range(3):
        x = torch.rand((64, 3, 8, 8), device="cuda", generator=torch.Generator("cuda").manual_seed(seed))
        torch.testing.assert_close(graphed(x), stage(x), rtol=0, atol=0)
    assert len(graphed.graphs) == 1 and not graphed.fallback
    assert any("replay checked" in m for m in messages)


def test_fused_conv_classifier_on_cuda():
    """--fused-conv on the demo ResNet-20: cuDNN's fused conv + bias (+ add) + ReLU is kept by the
    build-time probe (a GPU where it fails shows here), the pipeline really reaches the cuDNN kernel
    (the folded net feeds itself NHWC), its scores are finite, counts repeat, votes agree with eager fp32."""
    from stage_fixtures import GPU_FUSED_CONV_IMAGE as index

    from diffsmooth.engine.data import load_dataset
    from diffsmooth.engine.models.folded_resnet import CUDNN_FUSION, FUSED_CALLS
    from diffsmooth.engine.runs.fast_path import measure_agreement
    pipe, fp32 = _demo_pipelines("fp16", fused_conv=True, fused_attention=True)
    assert CUDNN_FUSION["enabled"], "the cuDNN fusion probe turned fused convolutions off on this GPU"
    assert "Folded" in type(pipe.stages.score.module.classifier.net).__name__
    x, _ = load_dataset("embedded")[index]     # one whose votes spread (image 5 is unanimous even in CPU fp32)
    before = FUSED_CALLS["count"]
    counts = pipe.count(x, index, 0, 1000, 250)
    assert FUSED_CALLS["count"] > before, "the pipeline never reached cuDNN's fused kernel"
    if (counts > 0).sum() < 2:
        reference = fp32.count(x, index, 0, 1000, 250)
        verdict = ("the image itself is unanimous: pick another GPU_FUSED_CONV_IMAGE" if (reference > 0).sum() < 2
                   else "the fused path collapsed where eager fp32 spreads")
        pytest.fail(f"votes do not spread on image {index}: fused fp16 {counts.tolist()}, "
                    f"eager fp32 {reference.tolist()}: {verdict}")
    np.testing.assert_array_equal(counts, pipe.count(x, index, 0, 1000, 250))
    report = measure_agreement(pipe, fp32, [(index, x)], 2000, 250)
    assert report.ok, report.problems


def test_issuing_a_packed_batch_never_blocks_the_host():
    """Rows to the device (pinned, non-blocking), noise from keys made once, the stages and the vote
    scatter: no host sync while batches are issued. The only sync is reading completed counts."""
    from diffsmooth.engine.backends.torch.runner import TorchRunner
    from diffsmooth.engine.base_classifier.local_smoothing import LogitsModule
    from diffsmooth.engine.certify.jobs import count_job
    from diffsmooth.engine.certify.monte_carlo import MonteCarloPipeline
    from diffsmooth.engine.certify.scheduler import Scheduler, Work
    from diffsmooth.engine.stages.base import BaseClassifierStages
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                              torch.nn.Linear(8 * 64, 10)).eval()
    stage = TorchRunner("cuda").stage(LogitsModule(net), "classifier")
    pipe = MonteCarloPipeline(BaseClassifierStages("rs", None, stage, 10), 0.5, seed=1, static_batch=True)
    sched = Scheduler(pipe, 64, window=8)
    works = iter([Work(i, torch.rand(3, 8, 8), count_job(0, 40)) for i in range(8)])    # 2-3 images a batch
    active = {}

    def admit():
        work = next(works, None)
        if work is None:
            return False
        sched._admit(work, active, lambda done: None)
        return True

    def issue():
        rows = sched._plan(active, admit)
        sched._count(sched._produce(rows), rows)

    issue()                                         # warm-up: allocations, cuDNN's algorithm choice
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            issue()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    assert int(sched._counts.sum()) == 4 * 64 and len(active) >= 6


def test_python_api_on_cuda_certifies_like_the_cpu():
    """`DiffSmooth(device="cuda")` (compiled fp16 by default, the agreement check on its first image) certifies
    the demo images it certifies on the CPU in fp32: the same Philox noise, so the same predictions, and
    radii within fp16's reach of the CPU's."""
    from diffsmooth import DiffSmooth, load_dataset, load_demo_classifier, load_demo_denoiser
    data = load_dataset("embedded")
    models = dict(denoiser=load_demo_denoiser(), classifier=load_demo_classifier(0.25), sigma=0.5, local_sigma=0.25,
                  m=5)
    gpu, cpu = DiffSmooth(**models, device="cuda", precision="fp16"), DiffSmooth(**models)
    predictions, radii = [], []
    for index in (0, 7, 25, 50, 75, 100):
        x, _ = data[index]
        a, b = gpu.certify(x, n0=100, n=500, alpha=0.001, image_index=index), \
            cpu.certify(x, n0=100, n=500, alpha=0.001, image_index=index)
        predictions.append((a.prediction, b.prediction))
        radii.append((a.radius, b.radius))
    assert len({b for _, b in predictions}) >= 3, f"predictions do not spread: {predictions}"
    assert sum(a == b for a, b in predictions) >= 5, predictions
    assert all(abs(a - b) < 0.05 for (a, b), (p, q) in zip(radii, predictions) if p == q), radii
    for name in ("classifier", "denoiser"):     # the models given stay where they were: each model runs its own copy
        assert {p.device.type for p in models[name].parameters()} == {"cpu"}, name


def test_python_api_on_cuda_refuses_its_weights_moved_from_under_its_graphs():
    """A CUDA model's own copy moved to the CPU after its CUDA graphs were captured: the next call is refused
    (WeightsChanged), not counted from freed GPU memory."""
    from diffsmooth import DiffSmooth, load_dataset, load_demo_classifier, load_demo_denoiser
    from diffsmooth.engine.certify.monte_carlo import WeightsChanged
    x, _ = load_dataset("embedded")[0]
    model = DiffSmooth(denoiser=load_demo_denoiser(), classifier=load_demo_classifier(0.25), sigma=0.5, local_sigma=0.25,
                       m=5, device="cuda", precision="fp16")
    model.certify(x, n0=100, n=500, alpha=0.001, image_index=0)
    model.classifier.to("cpu")
    with pytest.raises(WeightsChanged, match="on cpu"):
        model.certify(x, n0=100, n=500, alpha=0.001, image_index=0)


def test_a_sweep_on_cuda_counts_like_the_cpu(tmp_path):
    """A certify sweep (rs, dds, diffsmooth at m = 1 and 3: one score stage on the one voter) in CUDA fp32
    eager writes every configuration's rows as the CPU does: the same noise, so rows equal but for
    TF32's reductions (at most one row in ten), and the predictions spread over classes."""
    from cli_helpers import assert_rows_spread, invoke_ok, rows_without_time
    common = ["certify", "--method", "rs", "--method", "dds", "--method", "diffsmooth", "--m", "1", "--m", "3",
              "--sigma", "0.5", "--n0", "50", "--n", "400", "--max", "100", "--skip", "10", "--quiet"]
    invoke_ok([*common, "--device", "cpu", "--out", tmp_path / "cpu"])
    invoke_ok([*common, "--device", "cuda", "--no-compile", "--out", tmp_path / "cuda"])
    files = sorted(p.name for p in (tmp_path / "cpu").glob("*.tsv"))
    assert len(files) == 4 and files == sorted(p.name for p in (tmp_path / "cuda").glob("*.tsv"))
    for name in files:
        cpu, cuda = rows_without_time(tmp_path / "cpu" / name), rows_without_time(tmp_path / "cuda" / name)
        assert len(cpu) == len(cuda) == 10
        assert sum(a == b for a, b in zip(cpu, cuda)) >= 9, (name, cpu, cuda)
    assert_rows_spread(tmp_path / "cpu" / files[-1])

"""GPU checks for the torch backend (skipped without CUDA; never run so far): the same counts on
CUDA fp32 as the vote totals demand, Philox noise bit-identical to the CPU's integer stream, and
fp16/bf16 autocast producing valid votes."""

import pytest
import torch

from diffsmooth.engine.certify.noise import STREAM_SMOOTHING, gaussian, philox4x32

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_philox_integer_stream_identical_on_cuda():
    c = [torch.arange(1000, dtype=torch.int64) * k for k in (1, 3, 5, 7)]
    cpu = philox4x32(*c, 123, 456)
    gpu = philox4x32(*[t.cuda() for t in c], 123, 456)
    assert all(torch.equal(a, b.cpu()) for a, b in zip(cpu, gpu))
    z_cpu = gaussian(1, STREAM_SMOOTHING, 2, 0, 16, (3, 8, 8))
    z_gpu = gaussian(1, STREAM_SMOOTHING, 2, 0, 16, (3, 8, 8), device="cuda").cpu()
    assert torch.allclose(z_cpu, z_gpu, atol=1e-5)


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_demo_pipeline_on_cuda(precision):
    from diffsmooth.engine.demo import shipped as demo_assets
    if not demo_assets.DEMO_UNET.exists():
        pytest.skip("embedded demo weights not built")
    from diffsmooth.engine.runs.assemble import ModelSources, build_smooth
    from diffsmooth.engine.data import load_dataset
    from diffsmooth.engine.base_classifier.methods import MethodConfig
    ds = load_dataset("embedded")
    config = MethodConfig("diffsmooth", 0.5, m=5, local_sigma=0.25)
    gpu = build_smooth(config, ModelSources.demo(), (1, 32, 32), 10, device="cuda", precision=precision)
    x, _ = ds[0]
    counts = gpu.pipeline.count(x, 0, 0, 500, 250)
    halves = gpu.pipeline.count(x, 0, 0, 250, 250) + gpu.pipeline.count(x, 0, 250, 250, 250)
    assert torch.equal(torch.as_tensor(counts), torch.as_tensor(halves))     # sample ranges on the device
    assert torch.equal(torch.as_tensor(counts), torch.as_tensor(gpu.pipeline.count(x, 0, 0, 500, 100)))
    if precision == "fp32":
        cpu = build_smooth(config, ModelSources.demo(), (1, 32, 32), 10)
        cpu_counts = cpu.pipeline.count(x, 0, 0, 500, 250)
        assert abs(int(cpu_counts.argmax()) - int(counts.argmax())) == 0
        assert abs(cpu_counts - counts).sum() <= 10       # near-ties may flip across devices

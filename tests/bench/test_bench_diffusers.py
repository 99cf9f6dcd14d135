"""bench with a diffusers denoiser folder: its own weights in place of the set's UNet, FLOPs counted,
the reference-equivalent baseline doing the same maths as the engine's purifier."""

import pytest
import torch

pytest.importorskip("diffusers")
pytest.importorskip("safetensors")

from diffusers import CMStochasticIterativeScheduler, DDPMScheduler  # noqa: E402
from diffusers_fixtures import save_pipeline, tiny_unet  # noqa: E402


@pytest.mark.parametrize("scheduler", [DDPMScheduler(prediction_type="v_prediction"), CMStochasticIterativeScheduler()],
                         ids=["ddpm-v", "consistency"])
def test_reference_equivalent_does_the_engines_maths(tmp_path, scheduler):
    from diffsmooth.bench.models import build_model_set
    from diffsmooth.bench.reference_equivalent import ReferenceEquivalent
    folder = save_pipeline(tmp_path / "p", tiny_unet(0), scheduler)
    model_set = build_model_set("cifar10", "dds", 0.5, 0.25, 0, arch="cifar_resnet20", denoiser_folder=str(folder))
    assert model_set.image_shape == (3, 8, 8) and model_set.denoiser.format.endswith(type(scheduler).__name__)
    ref = ReferenceEquivalent("dds", model_set.classifier, 10, 0.5, model_set.denoiser)
    x = torch.rand(5, *model_set.image_shape)
    with torch.no_grad():
        torch.testing.assert_close(ref._denoise(x), model_set.denoiser.purifier(0.5)(x), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_tiny_run_with_a_folder(tmp_path):
    from diffsmooth.bench.harness import BenchSettings, run_bench, to_jsonable
    folder = save_pipeline(tmp_path / "cm", tiny_unet(0), CMStochasticIterativeScheduler())
    torch.set_num_threads(1)
    doc = to_jsonable(run_bench(BenchSettings(
        models="cifar10", method="diffsmooth", sigma=0.5, n0=4, n=1000, m=2, batch=4, measure_n=6, images=1,
        arch="cifar_resnet20", denoiser=str(folder), measure_cpu_peak=False, progress=False, reference_batch=5)))
    assert doc["settings"]["denoiser"] == str(folder)
    run = doc["runs"][0]
    assert run["flops"]["denoiser_per_sample"] > 0 and run["flops"]["by_op"]["denoiser"].get("bmm", 0) > 0
    assert run["reference_equivalent"]["speedup"] > 0

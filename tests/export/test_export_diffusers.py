"""ONNX export of a diffusers denoiser folder: the purifier graph validates against torch, `validate`
re-checks it from the manifest (the folder's hashes), and certify on ONNX Runtime writes the eager rows."""

import json

import pytest

pytest.importorskip("diffusers")
pytest.importorskip("safetensors")
pytest.importorskip("onnxruntime")

from cli_helpers import invoke_ok, rows_without_time  # noqa: E402
from diffusers import CMStochasticIterativeScheduler, DDPMScheduler  # noqa: E402
from diffusers_fixtures import save_pipeline, tiny_unet  # noqa: E402


@pytest.mark.slow
@pytest.mark.parametrize("scheduler", [DDPMScheduler(prediction_type="v_prediction"), CMStochasticIterativeScheduler()],
                         ids=["ddpm-v", "consistency"])
def test_export_validate_and_onnxruntime_rows_equal_eager(tiny_models, tmp_path, scheduler):
    folder = save_pipeline(tmp_path / "model", tiny_unet(0), scheduler)
    onnx_dir = tmp_path / "onnx"
    data = ["--dataset", "npz", "--data", tiny_models["data"]]
    models = ["--denoiser", folder, "--classifier", tiny_models["classifier"]]
    invoke_ok(["export", *models, "--method", "dds", "--sigma", 0.25, "--image-shape", "3,8,8", "--out", onnx_dir,
               "--samples", 20, *data])
    manifest = json.loads((onnx_dir / "denoiser_s0.25_3x8x8_fp32.json").read_text())
    assert manifest["source"]["denoiser_format"].startswith("diffusers UNet2DModel + ")
    assert manifest["validation"]["passed"]
    invoke_ok(["validate", "--onnx-dir", onnx_dir, "--samples", 20, *data])
    run = [*models, *data, "--method", "dds", "--sigma", 0.25, "--n0", 10, "--n", 40, "--batch", 40, "--max", 3]
    invoke_ok(["certify", *run, "--backend", "onnxruntime", "--onnx-dir", onnx_dir, "--out", tmp_path / "ort.tsv"])
    invoke_ok(["certify", *run, "--out", tmp_path / "eager.tsv"])
    assert rows_without_time(tmp_path / "ort.tsv") == rows_without_time(tmp_path / "eager.tsv")

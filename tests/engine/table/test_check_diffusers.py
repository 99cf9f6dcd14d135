"""`diffsmooth table --check` with a diffusers folder as the denoiser: configs and weight shapes are
checked without a sample; a broken folder is one line and exit code 2."""

import json

import pytest
from click.testing import CliRunner

pytest.importorskip("diffusers")
pytest.importorskip("safetensors")

from diffusers import DDPMScheduler  # noqa: E402
from diffusers_fixtures import save_pipeline, tiny_unet  # noqa: E402

from diffsmooth.cli import main  # noqa: E402

SPEC = """
title = "diffusers check"
sigmas = [0.25]
radii = [0.25]
[data]
dataset = "embedded"
[models]
denoiser = "{models}/ddpm"
[[line]]
name = "DDS"
method = "dds"
"""


def test_a_diffusers_denoiser_passes_the_check_and_a_mis_shaped_one_is_one_line(tmp_path):
    models = tmp_path / "models"
    folder = save_pipeline(models / "ddpm", tiny_unet(0), DDPMScheduler())
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC)
    ok = CliRunner().invoke(main, ["table", str(spec), "--check", "--models", str(models)])
    assert ok.exit_code == 0, ok.output
    assert "diffusers folder" in ok.output and "error:" not in ok.output
    config = folder / "unet" / "config.json"
    edited = dict(json.loads(config.read_text()), block_out_channels=[8, 32])
    config.write_text(json.dumps(edited))
    bad = CliRunner().invoke(main, ["table", str(spec), "--check", "--models", str(models)])
    errors = [line for line in bad.output.splitlines() if line.startswith("error:")]
    assert bad.exit_code == 2 and len(errors) == 1 and "denoiser" in errors[0], bad.output
    assert "Traceback" not in bad.output and not (tmp_path / "out").exists()

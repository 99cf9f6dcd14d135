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
    ok = CliRunner().invoke(main, ["table", str(spec), "--check", "--no-preflight", "--models", str(models)])
    assert ok.exit_code == 0, ok.output
    assert "diffusers folder" in ok.output and "error:" not in ok.output
    config = folder / "unet" / "config.json"
    edited = dict(json.loads(config.read_text()), block_out_channels=[8, 32])
    config.write_text(json.dumps(edited))
    bad = CliRunner().invoke(main, ["table", str(spec), "--check", "--no-preflight", "--models", str(models)])
    errors = [line for line in bad.output.splitlines() if line.startswith("error:")]
    assert bad.exit_code == 2 and len(errors) == 1 and "denoiser" in errors[0], bad.output
    assert "Traceback" not in bad.output and not (tmp_path / "out").exists()


def test_a_lines_own_denoiser_is_checked_and_its_keys_are_refused_where_they_do_not_belong(tmp_path):
    """A line's `denoiser` ({models} filled in) is checked like [models]' and named by its line; the
    run takes none of [models]' denoiser settings; an rs line with a denoiser, or a scheduler without
    one, is one line."""
    from diffsmooth.engine.errors import UserError
    from diffsmooth.engine.table.spec import load_spec, parse_spec
    models = tmp_path / "models"
    folder = save_pipeline(models / "ddpm", tiny_unet(0), DDPMScheduler())
    spec = tmp_path / "spec.toml"
    spec.write_text('title = "t"\nsigmas = [0.25]\nradii = [0.25]\n[data]\ndataset = "embedded"\n'
                    '[models]\npreset = "demo"\n'
                    '[[line]]\nname = "DDS"\nmethod = "dds"\n'
                    '[[line]]\nname = "DDS ddpm"\nmethod = "dds"\nclassifier = "{models}/clf.pt"\n'
                    'denoiser = "{models}/ddpm"\n')
    parsed = load_spec(spec, {"models": str(models)})
    own = parsed.lines[1]
    assert own.denoiser == str(folder) and parsed.lines[0].denoiser is None
    options = parsed.request_options(own, 0.25)
    assert options["denoiser"] == str(folder) and "preset" not in options
    assert parsed.request_options(parsed.lines[0], 0.25)["preset"] == "demo"
    result = CliRunner().invoke(main, ["table", str(spec), "--check", "--no-preflight", "--models", str(models)])
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert result.exit_code == 2 and len(errors) == 1 and "line 'DDS ddpm'" in errors[0], result.output
    assert "clf.pt" in errors[0]                        # the missing classifier; the folder itself passed
    assert "diffusers folder" in result.output
    with pytest.raises(UserError, match="an rs line does not denoise"):
        parse_spec({"line": [{"method": "rs", "denoiser": str(folder)}]})
    with pytest.raises(UserError, match="scheduler goes with the line's own denoiser"):
        parse_spec({"line": [{"method": "dds", "scheduler": str(folder / "scheduler")}]})

"""Reading diffusers folders: the two layouts, safetensors only, the recorded identity, and one-line
refusals of everything the engine does not take (each names what is supported and why)."""

import json
import shutil

import pytest
import torch

pytest.importorskip("diffusers")
pytest.importorskip("safetensors")

from diffusers import DDPMScheduler, EulerDiscreteScheduler  # noqa: E402
from diffusers_fixtures import save_pipeline, tiny_unet  # noqa: E402

from diffsmooth.engine.base_classifier.denoise import load_denoiser  # noqa: E402
from diffsmooth.engine.errors import UserError  # noqa: E402
from diffsmooth.engine.models.diffusers_folder import denoiser_identity, read_diffusers_folder  # noqa: E402


@pytest.fixture
def pipeline(tmp_path):
    return save_pipeline(tmp_path / "ddpm", tiny_unet(0), DDPMScheduler())


def _refused(match, path, scheduler=None, **kwargs):
    with pytest.raises(UserError, match=match) as err:
        load_denoiser(path, None, scheduler=scheduler, **kwargs)
    assert "\n" not in str(err.value)
    return str(err.value)


def _edit_json(path, **changes):
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def test_pipeline_folder_and_unet_folder_with_scheduler_load_the_same(pipeline, tmp_path):
    folder = read_diffusers_folder(pipeline)
    assert (folder.kind, folder.scheduler_class, folder.channels) == ("ddpm", "DDPMScheduler", 3)
    unet_only = tmp_path / "unet_only"
    shutil.copytree(pipeline / "unet", unet_only)
    a = load_denoiser(pipeline, None)
    for scheduler in (pipeline / "scheduler", pipeline):        # the scheduler folder, or a pipeline holding one
        b = load_denoiser(unet_only, None, scheduler=scheduler)
        x = torch.rand(2, 3, 8, 8)
        assert torch.equal(a.denoise(x, 0.25), b.denoise(x, 0.25))


def test_identity_names_the_format_and_the_weights(pipeline, tmp_path):
    ident = denoiser_identity(pipeline)
    assert ident["denoiser_format"] == "diffusers UNet2DModel + DDPMScheduler"
    other = save_pipeline(tmp_path / "other", tiny_unet(1), DDPMScheduler())
    assert denoiser_identity(other)["denoiser_sha256"] != ident["denoiser_sha256"]
    assert denoiser_identity(other)["denoiser_config_sha256"] == ident["denoiser_config_sha256"]
    beta = save_pipeline(tmp_path / "beta", tiny_unet(0), DDPMScheduler(beta_schedule="squaredcos_cap_v2"))
    assert denoiser_identity(beta)["denoiser_sha256"] == ident["denoiser_sha256"]
    assert denoiser_identity(beta)["denoiser_config_sha256"] != ident["denoiser_config_sha256"]
    assert denoiser_identity(tmp_path / "model.pt") == {}        # checkpoint files: nothing added to their settings


def test_latent_or_text_pipeline_refused(pipeline):
    _edit_json(pipeline / "model_index.json", vae=["diffusers", "AutoencoderKL"])
    message = _refused("latent or text-conditioned", pipeline)
    assert "pixel space" in message and "UNet2DModel" in message


def test_conditional_unet_refused(pipeline, tmp_path):
    unet_dir = tmp_path / "cond"
    shutil.copytree(pipeline / "unet", unet_dir)
    _edit_json(unet_dir / "config.json", _class_name="UNet2DConditionModel")
    assert "pixel space" in _refused("UNet2DConditionModel", unet_dir, scheduler=pipeline / "scheduler")


def test_class_conditional_unet_refused(tmp_path):
    path = save_pipeline(tmp_path / "c", tiny_unet(0, num_class_embeds=10), DDPMScheduler())
    _refused("class-conditional", path)


def test_other_scheduler_refused(tmp_path):
    path = save_pipeline(tmp_path / "euler", tiny_unet(0), EulerDiscreteScheduler())
    message = _refused("EulerDiscreteScheduler", path)
    assert "DDPMScheduler" in message and "CMStochasticIterativeScheduler" in message


def test_missing_and_mismatched_configs_refused(pipeline, tmp_path):
    _edit_json(pipeline / "model_index.json", scheduler=["diffusers", "DDIMScheduler"])
    _refused("do not match", pipeline)
    _edit_json(pipeline / "model_index.json", scheduler=["diffusers", "DDPMScheduler"])
    (pipeline / "scheduler" / "scheduler_config.json").unlink()
    _refused("no scheduler_config.json", pipeline)
    (pipeline / "unet" / "config.json").write_text("{not json")
    _refused("cannot read", pipeline)
    _refused("without a scheduler", _unet_copy(tmp_path, "ddpm"))
    _refused("not a diffusers model", tmp_path / "ddpm" / "scheduler")


def _unet_copy(tmp_path, name):
    target = tmp_path / f"{name}_unet"
    shutil.copytree(tmp_path / name / "unet", target, dirs_exist_ok=True)
    return target


def test_learned_variance_needs_a_learned_variance_scheduler(tmp_path):
    path = save_pipeline(tmp_path / "lv", tiny_unet(0, out_channels=6), DDPMScheduler(variance_type="fixed_small"))
    _refused("learned variance", path)


def test_weights_disagreeing_with_the_config_refused(pipeline):
    _edit_json(pipeline / "unet" / "config.json", block_out_channels=[8, 32])
    _refused("mis-shaped", pipeline)


def test_pickle_weights_refused(tmp_path):
    from diffusers import DDPMPipeline
    path = tmp_path / "pickled"
    DDPMPipeline(unet=tiny_unet(0), scheduler=DDPMScheduler()).save_pretrained(str(path), safe_serialization=False)
    assert (path / "unet" / "diffusion_pytorch_model.bin").exists()
    _refused("safetensors only", path)


def test_corrupt_safetensors_refused(pipeline):
    (pipeline / "unet" / "diffusion_pytorch_model.safetensors").write_bytes(b"\x00" * 64)
    _refused("not a readable safetensors file", pipeline)


def test_options_of_checkpoint_files_refused_with_a_folder(pipeline):
    for kwargs in (dict(schedule="linear"), dict(image_size=8)):
        _refused("leave out", pipeline, **kwargs)
    for preset in ("imagenet", "cifar10"):
        with pytest.raises(UserError, match="leave out preset"):
            load_denoiser(pipeline, preset)
    unet = load_denoiser(pipeline)                  # the default preset of checkpoint files does not count
    assert unet.kind == "ddpm"


def test_unknown_config_field_refused(pipeline):
    _edit_json(pipeline / "scheduler" / "scheduler_config.json", brand_new_field=1)
    _refused("does not know", pipeline)


def test_sharded_and_variant_weights_load(pipeline, tmp_path):
    """A sharded safetensors UNet (index + shards) and a single fp16 variant load like the plain file."""
    from diffusers import UNet2DModel
    unet = UNet2DModel.from_pretrained(str(pipeline / "unet"))
    sharded, variant = tmp_path / "sharded", tmp_path / "variant"
    unet.save_pretrained(str(sharded), max_shard_size="60KB")
    assert (sharded / "diffusion_pytorch_model.safetensors.index.json").exists()
    unet.half().save_pretrained(str(variant), variant="fp16")
    assert (variant / "diffusion_pytorch_model.fp16.safetensors").exists()
    x = torch.rand(2, 3, 8, 8)
    plain = load_denoiser(pipeline, None).denoise(x, 0.5)
    assert torch.equal(load_denoiser(sharded, None, scheduler=pipeline).denoise(x, 0.5), plain)
    assert torch.allclose(load_denoiser(variant, None, scheduler=pipeline).denoise(x, 0.5), plain, atol=2e-2)
    assert denoiser_identity(sharded, pipeline)["denoiser_sha256"] != denoiser_identity(pipeline)["denoiser_sha256"]

"""One rule for the models' normalisation statistics, whichever command asks (certify, export, purify)."""

import pytest

from diffsmooth.engine.runs.sources import ModelOptions, default_image_shape, resolve_sources


def test_the_preset_decides_the_stats_not_the_data_file():
    for kind in ("npz", "idx", "imagenet", None):
        s = resolve_sources(ModelOptions(denoiser="u.pt", classifier="c.pt", preset="imagenet"), kind)
        assert s.stats == "imagenet", kind
    implied = resolve_sources(ModelOptions(denoiser="u.pt", classifier="c.pt"), "idx")   # a denoiser alone: cifar10
    assert (implied.preset, implied.stats) == ("cifar10", "cifar10")


def test_a_classifier_without_preset_takes_the_data_kinds_stats():
    assert resolve_sources(ModelOptions(classifier="c.pt"), "imagenet").stats == "imagenet"
    assert resolve_sources(ModelOptions(classifier="c.pt"), "idx").stats == "fashion-mnist"
    assert resolve_sources(ModelOptions(classifier="c.pt")).stats == "cifar10"
    assert resolve_sources(ModelOptions(classifier="c.pt"), "idx").preset is None
    custom = resolve_sources(ModelOptions(denoiser="u.pt", classifier="c.pt", unet_config='{"model_channels": 8}'), "idx")
    assert custom.preset is None and custom.unet_config == {"model_channels": 8} and custom.stats == "fashion-mnist"


def test_given_stats_win():
    s = resolve_sources(ModelOptions(denoiser="u.pt", classifier="c.pt", preset="imagenet", stats="cifar10"), "npz")
    assert s.stats == "cifar10"


def test_no_checkpoint_means_the_demo_models():
    from diffsmooth.engine.models import shipped
    if not shipped.DEMO_UNET.exists():
        pytest.skip("embedded demo weights not built")
    s = resolve_sources(ModelOptions(), "npz")
    assert (s.denoiser, s.preset, s.stats) == (str(shipped.DEMO_UNET), "demo", "fashion-mnist")


def test_image_shape_defaults():
    assert default_image_shape("imagenet", "cifar10") == (3, 224, 224)
    assert default_image_shape(None, "fashion-mnist") == (1, 32, 32)
    assert default_image_shape(None, None) == (3, 32, 32)

"""A part is a configured object (docs/extending.md): its settings are its constructor's keywords, declared once
(MethodOption) and checked in one line; a MethodConfig configures its method's parts from its settings; the Python API
takes configured parts and finds the registered method that pairs them, with the same rows as the method's own
keywords (votes spread over several classes)."""

import pytest

from diffsmooth import (
    DiffSmooth,
    LocalSmoothingHead,
    LogitsHead,
    MajorityVoteHead,
    OneShotPurifier,
    ReverseChainsPurifier,
    SmoothedClassifier,
    load_dataset,
    load_demo_classifier,
    load_demo_denoiser,
)
from diffsmooth.engine.base_classifier.methods import MethodConfig
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.models import shipped

needs_demo = pytest.mark.skipif(not shipped.DEMO_UNET.exists(), reason="embedded demo models not shipped")


def test_a_part_is_configured_by_its_constructor_and_checks_its_settings_in_one_line():
    head = LocalSmoothingHead(m=5, local_sigma=0.25, local_noise="fresh")
    assert (head.m, head.local_sigma, head.local_noise) == (5, 0.25, "fresh")
    assert head.settings["local_noise_seed"] == LocalSmoothingHead.options[-1].default          # a default filled in
    assert head == LocalSmoothingHead(local_noise="fresh", local_sigma=0.25, m=5) != LocalSmoothingHead(m=3)
    assert repr(ReverseChainsPurifier(reverse_runs=4)) == "ReverseChainsPurifier(reverse_runs=4, steps=2)"
    assert ReverseChainsPurifier(reverse_runs=4).copies == 4 and OneShotPurifier().copies == 1
    for wrong, message in ((lambda: LocalSmoothingHead(m=0), r"^LocalSmoothingHead setting m must be 1\.\."),
                           (lambda: LocalSmoothingHead(sigma_prime=0.2), r"^LocalSmoothingHead has no setting 'sigma_prime'"),
                           (lambda: OneShotPurifier(steps=2), r"^OneShotPurifier has no setting 'steps': it has no")):
        with pytest.raises(UserError, match=message) as raised:
            wrong()
        assert "\n" not in str(raised.value)


def test_a_method_config_configures_its_methods_parts_from_its_settings():
    config = MethodConfig("diffsmooth", 0.5, m=3, local_sigma=0.12)
    assert config.purifier == OneShotPurifier() and config.head == LocalSmoothingHead(m=3, local_sigma=0.12)
    dense = MethodConfig("densepure", 0.25, options={"reverse_runs": 6, "steps": 3})
    assert dense.purifier == ReverseChainsPurifier(reverse_runs=6, steps=3) and dense.head == MajorityVoteHead()
    assert dense.purifier.unet_calls() == 18 and dense.head.classifier_calls(dense.purifier.copies) == 6


@needs_demo
def test_the_api_composes_configured_parts_into_the_method_that_pairs_them():
    denoiser, classifier = load_demo_denoiser(), load_demo_classifier(0.25)
    composed = SmoothedClassifier(purifier=OneShotPurifier(), head=LocalSmoothingHead(m=2, local_sigma=0.25),
                                  classifier=classifier, denoiser=denoiser, sigma=0.5)
    own = DiffSmooth(classifier=classifier, denoiser=denoiser, sigma=0.5, m=2, local_sigma=0.25)
    assert composed.config == own.config and composed.method == "diffsmooth"
    data = load_dataset("embedded")
    images = [data[i][0] for i in range(6)]
    a = [composed.predict(x, n=20, image_index=i) for i, x in enumerate(images)]
    b = [own.predict(x, n=20, image_index=i) for i, x in enumerate(images)]
    assert a == b and len(set(a)) >= 2, (a, b)               # the same votes, over several classes
    with pytest.raises(UserError, match=r"^purifier OneShotPurifier and head MajorityVoteHead: no registered method"):
        SmoothedClassifier(purifier=OneShotPurifier(), head=MajorityVoteHead(), classifier=classifier,
                           denoiser=denoiser, sigma=0.5)
    with pytest.raises(UserError, match=r"^head LogitsHead: diffsmooth pairs LocalSmoothingHead"):
        DiffSmooth(head=LogitsHead(), classifier=classifier, denoiser=denoiser, sigma=0.5)
    with pytest.raises(UserError, match=r"^give the settings in the parts, not beside them: m"):
        DiffSmooth(head=LocalSmoothingHead(), m=3, classifier=classifier, denoiser=denoiser, sigma=0.5)

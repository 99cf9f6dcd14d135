"""The Python API owns what it runs: building and running `DiffSmooth` / `RandomizedSmoothing` never change
the caller's modules; every path (eager, compiled) refuses once the caller's weights changed, and a run
refuses counts read after its own weights changed under it. Tiny models (tests/stage_fixtures.py): a
compiled RS object compiles a small conv net only."""

import pytest
import torch
from stage_fixtures import build_tiny_stages, image, spread_classifier

from diffsmooth import DiffSmooth, RandomizedSmoothing
from diffsmooth.engine.certify.monte_carlo import WeightsChanged
from diffsmooth.engine.errors import UserError

IMAGES = [(i, image(i)) for i in range(6)]
CERTIFY = dict(n0=10, n=60, alpha=0.001)


def tiny_models():
    """A fresh (denoiser, classifier) pair: the same weights on every call."""
    _, denoiser, _ = build_tiny_stages()
    return denoiser, spread_classifier(2)


def build(path: str, denoiser, classifier):
    """The object of one path: eager DiffSmooth (fresh local noise, m = 3) or compiled RS on the CPU."""
    if path == "eager":
        return DiffSmooth(denoiser=denoiser, classifier=classifier, sigma=0.5, local_sigma=0.25, m=3,
                          local_noise="fresh", batch=32)
    return RandomizedSmoothing(classifier=classifier, sigma=0.5, compile=True, batch=32)


def state(module: torch.nn.Module) -> dict:
    """Everything building an object could change: each tensor's storage, version, dtype, device,
    layout and value, and each submodule's train/eval mode."""
    tensors = {name: (t.data_ptr(), t._version, t.dtype, t.device, t.stride(), t.detach().clone())
               for name, t in [*module.named_parameters(), *module.named_buffers()]}
    return {"tensors": tensors, "modes": [m.training for m in module.modules()]}


def assert_same_state(a: dict, b: dict) -> None:
    assert a["modes"] == b["modes"]
    assert a["tensors"].keys() == b["tensors"].keys()
    for name, (*marks, value) in a["tensors"].items():
        *other, other_value = b["tensors"][name]
        assert marks == other, name
        assert torch.equal(value, other_value), name


def certificates(model, images=IMAGES):
    return [model.certify(x, **CERTIFY, image_index=i) for i, x in images]


def assert_spread(certs) -> None:
    predictions = {c.prediction for c in certs} - {-1}
    assert len(predictions) >= 3, f"predictions do not spread: {[c.prediction for c in certs]}"


@pytest.mark.parametrize("path", ["eager", "compiled"])
def test_building_and_running_never_change_the_callers_modules(path):
    """Modules in train mode stay in train mode, on their device, in their dtype and storage, with their
    values and version counters, after an object is built from them and certifies."""
    denoiser, classifier = tiny_models()
    denoiser.train(), classifier.train()
    before = state(denoiser), state(classifier)
    model = build(path, denoiser, classifier)
    certificates(model, IMAGES[:2])
    assert_same_state(before[0], state(denoiser))
    assert_same_state(before[1], state(classifier))
    assert not model.classifier.training and model.classifier is not classifier


def _in_place(denoiser, classifier):
    with torch.no_grad():
        classifier[3].weight.mul_(1.5)


def _re_allocated(denoiser, classifier):
    classifier[0].weight = torch.nn.Parameter(classifier[0].weight.detach().flip(0).clone())


def _loaded(denoiser, classifier):
    classifier.load_state_dict(spread_classifier(7).state_dict())


def _cast(denoiser, classifier):
    classifier.double()


def _denoiser_trained(denoiser, classifier):
    with torch.no_grad():
        next(denoiser.parameters()).add_(0.01)


CHANGES = {"in place": _in_place, "re-allocated": _re_allocated, "loaded": _loaded, "cast": _cast,
           "denoiser written": _denoiser_trained}


# the compiled path here is RS, which holds no denoiser: a change to the denoiser is the eager path's case alone
CHANGE_CASES = [(path, change) for path in ("eager", "compiled") for change in CHANGES
                if not (path == "compiled" and change == "denoiser written")]


@pytest.mark.parametrize("path,change", CHANGE_CASES)
def test_every_path_refuses_once_the_callers_weights_changed(path, change):
    """After the caller changes the weights of a module an object was built from, its next call refuses
    with one line naming the module and what changed; the certificates before the change are those of
    a fresh object (which the change did not reach)."""
    denoiser, classifier = tiny_models()
    model = build(path, denoiser, classifier)
    first = certificates(model, IMAGES[:1])
    CHANGES[change](denoiser, classifier)
    with pytest.raises(UserError, match="changed after it was built") as refused:
        model.certify(IMAGES[1][1], **CERTIFY, image_index=IMAGES[1][0])
    assert "\n" not in str(refused.value) and ("classifier" in str(refused.value) or "denoiser" in str(refused.value))
    assert first == certificates(build(path, *tiny_models()), IMAGES[:1])


@pytest.mark.parametrize("path", ["eager", "compiled"])
def test_a_change_that_keeps_the_values_is_allowed(path):
    """Loading the same weights again (new version counters) leaves the object certifying as before."""
    denoiser, classifier = tiny_models()
    model = build(path, denoiser, classifier)
    first = certificates(model, IMAGES[:2])
    classifier.load_state_dict(spread_classifier(2).state_dict())
    classifier[0].weight = torch.nn.Parameter(classifier[0].weight.detach().clone())
    assert certificates(model, IMAGES[:2]) == first


def test_two_objects_from_one_module_certify_as_fresh_ones():
    """An eager and a compiled object built from one classifier, called in turn, each give the
    certificates an object of its own (built from fresh modules) gives; the predictions spread."""
    _, classifier = tiny_models()
    settings = dict(sigma=0.12, batch=32)           # the tiny classifier's votes spread over classes at this sigma
    spread = dict(n0=20, n=200, alpha=0.01)
    eager = RandomizedSmoothing(classifier=classifier, **settings)
    compiled = RandomizedSmoothing(classifier=classifier, compile=True, **settings)
    mixed = {"eager": [], "compiled": []}
    for i, x in IMAGES:
        mixed["eager"].append(eager.certify(x, **spread, image_index=i))
        mixed["compiled"].append(compiled.certify(x, **spread, image_index=i))
    for path, fresh in (("eager", RandomizedSmoothing(classifier=spread_classifier(2), **settings)),
                        ("compiled", RandomizedSmoothing(classifier=spread_classifier(2), compile=True, **settings))):
        assert mixed[path] == [fresh.certify(x, **spread, image_index=i) for i, x in IMAGES], path
    assert_spread(mixed["eager"])


@pytest.mark.parametrize("change", ["in place", "re-allocated", "cast"])
@pytest.mark.parametrize("path", ["eager", "compiled"])
def test_weights_changed_under_a_built_object_are_refused(path, change):
    """The object's own copy changed after the build (and the compiled path's agreement check): the
    next call is refused, not counted."""
    denoiser, classifier = tiny_models()
    model = build(path, denoiser, classifier)
    certificates(model, IMAGES[:1])
    CHANGES[change](model.denoiser, model.classifier)
    with pytest.raises(WeightsChanged, match="changed under a checked run"):
        model.certify(IMAGES[1][1], **CERTIFY, image_index=IMAGES[1][0])


class Dataset:
    """A dataset of the tiny images, labels = their index."""

    def __getitem__(self, i):
        return IMAGES[i][1], i

    def __len__(self):
        return len(IMAGES)


def test_a_run_keeps_the_rows_before_its_weights_changed_and_refuses_the_rest(tmp_path):
    """Weights written in place in the middle of a sealed run (in the third image's first batch): the run
    stops with WeightsChanged; the rows written before equal a clean run's, and none comes after."""
    from diffsmooth.engine.backends.torch.runner import TorchRunner
    from diffsmooth.engine.base_classifier.local_smoothing import LogitsModule
    from diffsmooth.engine.certify.monte_carlo import MonteCarloPipeline
    from diffsmooth.engine.runs.dataset_run import Images as RunImages
    from diffsmooth.engine.runs.dataset_run import Jobs, run_dataset
    from diffsmooth.engine.runs.results import read_rows
    from diffsmooth.engine.stages.base import BaseClassifierStages

    def run(out, change_after=None):
        classifier = spread_classifier(2)
        stage = TorchRunner().stage(LogitsModule(classifier), "classifier")
        pipe = MonteCarloPipeline(BaseClassifierStages("rs", None, stage, 10), 0.12, seed=3)
        pipe.seal_weights()
        batches = []

        def hook(rows):
            batches.append(rows)
            if len(batches) == change_after:
                with torch.no_grad():
                    classifier[3].bias.add_(1.0)
        pipe.batch_hooks.append(hook)
        return run_dataset(pipe, RunImages(Dataset(), list(range(6)), batch=100, window=1, progress=False), [out],
                           Jobs("certify", 20, 200, 0.01, 0.12))

    run(tmp_path / "clean.tsv")
    clean = [{k: r[k] for k in ("idx", "predict", "radius")} for r in read_rows(tmp_path / "clean.tsv")]
    assert len({r["predict"] for r in clean} - {"-1"}) >= 3, clean
    with pytest.raises(WeightsChanged, match="written in place"):
        run(tmp_path / "changed.tsv", change_after=7)       # 20 + 200 samples at batch 100: 3 batches per image
    kept = [{k: r[k] for k in ("idx", "predict", "radius")} for r in read_rows(tmp_path / "changed.tsv")]
    assert kept == clean[:2]

"""A table's model set: a stage is built once per architecture, later runs' weights and sigma inputs
are copied into it in place, and its votes then equal a fresh build's, compiled graphs included."""

import copy

import numpy as np
import pytest
import torch
from stage_fixtures import SHAPE, build_tiny_stages, spread_classifier

from diffsmooth.engine.backends.torch.recompile_limit import compiled_graphs
from diffsmooth.engine.backends.torch.runner import TorchRunner
from diffsmooth.engine.backends.torch.stages import build_torch_stages, score_module, torch_stages
from diffsmooth.engine.base_classifier.configurations import configurations
from diffsmooth.engine.base_classifier.denoise import PRESET_SCHEDULES
from diffsmooth.engine.base_classifier.methods import MethodConfig
from diffsmooth.engine.certify.monte_carlo import MonteCarloPipeline
from diffsmooth.engine.runs.fast_path import FastPath
from diffsmooth.engine.runs.model_set import ModelSet, architecture


def other_weights(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """The same architecture with other weights."""
    other = copy.deepcopy(module)
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return other


def test_architecture_is_the_module_tree_shapes_and_attributes_not_the_weights():
    config, denoiser, classifier = build_tiny_stages()
    head = score_module(config, classifier, SHAPE)
    assert architecture(head) == architecture(score_module(config, spread_classifier(5), SHAPE))
    assert architecture(head) != architecture(score_module(MethodConfig("diffsmooth", 0.5, m=5, local_sigma=0.25,
                                                                        local_noise="fresh"), classifier, SHAPE))
    wider = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(16 * 64, 10))
    assert architecture(score_module(config, wider, SHAPE)) != architecture(head)
    # another sigma, t* and sigma' are tensors: the same architecture
    assert architecture(denoiser.purifier(0.25)) == architecture(other_weights(denoiser, 1).purifier(1.0))


def test_a_purifier_moved_to_another_sigma_in_place_denoises_as_one_built_there():
    _, denoiser, _ = build_tiny_stages()
    x = torch.rand(4, *SHAPE)
    moved = denoiser.purifier(0.25)
    buffers = {name: t.data_ptr() for name, t in moved.named_buffers()}
    moved.set_coefficients(PRESET_SCHEDULES["cifar10"].coefficients(1.0))
    with torch.no_grad():
        assert torch.equal(moved(x), denoiser.purifier(1.0)(x))
        assert not torch.equal(moved(x), denoiser.purifier(0.25)(x))
    assert {name: t.data_ptr() for name, t in moved.named_buffers()} == buffers


def test_a_stage_of_a_held_architecture_is_handed_back_with_the_new_weights_in_place():
    config, _, classifier = build_tiny_stages()
    models = ModelSet()
    backend = models.backend(TorchRunner())
    first = backend.stage(score_module(config, classifier, SHAPE), "classifier")
    pointers = [p.data_ptr() for p in first.module.parameters()]
    other = other_weights(classifier, 3)
    again = backend.stage(score_module(MethodConfig("diffsmooth", 1.0, m=3, local_sigma=0.5, local_noise="fresh"),
                                       other, SHAPE), "classifier")
    assert again is first and (models.builds, models.reuses) == (1, 1)
    assert [p.data_ptr() for p in first.module.parameters()] == pointers      # what CUDA graphs replay from
    assert float(first.module.local_sigma) == 0.5
    x, noise = torch.rand(2, *SHAPE), torch.randn(2, 3, *SHAPE)
    with torch.no_grad():
        expected = score_module(MethodConfig("diffsmooth", 1.0, m=3, local_sigma=0.5, local_noise="fresh"),
                                other, SHAPE)(x, noise)
    assert torch.equal(first(x, noise), expected)
    different = backend.stage(score_module(MethodConfig("diffsmooth", 1.0, m=5, local_sigma=0.5, local_noise="fresh"),
                                           other, SHAPE), "classifier")
    assert different is not first and models.builds == 2


# The compiled tests build their stages as test_fast_path.py's compiled test does (fused attention, static batches of
# 32): the same graphs, so in one run inductor's FX graph cache compiles each once (the votes are those of the
# UNet either way: fused attention is the same maths).
COMPILED_BATCH = 32


def _votes(stages, sigma: float, x: torch.Tensor) -> np.ndarray:
    pipeline = MonteCarloPipeline(stages, sigma, seed=3, static_batch=True)
    return pipeline.count(x, 11, 0, 256, COMPILED_BATCH)[0]


@pytest.mark.slow
def test_compiled_stages_reused_at_another_sigma_vote_as_a_fresh_build_without_recompiling():
    """sigma 0.5 then 1.0 (t*, scale factors, sigma' 0.25 -> 0.5, other UNet and classifier weights):
    the reused compiled stages compile nothing new and count the same votes as stages built at 1.0."""
    torch.set_num_threads(1)
    config, denoiser, classifier = build_tiny_stages()
    at_one = MethodConfig("diffsmooth", 1.0, m=3, local_sigma=0.5, local_noise="fresh")
    denoiser_b, classifier_b = other_weights(denoiser, 1), other_weights(classifier, 2)
    x = torch.rand(*SHAPE)
    models = ModelSet()

    def stages(cfg, den, clf, model_set):
        runner = TorchRunner(compile=True)
        runner = model_set.backend(runner) if model_set is not None else runner
        return build_torch_stages(cfg, clf, den, runner, SHAPE, fast=FastPath(fused_attention=True))

    first = stages(config, denoiser, classifier, models)
    votes_first = _votes(first, 0.5, x)
    graphs = compiled_graphs()
    reused = stages(at_one, denoiser_b, classifier_b, models)
    assert reused.purify is first.purify and reused.score is first.score and models.builds == 2
    votes_reused = _votes(reused, 1.0, x)
    assert compiled_graphs() == graphs, "the reused stages compiled again"
    fresh = stages(at_one, copy.deepcopy(denoiser_b), copy.deepcopy(classifier_b), None)
    votes_fresh = _votes(fresh, 1.0, x)
    assert (votes_fresh > 0).sum() >= 3, votes_fresh          # votes spread over several classes
    assert np.array_equal(votes_reused, votes_fresh), (votes_reused, votes_fresh)
    assert not np.array_equal(votes_first, votes_fresh)      # the weights and sigma matter to the votes


@pytest.mark.slow
def test_a_classifier_stage_shared_by_rs_and_dds_compiles_one_graph():
    """RS feeds the classifier stage noisy samples, DDS the purifier's output: both are inference
    tensors, so dynamo's guards pass and the shared stage compiles once (purifier + classifier: 2)."""
    torch.set_num_threads(1)
    torch._dynamo.reset()               # as a new process: no graph of an earlier test serves these stages
    _, denoiser, classifier = build_tiny_stages()
    models, x = ModelSet(), torch.rand(*SHAPE)
    for method in ("rs", "dds"):
        stages = build_torch_stages(MethodConfig(method, 0.5), classifier, denoiser,
                                    models.backend(TorchRunner(compile=True)), SHAPE,
                                    fast=FastPath(fused_attention=True))
        _votes(stages, 0.5, x)
    assert (models.builds, models.compiles) == (2, 2)


def test_a_sweeps_stages_serve_every_sigma_and_sigma_prime_and_vote_as_a_fresh_build():
    """A sweep's score stage holds each sigma' as a buffer and names no sigma, sigma' or file (its plan
    is indices and m), so another sigma with other sigma' values and weights reuses the built stage,
    like the purifier, and counts the votes of stages built for that sigma."""
    torch.set_num_threads(1)
    _, denoiser, classifier = build_tiny_stages()
    classifier_b = other_weights(classifier, 2)
    models = ModelSet()

    def sweep(sigma, local_sigmas, clf, model_set):
        configs = configurations(["dds", "diffsmooth"], sigma,
                                 lambda method: {"local_sigma": list(local_sigmas), "m": [1, 3]}, lambda config: ["c"])
        runner = model_set.backend(TorchRunner()) if model_set is not None else TorchRunner()
        return torch_stages(configs, {"c": copy.deepcopy(clf)}, other_weights(denoiser, 1), runner, SHAPE)

    x = torch.rand(*SHAPE)
    first = sweep(0.25, [0.25, 0.5], classifier, models)
    votes_first = _votes_all(first, 0.25, x)
    second = sweep(0.5, [0.12, 0.5], classifier_b, models)
    assert second.purify is first.purify and second.score is first.score and models.builds == 2
    fresh = sweep(0.5, [0.12, 0.5], classifier_b, None)
    votes_reused, votes_fresh = _votes_all(second, 0.5, x), _votes_all(fresh, 0.5, x)
    assert votes_fresh.shape[0] == 5 and (votes_fresh > 0).sum(axis=1).min() >= 2, votes_fresh   # votes spread
    assert np.array_equal(votes_reused, votes_fresh), (votes_reused, votes_fresh)
    assert not np.array_equal(votes_first, votes_fresh)
    # another set of configurations (other m) is another plan: built anew
    one = configurations(["diffsmooth"], 0.5, lambda method: {"local_sigma": 0.25, "m": 1}, lambda config: ["c"])
    other = torch_stages(one, {"c": classifier}, other_weights(denoiser, 1), models.backend(TorchRunner()), SHAPE)
    assert other.score is not first.score and models.builds == 3


def _votes_all(stages, sigma: float, x: torch.Tensor) -> np.ndarray:
    """Every configuration's vote counts [E, K]."""
    return MonteCarloPipeline(stages, sigma, seed=3, static_batch=True).count(x, 11, 0, 256, 64)


def test_a_diffusers_purifier_is_built_once_and_moved_to_the_next_sigma(tmp_path):
    """diffusers' attention modules hold a processor object without state; two loads of one folder are one
    architecture, so a table builds the diffusers UNet once and the moved purifier denoises as a fresh one."""
    pytest.importorskip("diffusers")
    from diffusers import DDPMScheduler
    from diffusers_fixtures import save_pipeline, tiny_unet

    from diffsmooth.engine.base_classifier.denoise import load_denoiser
    folder = save_pipeline(tmp_path / "ddpm", tiny_unet(0), DDPMScheduler())
    models = ModelSet()
    backend = models.backend(TorchRunner())
    first = backend.stage(load_denoiser(folder).purifier(0.25), "denoiser")
    again = backend.stage(load_denoiser(folder).purifier(1.0), "denoiser")
    assert again is first and (models.builds, models.reuses) == (1, 1)
    x = torch.rand(2, 3, 8, 8)
    with torch.no_grad():
        assert torch.equal(first(x), load_denoiser(folder).purifier(1.0)(x))
        assert not torch.equal(first(x), load_denoiser(folder).purifier(0.25)(x))
    other = backend.stage(load_denoiser(save_pipeline(tmp_path / "wide", tiny_unet(1, block_out_channels=(8, 24)),
                                                      DDPMScheduler())).purifier(1.0), "denoiser")
    assert other is not first and models.builds == 2

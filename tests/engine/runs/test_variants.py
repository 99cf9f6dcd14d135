"""Issue 45's fast-path variants on CPU: the options end to end (CLI -> RunRequest -> FastPath -> stages and
pipeline), recorded only when on, refused in one line where they cannot apply; rows identical where the
maths is unchanged; the classifier's own batch; compile modes and inductor knobs (slow: inductor on CPU)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from cli_helpers import invoke_ok, rows_without_time
from stage_fixtures import SHAPE, build_tiny_stages, image, make_pipeline

from diffsmooth.engine.backends.torch.compile_options import Compilation, compile_options, parse_inductor_knobs
from diffsmooth.engine.backends.torch.runner import TorchRunner
from diffsmooth.engine.backends.torch.stages import build_torch_stages, score_module
from diffsmooth.engine.base_classifier.methods import MethodConfig
from diffsmooth.engine.certify.monte_carlo import MonteCarloPipeline, initial_score_chunks
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.runs.fast_path import FastPath
from diffsmooth.engine.runs.fast_path_options import OPTIONAL_KEYS
from diffsmooth.engine.runs.model_set import ModelSet
from diffsmooth.engine.runs.request import RunRequest


def test_each_variant_is_off_and_unrecorded_by_default_and_recorded_when_on():
    for device in ("cpu", "cuda"):
        fast = FastPath.resolve(device)
        assert not fast.lean_unet and fast.compile_mode is None and fast.inductor == () and \
            fast.classifier_batch is None and not fast.triton_conv
        assert not set(fast.as_dict()) & (set(OPTIONAL_KEYS) - {"fused_attention"})
    on = FastPath.resolve("cpu", compile=True, lean_unet=True, compile_mode="max-autotune-no-cudagraphs",
                          inductor="freezing,coordinate-descent", classifier_batch=40)
    recorded = on.as_dict()
    assert recorded["lean_unet"] is True and recorded["compile_mode"] == "max-autotune-no-cudagraphs"
    assert recorded["inductor"] == ["coordinate-descent", "freezing"] and recorded["classifier_batch"] == 40
    json.dumps(recorded)
    assert FastPath.resolve("cpu", lean_unet=True).changes_arithmetic
    assert not FastPath.resolve("cpu", classifier_batch=8).changes_arithmetic
    assert FastPath.resolve("cpu", compile=True, compile_mode="default").compile_mode is None


@pytest.mark.parametrize("kwargs, message", [
    ({"compile_mode": "max-autotune-no-cudagraphs"}, "need `compile`"),
    ({"inductor": "freezing"}, "need `compile`"),
    ({"compile": True, "compile_mode": "reduce-overhead"}, "captures its own"),
    ({"compile": True, "inductor": "turbo"}, "unknown inductor knob"),
    ({"compile": True, "inductor": "freezing,freezing"}, "names a knob twice"),
    ({"classifier_batch": 0}, "classifier_batch"),
    ({"fused_conv": True, "triton_conv": True}, "pick one"),
    ({"triton_blocks": True}, "needs `triton_conv`"),
    ({"backend": "onnxruntime", "lean_unet": True}, "torch backend"),
    ({"backend": "tensorrt", "classifier_batch": 4}, "torch backend"),
])
def test_settings_that_cannot_apply_are_refused_in_one_line(kwargs, message):
    with pytest.raises(UserError, match=message) as info:
        FastPath.resolve("cpu", **kwargs)
    assert "\n" not in str(info.value)


def test_compile_options_are_torch_default_unless_asked():
    assert compile_options(None) is None and compile_options("default") is None
    options = compile_options("max-autotune-no-cudagraphs", ("freezing",))
    assert options["max_autotune"] is True and options["freezing"] is True and options["triton.cudagraphs"] is False
    assert compile_options(None, ("no-epilogue-fusion",)) == {"epilogue_fusion": False}
    assert parse_inductor_knobs("freezing, coordinate-descent") == ("coordinate-descent", "freezing")
    stage = TorchRunner(compile=True, compilation=Compilation(inductor=("coordinate-descent",))).stage(
        torch.nn.Identity(), "x")
    assert stage.options == {"coordinate_descent_tuning": True}
    assert TorchRunner(compile=True).stage(torch.nn.Identity(), "x").options is None


def test_run_request_parses_and_checks_the_variant_options():
    request = RunRequest.parse("certify", out="x.tsv", inductor="freezing", compile_mode="max-autotune-no-cudagraphs",
                               lean_unet=True, classifier_batch=10)
    assert request.asked_fast_path.inductor == ("freezing",) and request.asked_fast_path.lean_unet is True
    with pytest.raises(UserError, match="classifier_batch"):
        RunRequest.parse("certify", out="x.tsv", classifier_batch=0)
    with pytest.raises(UserError, match="lean_unet"):
        RunRequest.parse("certify", out="x.tsv", lean_unet="yes")
    with pytest.raises(UserError, match="triton_conv` is for single configurations"):
        RunRequest.parse("certify", out="x.tsv", triton_conv=True, m=[3, 5])


# -- the classifier's own batch ----------------------------------------------------------------------

def test_classifier_batch_sets_the_calls_and_leaves_the_counts_alone(tiny_stages):
    assert initial_score_chunks(48, 3, 192, torch.device("cpu"), most=7) == 8       # 6 samples per call
    assert initial_score_chunks(48, 3, 192, torch.device("cpu"), most=48) == 1
    assert initial_score_chunks(47, 3, 192, torch.device("cpu"), most=10) == 47       # a prime: one at a time
    whole = make_pipeline(tiny_stages)
    split = make_pipeline(tiny_stages, classifier_batch=7)
    calls = []
    inner = split.stages.score

    class Recording:
        name, device, precision = inner.name, inner.device, inner.precision

        def __call__(self, *inputs):
            calls.append(inputs[0].shape[0])
            return inner(*inputs)

    split.stages.score = Recording()
    x = image(5)
    counts = whole.count(x, 2, 0, 48, 48)
    assert (counts > 0).sum() >= 2
    np.testing.assert_array_equal(split.count(x, 2, 0, 48, 48), counts)
    assert set(calls) == {6} and len(calls) == 8


def test_classifier_batch_reaches_the_fused_conv_probe_shape():
    from diffsmooth.engine.runs.assemble import classifier_call_images
    config = MethodConfig("diffsmooth", 0.5, m=5, local_sigma=0.25)
    assert classifier_call_images(config, 2000, (3, 32, 32), "cpu") == 10000
    assert classifier_call_images(config, 2000, (3, 32, 32), "cpu", classifier_batch=400) == 2000


# -- a table's model set -------------------------------------------------------------------------------

def test_a_frozen_compile_never_reuses_a_held_stage():
    """Frozen graphs hold the weights they were compiled with: weights copied in would never reach them."""
    config, _, classifier = build_tiny_stages()
    models = ModelSet()
    backend = models.backend(TorchRunner(compile=True, compilation=Compilation(inductor=("freezing",))))
    first = backend.stage(score_module(config, classifier, SHAPE), "classifier")
    again = backend.stage(score_module(config, classifier, SHAPE), "classifier")
    assert again is not first and (models.builds, models.reuses) == (2, 0)
    plain = ModelSet()
    reusing = plain.backend(TorchRunner(compile=True))
    assert reusing.stage(score_module(config, classifier, SHAPE), "c") is \
        reusing.stage(score_module(config, classifier, SHAPE), "c")


def test_a_held_lean_purifier_takes_another_unets_weights_like_a_fresh_one():
    from test_model_set import other_weights
    _, denoiser, _ = build_tiny_stages()
    models = ModelSet()
    backend = models.backend(TorchRunner())
    held = backend.stage(denoiser.purifier(0.25, lean=True), "denoiser")
    other = other_weights(denoiser, 4)
    again = backend.stage(other.purifier(0.5, lean=True), "denoiser")
    assert again is held and models.reuses == 1
    x = torch.rand(4, *SHAPE)
    with torch.no_grad():
        assert torch.equal(held(x), other.purifier(0.5, lean=True)(x))


# -- the command line: rows equal where the maths is unchanged ---------------------------------------

@pytest.mark.parametrize("variant", [["--lean-unet"], ["--classifier-batch", "3"]])
def test_certify_rows_are_identical_with_the_variant(tmp_path, tiny_cli_args, variant):
    base = ["certify", *tiny_cli_args, "--method", "diffsmooth", "--m", "3", "--local-noise", "fresh",
            "--n0", "10", "--n", "40", "--batch", "12", "--max", "4", "--threads", "1", "--quiet"]
    invoke_ok([*base, "--out", tmp_path / "default.tsv"])
    invoke_ok([*base, *variant, "--validate-samples", "24", "--validate-images", "1", "--out", tmp_path / "variant.tsv"])
    default = rows_without_time(tmp_path / "default.tsv")
    assert len({r["predict"] for r in default}) >= 2
    assert rows_without_time(tmp_path / "variant.tsv") == default
    recorded = json.loads((tmp_path / "variant.tsv.settings.json").read_text())["fast_path"]
    assert ("lean_unet" in recorded) == (variant[0] == "--lean-unet")
    assert ("classifier_batch" in recorded) == (variant[0] == "--classifier-batch")


def test_the_demo_rows_are_identical_with_the_lean_unet(tmp_path):
    base = ["certify", "--dataset", "embedded", "--method", "diffsmooth", "--sigma", "0.5", "--n0", "10", "--n", "50",
            "--max", "30", "--skip", "10", "--batch", "30", "--threads", "1", "--quiet"]
    invoke_ok([*base, "--out", tmp_path / "default.tsv"])
    invoke_ok([*base, "--lean-unet", "--validate-samples", "40", "--validate-images", "1", "--out", tmp_path / "lean.tsv"])
    default = rows_without_time(tmp_path / "default.tsv")
    assert len(default) == 3 and len({r["radius"] for r in default}) >= 2
    assert rows_without_time(tmp_path / "lean.tsv") == default


def test_certify_refuses_a_compile_mode_without_compile_in_one_line(tmp_path, tiny_cli_args):
    from click.testing import CliRunner

    from diffsmooth.cli import main
    result = CliRunner().invoke(main, ["certify", *tiny_cli_args, "--inductor", "freezing", "--quiet",
                                       "--out", str(tmp_path / "x.tsv")])
    assert result.exit_code != 0 and "need --compile" in result.output
    assert "Traceback" not in result.output


# -- compiled CPU stages under each setting (inductor's C++ backend) ------------------------------------

@pytest.fixture(scope="module")
def bn_resnet():
    """A BatchNorm ResNet (what freezing folds) with randomised statistics: the depth-8 CIFAR ResNet, every kind of
    layer of the demo's ResNet-20 at a fraction of its compile time."""
    from stage_fixtures import RESNET8, randomized_bn_resnet
    return randomized_bn_resnet(RESNET8, seed=3)


SWEEP = pytest.mark.skipif(os.environ.get("DIFFSMOOTH_COMPILE_SWEEP") != "1",
                           reason="one more inductor compile (up to minutes on 2 cores): set DIFFSMOOTH_COMPILE_SWEEP=1; "
                                  "the freezing compile runs always")


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("mode, knobs", [(None, ("freezing",)),
                                         pytest.param(None, ("coordinate-descent",), marks=SWEEP),
                                         pytest.param("max-autotune-no-cudagraphs", (), marks=SWEEP),
                                         pytest.param(None, ("no-epilogue-fusion", "epilogue-fusion-first"), marks=SWEEP)])
def test_a_compiled_classifier_stage_under_each_setting_votes_like_eager(bn_resnet, mode, knobs):
    """The local-smoothing classifier stage (m=5) on a BatchNorm ResNet (what freezing folds), compiled on CPU,
    scores 8 images as eager does; the images' votes spread."""
    config = MethodConfig("diffsmooth", 0.5, m=5, local_sigma=0.25)
    denoised = torch.stack([image(i) for i in range(8)])           # the classifier stage's inputs: 8 images
    eager = TorchRunner().stage(score_module(config, bn_resnet, SHAPE), "eager")(denoised)
    stage = TorchRunner(compile=True, compilation=Compilation(mode, knobs)).stage(
        score_module(config, bn_resnet, SHAPE), "compiled")
    compiled = stage(denoised)
    assert stage.compiled and stage.options == compile_options(mode, knobs)
    assert len(set(eager.argmax(-1).tolist())) >= 3
    assert torch.equal(compiled.argmax(-1), eager.argmax(-1))
    assert float((compiled - eager).abs().max()) < 1e-4


# The smallest UNet the lean path runs through: one level, one residual block (the middle block's attention
# only), learned sigma (the lean copy drops the variance filters), every block reading t*'s time embedding.
# Its inductor compile costs about 60% of the tests' tiny UNet's, which has nothing more the lean path touches.
LEANEST_UNET = {"image_size": 8, "model_channels": 32, "num_res_blocks": 1, "channel_mult": [1],
                "attention_resolutions": [], "dropout": 0.0}


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_a_compiled_lean_purifier_follows_set_coefficients():
    """Compiled, the lean purifier's batch-1 time embedding is read from the t* buffer at run time."""
    from tiny_fixtures import random_unet

    from diffsmooth.engine.base_classifier.denoise import PRESET_SCHEDULES, DiffusionDenoiser
    unet = random_unet(**LEANEST_UNET)
    denoiser = DiffusionDenoiser(unet, PRESET_SCHEDULES["cifar10"])
    assert unet.config.learn_sigma
    stage = TorchRunner(compile=True).stage(denoiser.purifier(0.25, lean=True), "denoiser")
    assert stage.compiled
    x = torch.rand(8, *SHAPE, generator=torch.Generator().manual_seed(1))
    at_quarter = stage(x)
    stage.module._orig_mod.set_coefficients(denoiser.schedule.coefficients(0.5))
    with torch.inference_mode():
        expected = denoiser.purifier(0.5)(x)
        assert float((at_quarter - denoiser.purifier(0.25)(x)).abs().max()) < 1e-5
        assert float((expected - denoiser.purifier(0.25)(x)).abs().max()) > 1e-2      # sigma matters to the output
    assert float((stage(x) - expected).abs().max()) < 1e-5


def test_stages_built_with_every_cpu_variant_vote_like_the_default(tiny_stages):
    config, denoiser, classifier = tiny_stages
    stages = build_torch_stages(config, classifier, denoiser, TorchRunner(), SHAPE, 10, FastPath(lean_unet=True))
    variant = MonteCarloPipeline(stages, config.sigma, seed=3, classifier_batch=5)
    x = image(7)
    np.testing.assert_array_equal(variant.count(x, 1, 0, 120, 40), make_pipeline(tiny_stages).count(x, 1, 0, 120, 40))


# -- the Triton convolution (engine/models/triton_conv.py) ----------------------------------------------

def test_triton_conv_is_refused_in_one_line_where_the_kernel_cannot_run(tmp_path, tiny_stages, tiny_cli_args):
    from diffsmooth.engine.models import triton_conv
    if triton_conv.triton_conv_unavailable("cpu") is None:
        pytest.skip("this process runs the Triton interpreter")
    from stage_fixtures import randomized_bn_resnet
    config, denoiser, _ = tiny_stages
    with pytest.raises(UserError, match="`triton_conv` cannot run here: ") as info:
        build_torch_stages(config, randomized_bn_resnet("cifar_resnet20"), denoiser, TorchRunner(), SHAPE, 10,
                           FastPath(triton_conv=True))
    assert "\n" not in str(info.value)
    from click.testing import CliRunner

    from diffsmooth.cli import main
    result = CliRunner().invoke(main, ["certify", *tiny_cli_args, "--triton-conv", "--quiet",
                                       "--out", str(tmp_path / "x.tsv")])
    assert result.exit_code != 0 and "cannot run here" in result.output and "Traceback" not in result.output
    assert FastPath.resolve("cpu", triton_conv=True).as_dict()["triton_conv"] is True


TRITON_SCRIPT = """
import json
import torch
from stage_fixtures import RESNET8, SHAPE, build_tiny_stages, image, make_pipeline, randomized_bn_resnet
from diffsmooth.engine.backends.torch.runner import TorchRunner
from diffsmooth.engine.backends.torch.stages import build_torch_stages
from diffsmooth.engine.certify.monte_carlo import MonteCarloPipeline
from diffsmooth.engine.models import triton_conv
from diffsmooth.engine.models.folded_resnet import FoldedConv, fold_classifier
from diffsmooth.engine.models.resnet import BasicBlock
from diffsmooth.engine.runs.fast_path import FastPath
torch.set_num_threads(1)                 # tiny tensors; the interpreter is single-threaded Python
tiny = build_tiny_stages()
config, denoiser, _ = tiny
# The smallest CIFAR ResNet with every kind of call: depth 8, one block per stage (the RGB stem, 3x3 stride 1
# and 2, 1x1 stride-2 shortcuts, one stride-1 identity block), randomised BatchNorm; its votes spread here.
resnet = randomized_bn_resnet(RESNET8, seed=3)
convs = [m for m in fold_classifier(resnet).modules() if isinstance(m, FoldedConv)]
x = image(1)


def recorded(pipeline):                  # the pipeline, its score stage's outputs (mean softmax over m) kept
    inner, seen = pipeline.stages.score, []

    class Recording:
        name, device, precision = inner.name, inner.device, inner.precision

        def __call__(self, *inputs):
            seen.append(inner(*inputs))
            return seen[-1]
    pipeline.stages.score = Recording()
    return pipeline, seen


reference, reference_scores = recorded(make_pipeline(tiny, classifier=resnet))
out = {"interpreted": triton_conv._INTERPRETED, "reference": reference.count(x, 0, 0, 4, 4).tolist(),
       "convs_per_pass": len(convs), "kinds": sorted({(m.weight.shape[-1], m.stride) for m in convs}),
       "stem_channels": convs[0].weight.shape[1],
       "identity_blocks": sum(isinstance(b, BasicBlock) and b.downsample is None for b in resnet.modules())}
for blocks in (False, True):
    stages = build_torch_stages(config, resnet, denoiser, TorchRunner(), SHAPE, 10,
                                FastPath(triton_conv=True, triton_blocks=blocks))
    before, blocks_before = triton_conv.TRITON_CALLS["count"], triton_conv.TRITON_BLOCK_CALLS["count"]
    pipeline, scores = recorded(MonteCarloPipeline(stages, config.sigma, seed=3))
    got = pipeline.count(x, 0, 0, 4, 4)
    out["blocks" if blocks else "convs"] = {
        "counts": got.tolist(), "calls": triton_conv.TRITON_CALLS["count"] - before,
        "block_calls": triton_conv.TRITON_BLOCK_CALLS["count"] - blocks_before,
        "score_diff": float((torch.cat(scores) - torch.cat(reference_scores)).abs().max()),
        "score_shape": list(torch.cat(scores).shape)}
print("RESULT " + json.dumps(out))
"""


@pytest.mark.slow
def test_triton_conv_stages_vote_like_the_unfolded_classifier_under_the_interpreter():
    """--triton-conv's stages end to end with the kernel itself run by Triton's interpreter on the CPU
    (TRITON_INTERPRET=1 before the import, hence a child process): the same counts and the same local-smoothing
    probabilities as the unfolded ResNet, per convolution and with the identity blocks fused. The network is
    a depth-8 CIFAR ResNet (every kind of call the kernels take: the RGB stem, 3x3 stride 1 and 2, the 1x1
    stride-2 shortcut, a stride-1 identity block), one batch of 4 samples (12 classifier images): the
    interpreter's cost is per program, and each kernel's numbers are checked in test_triton_conv.py."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from diffsmooth.engine.models import triton_conv
    if triton_conv.triton is None:
        pytest.skip(f"triton is not importable ({triton_conv._TRITON_ERROR})")
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(root), str(root / "tests"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", TRITON_SCRIPT], capture_output=True, text=True, timeout=900,
                          env=env, cwd=str(root))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert result["interpreted"] and sum(1 for c in result["reference"][0] if c) >= 3     # votes spread
    assert result["kinds"] == [[1, 2], [3, 1], [3, 2]] and result["stem_channels"] == 3   # every kind of call
    convs, blocks, n_convs = result["convs"], result["blocks"], result["convs_per_pass"]
    assert n_convs == 9 and result["identity_blocks"] == 1
    assert convs["calls"] == n_convs and convs["block_calls"] == 0       # every conv of the batch ran the kernel
    assert blocks["block_calls"] == result["identity_blocks"]             # the identity block as one kernel,
    assert blocks["calls"] == n_convs - 2 * result["identity_blocks"]     # the other convolutions per call
    assert convs["counts"] == blocks["counts"] == result["reference"]
    for path in (convs, blocks):
        assert path["score_shape"] == [4, 10] and path["score_diff"] <= 1e-5, path


def test_the_triton_check_keeps_the_kernels_only_when_they_agree_with_torch_convolutions(monkeypatch):
    """What --triton-conv runs on CUDA after its check (torch_stages.checked_triton), driven on the CPU: the reference
    is the folded network on torch's conv2d (cuDNN's runtime fusion off while it runs), a tritonized net that
    disagrees or is not finite gives way to the folded one, which then stays off cuDNN's fused kernels."""
    from stage_fixtures import randomized_bn_resnet

    from diffsmooth.engine.backends.torch.stages import checked_triton
    from diffsmooth.engine.models import folded_resnet
    from diffsmooth.engine.models.folded_resnet import fold_classifier
    from diffsmooth.engine.models.triton_conv import tritonize
    monkeypatch.setitem(folded_resnet.CUDNN_FUSION, "enabled", True)
    folded = fold_classifier(randomized_bn_resnet("cifar_resnet20"))
    seen = []

    class Recording(torch.nn.Module):
        def forward(self, x):
            seen.append(folded_resnet.CUDNN_FUSION["enabled"])
            return folded(x)

    x = torch.rand(6, *SHAPE)
    messages = []
    fast = tritonize(folded)
    assert checked_triton(fast, Recording(), x, messages.append) is fast and seen == [False]
    assert folded_resnet.CUDNN_FUSION["enabled"] and "checked at 6 images" in messages[-1]

    class Off(torch.nn.Module):
        def __init__(self, change):
            super().__init__()
            self.change = change

        def forward(self, x):
            return self.change(fast(x))

    for wrong, why in ((lambda s: s + 0.5, "disagree"), (lambda s: s * float("nan"), "NaN/Inf")):
        chosen = checked_triton(Off(wrong), folded, x, messages.append)
        assert chosen is folded and not folded_resnet.CUDNN_FUSION["enabled"] and why in messages[-1]
        folded_resnet.CUDNN_FUSION["enabled"] = True


def test_a_kernels_check_allows_what_the_runs_precision_itself_is_off_by():
    """fusion_verdict with the fp32 outputs: a kernel off fp32 by as much as torch's fp16 maths is passes even past
    the absolute term (what refused the Triton kernel and cuDNN's fusion on a random-weight ResNet-110); one far
    worse than fp16's own drift, a non-finite one or one of another shape does not; checked_triton judges
    against `exact` when given, and against the fp16 reference alone without it."""
    from diffsmooth.engine.backends.torch.stages import checked_triton
    from diffsmooth.engine.models.folded_resnet import fusion_verdict
    g = torch.Generator().manual_seed(0)
    truth = torch.randn(8, 10, generator=g)
    fp16_drift = 0.15 * torch.randn(8, 10, generator=g).clamp(-1, 1)
    reference = truth + fp16_drift
    as_good = truth - fp16_drift                            # off fp32 as much as the fp16 reference, other way
    assert float((as_good - truth).abs().max()) > 1e-2 * (1 + float(truth.abs().max())) + 0.05
    assert fusion_verdict(as_good, reference, truth) is None
    assert "disagree" in fusion_verdict(as_good, reference)                 # the absolute term alone refuses it
    assert "disagree with fp32" in fusion_verdict(truth + 4 * fp16_drift, reference, truth)
    assert "NaN" in fusion_verdict(truth * float("nan"), reference, truth)
    assert "shape" in fusion_verdict(truth[:4], reference, truth)
    assert fusion_verdict(truth, truth, truth) is None

    class Fixed(torch.nn.Module):
        def __init__(self, scores):
            super().__init__()
            self.scores = scores

        def forward(self, x):
            return self.scores

    messages = []
    fast, folded, exact = Fixed(as_good), Fixed(reference), Fixed(truth)
    assert checked_triton(fast, folded, torch.zeros(8, 3), messages.append, exact) is fast
    assert "checked at 8 images" in messages[-1]
    assert checked_triton(fast, folded, torch.zeros(8, 3), messages.append) is folded
    assert "disagree with torch's convolutions" in messages[-1]


# -- the classifier's own compile mode ------------------------------------------------------------------

def test_the_classifier_compiles_in_its_own_mode_and_the_denoiser_in_the_runs():
    """`classifier_compile_mode`: the score stage's options autotune, the purifier's stay torch's default; the
    inductor knobs reach both; a table's model set keys and reuses the classifier stage by those options."""
    config, denoiser, classifier = build_tiny_stages()
    backend = TorchRunner(compile=True, compilation=Compilation(inductor=("coordinate-descent",),
                                                                 classifier_mode="max-autotune-no-cudagraphs"))
    stages = build_torch_stages(config, classifier, denoiser, backend, SHAPE, 10)
    assert stages.purify.options == {"coordinate_descent_tuning": True}
    assert stages.score.options["max_autotune"] is True and stages.score.options["triton.cudagraphs"] is False
    assert stages.score.options["coordinate_descent_tuning"] is True
    plain = TorchRunner(compile=True)
    assert plain.for_classifier() is plain
    assert build_torch_stages(config, classifier, denoiser, plain, SHAPE, 10).score.options is None
    models = ModelSet()
    held = models.backend(backend)
    first = build_torch_stages(config, classifier, denoiser, held, SHAPE, 10)
    again = build_torch_stages(config, classifier, denoiser, held, SHAPE, 10)
    assert again.score is first.score and again.purify is first.purify and models.reuses == 2
    assert first.score.options["max_autotune"] is True
    with pytest.raises(UserError, match="need `compile`"):
        TorchRunner(compilation=Compilation(classifier_mode="max-autotune-no-cudagraphs"))
    with pytest.raises(UserError, match="compile_mode"):
        TorchRunner(compile=True, compilation=Compilation(classifier_mode="reduce-overhead"))


def test_the_classifier_compile_mode_is_recorded_when_set_and_parses_as_a_variant():
    from diffsmooth.bench.variants import parse_variant
    assert "classifier_compile_mode" not in FastPath.resolve("cuda").as_dict()
    on = FastPath.resolve("cuda", classifier_compile_mode="max-autotune-no-cudagraphs")
    assert on.as_dict()["classifier_compile_mode"] == "max-autotune-no-cudagraphs" and on.compile_mode is None
    assert FastPath.resolve("cuda", classifier_compile_mode="default").classifier_compile_mode is None
    with pytest.raises(UserError, match="need `compile`"):
        FastPath.resolve("cpu", classifier_compile_mode="max-autotune-no-cudagraphs")
    assert parse_variant("classifier-max-autotune+pack-images=2") == {
        "classifier_compile_mode": "max-autotune-no-cudagraphs", "pack_images": 2}
    with pytest.raises(UserError, match="`classifier_compile_mode` is for single configurations"):
        RunRequest.parse("certify", out="x.tsv", classifier_compile_mode="max-autotune-no-cudagraphs", m=[3, 5])

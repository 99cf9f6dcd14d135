"""ONNX export, mixed fp16, manifests, validation and the ONNX Runtime backend, with tiny random
models (a two-level 1-channel UNet and a 1-channel cifar_resnet20) on 1x32x32 images."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

ort = pytest.importorskip("onnxruntime")

from diffsmooth.engine.backends.onnxruntime.runner import OrtStage  # noqa: E402
from diffsmooth.engine.backends.onnxruntime.stages import build_onnx_stages  # noqa: E402
from diffsmooth.engine.backends.torch.runner import TorchRunner  # noqa: E402
from diffsmooth.engine.backends.torch.stages import build_torch_stages  # noqa: E402
from diffsmooth.engine.base_classifier.denoise import DiffusionDenoiser  # noqa: E402
from diffsmooth.engine.base_classifier.methods import MethodConfig  # noqa: E402
from diffsmooth.engine.base_classifier.schedule import DiffusionSchedule  # noqa: E402
from diffsmooth.engine.certify.monte_carlo import MonteCarloPipeline  # noqa: E402
from diffsmooth.engine.certify.smooth import Smooth  # noqa: E402
from diffsmooth.engine.errors import UserError  # noqa: E402
from diffsmooth.engine.hashing import sha256_file  # noqa: E402
from diffsmooth.engine.models.checkpoints import save_cohen_checkpoint, save_unet_state  # noqa: E402
from diffsmooth.engine.models.resnet import NormalizedClassifier, build_classifier_net, normalization_layer  # noqa: E402
from diffsmooth.engine.models.unet import UNetConfig, UNetModel  # noqa: E402
from diffsmooth.engine.stages.base import BaseClassifierStages  # noqa: E402
from diffsmooth.export.graph_passes import _skeleton  # noqa: E402
from diffsmooth.export.manifest import read_manifest  # noqa: E402
from diffsmooth.export.onnx_export import export_denoiser, export_models, export_unet  # noqa: E402
from diffsmooth.export.validate import ValidationFailed, validate_graphs, validation_images  # noqa: E402

SHAPE = (1, 16, 16)            # small: these CPU tests must stay fast
SIGMA = 0.5
TINY_UNET = dict(image_size=16, in_channels=1, model_channels=32, num_res_blocks=1, attention_resolutions=(8,),
                 channel_mult=(1, 2), num_heads=2, dropout=0.0, learn_sigma=True)
SAMPLES = 1000                 # validation samples (the default)
SCHEDULE = DiffusionSchedule("cosine", 4000, rescale_timesteps=True)
CONFIGS = {
    "rs": MethodConfig("rs", SIGMA),
    "dds": MethodConfig("dds", SIGMA),
    "diffsmooth-fixed": MethodConfig("diffsmooth", SIGMA, m=2, local_sigma=0.25, local_noise="fixed"),
    "diffsmooth-fresh": MethodConfig("diffsmooth", SIGMA, m=2, local_sigma=0.25, local_noise="fresh"),
}


def infer_types(model: onnx.ModelProto) -> dict:
    """Element type of every tensor (graph inputs, initializers, node outputs) by ONNX inference."""
    inferred = onnx.shape_inference.infer_shapes(_skeleton(model))
    types = {vi.name: vi.type.tensor_type.elem_type
             for vi in list(inferred.graph.input) + list(inferred.graph.value_info) + list(inferred.graph.output)
             if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type}
    return {**types, **{t.name: t.data_type for t in model.graph.initializer}}


def precision_report(model: onnx.ModelProto) -> dict:
    """{op_type: {elem type name: count}} of the first input of each node."""
    types = infer_types(model)
    out: dict = {}
    for node in model.graph.node:
        if node.input and node.input[0]:
            t = onnx.TensorProto.DataType.Name(types.get(node.input[0], 0))
            out.setdefault(node.op_type, {}).setdefault(t, 0)
            out[node.op_type][t] += 1
    return out


def tiny_unet() -> UNetModel:
    torch.manual_seed(0)
    unet = UNetModel(UNetConfig(**TINY_UNET)).eval()
    with torch.no_grad():                  # the zero-initialised output convs would make eps == 0
        for p in unet.parameters():
            if p.dim() > 1 and not p.any():
                p.normal_(0, 0.05)
    return unet


def tiny_classifier() -> NormalizedClassifier:
    """A random 1-channel cifar_resnet20 made to behave like a trained one: BatchNorm statistics
    measured on noisy real images, logits standardised so that its votes spread over the classes
    (a raw random net votes for one class only)."""
    torch.manual_seed(1)
    net = build_classifier_net("cifar_resnet20", 10, 1)
    clf = NormalizedClassifier(normalization_layer("normalize", "fashion-mnist"), net)
    x = real_images(20)
    x = torch.cat([x, (x + 0.5 * torch.randn(x.shape, generator=torch.Generator().manual_seed(3))).clamp(0, 1)])
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.reset_running_stats()
                m.momentum = None            # cumulative average over the calibration pass
        clf.train()(x)
        clf.eval()
        logits = clf(x)
        mu, sd = logits.mean(0), logits.std(0) + 1e-6
        net.fc.weight.mul_(3 / sd[:, None])
        net.fc.bias.sub_(mu).mul_(3 / sd)
    return clf


def real_images(n=3):
    """n embedded Fashion-MNIST test images, resized to SHAPE."""
    x, _, _ = validation_images(SHAPE, n)
    return x


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One thread for torch and ONNX Runtime: on a shared 2-core machine, multi-threaded kernels
    of two runtimes that alternate call by call thrash (10x slower); results do not change."""
    before = torch.get_num_threads()
    mp = pytest.MonkeyPatch()
    mp.setenv("DIFFSMOOTH_ORT_THREADS", "1")
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
    mp.undo()


@pytest.fixture(scope="module")
def models():
    return DiffusionDenoiser(tiny_unet(), SCHEDULE, channels=1), tiny_classifier()


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory, models):
    """One folder holding the graphs of every method config (fp32), plus fp16 for diffsmooth-fixed."""
    denoiser, classifier = models
    out = tmp_path_factory.mktemp("onnx")
    graphs = {}
    for name, config in CONFIGS.items():
        fp16 = name == "diffsmooth-fixed"
        graphs[name] = export_models(config, SHAPE, out, denoiser=denoiser if name == "dds" or fp16 else None,
                                     classifier=classifier, fp16=fp16)
    return out, graphs


def _graph(graphs, role, precision="fp32"):
    return next(g for g in graphs if g.role == role and g.precision == precision)


# ------------------------------------------------------------------------------------------
# Structure


def test_graphs_pass_checker_opset17_no_einsum_and_folded_timestep(export_dir):
    out, _ = export_dir
    files = sorted(out.glob("*.onnx"))
    assert len(files) == 7      # 2 denoisers (fp32, fp16), 5 classifiers (one in fp16)
    for path in files:
        onnx.checker.check_model(str(path), full_check=True)
        model = onnx.load(str(path))
        assert {o.domain: o.version for o in model.opset_import}[""] == 17
        ops = {n.op_type for n in model.graph.node}
        assert "Einsum" not in ops
        if path.name.startswith("denoiser"):
            # t* is a constant: the sinusoidal embedding and the time MLP are folded away.
            assert not ops & {"Cos", "Sin", "Gemm"}, path.name
            assert "InstanceNormalization" in ops
            if path.name.endswith("fp32.onnx"):
                assert "Cast" not in ops      # torch's no-op .float() casts are removed


def test_dynamic_batch_and_fp32_matches_torch(export_dir, models):
    denoiser, classifier = models
    _, graphs = export_dir
    den = _graph(graphs["dds"], "denoiser")
    cls = _graph(graphs["diffsmooth-fresh"], "classifier")
    purifier = denoiser.purifier(SIGMA)
    from diffsmooth.engine.backends.torch.stages import score_module
    head = score_module(CONFIGS["diffsmooth-fresh"], classifier, SHAPE)
    s_den = ort.InferenceSession(str(den.path), providers=["CPUExecutionProvider"])
    s_cls = ort.InferenceSession(str(cls.path), providers=["CPUExecutionProvider"])
    for batch in (1, 5):
        x = torch.rand(batch, *SHAPE)
        noise = torch.randn(batch, 2, *SHAPE)
        with torch.no_grad():
            ref_h, ref_p = purifier(x), head(x, noise)
        got_h = s_den.run(None, {"x_rs": x.numpy()})[0]
        got_p = s_cls.run(None, {"x": x.numpy(), "noise": noise.numpy()})[0]
        assert got_h.shape == (batch, *SHAPE) and got_p.shape == (batch, 10)
        assert np.abs(got_h - ref_h.numpy()).max() < 1e-5
        assert np.abs(got_p - ref_p.numpy()).max() < 1e-5


def test_fp16_graph_is_mixed_precision(export_dir, models):
    _, graphs = export_dir
    for role in ("denoiser", "classifier"):
        g = _graph(graphs["diffsmooth-fixed"], role, "fp16")
        model = onnx.load(str(g.path))
        io = [v.type.tensor_type.elem_type for v in list(model.graph.input) + list(model.graph.output)]
        assert all(t == onnx.TensorProto.FLOAT for t in io), role
        report = precision_report(model)
        assert set(report["Conv"]) == {"FLOAT16"}, role
        if role != "classifier":
            assert set(report["InstanceNormalization"]) == {"FLOAT"}
            assert set(report["MatMul"]) == {"FLOAT16"}
            assert set(report["Softmax"]) == {"FLOAT"}       # attention softmax stays fp32
        else:
            assert set(report["Softmax"]) == {"FLOAT"}       # softmax over fp32 logits
            assert set(report["Gemm"]) == {"FLOAT16"}
        types = infer_types(model)
        conv_w = [n.input[1] for n in model.graph.node if n.op_type == "Conv"]
        assert all(types[w] == onnx.TensorProto.FLOAT16 for w in conv_w)
    # and it runs in ONNX Runtime close to fp32 torch
    denoiser, _ = models
    g = _graph(graphs["diffsmooth-fixed"], "denoiser", "fp16")
    x = torch.rand(4, *SHAPE)
    got = OrtStage(g.path, "d", "cpu", "fp16")(x)
    assert (got - denoiser.denoise(x, SIGMA)).abs().max() < 2e-2


@pytest.mark.slow
def test_external_data_when_over_threshold(tmp_path, models):
    denoiser, _ = models
    (g,) = export_denoiser(MethodConfig("dds", SIGMA), denoiser, SHAPE, tmp_path, external_data_threshold=1024)
    data = g.path.with_suffix(".data")
    assert data.exists() and data.stat().st_size > 100_000
    assert g.path.stat().st_size < data.stat().st_size
    manifest = read_manifest(g.path.with_suffix(".json"))
    assert manifest["external_data"] == {data.name: sha256_file(data)}
    x = torch.rand(2, *SHAPE)
    got = OrtStage(g.path, "d", "cpu")(x)
    assert (got - denoiser.denoise(x, SIGMA)).abs().max() < 1e-5
    (small,) = export_denoiser(MethodConfig("dds", SIGMA), denoiser, SHAPE, tmp_path / "inline")
    assert not small.path.with_suffix(".data").exists() and read_manifest(small.path.with_suffix(".json"))["external_data"] == {}
    # A changed external-data file is refused.
    with open(data, "r+b") as f:
        f.seek(200)
        f.write(b"\x01\x02\x03\x04")
    with pytest.raises(UserError, match="external data"):
        build_onnx_stages(tmp_path, MethodConfig("dds", SIGMA), SHAPE)


def test_plain_unet_graph(tmp_path, models):
    denoiser, _ = models
    (g,) = export_unet(denoiser, SHAPE, tmp_path)
    session = OrtStage(g.path, "unet", "cpu")
    assert session.input_names == ["x_t", "t"]
    x = torch.randn(3, *SHAPE)
    t = torch.tensor([3.0, 250.5, 900.0])
    with torch.no_grad():
        ref = denoiser.unet(x, t)
    got = session(x, t)
    assert got.shape == (3, 2, *SHAPE[1:]) and (got - ref).abs().max() < 1e-4


def test_affine_chains_fuse_into_one_mul_add():
    from onnx import TensorProto, helper, numpy_helper

    from diffsmooth.export.graph_passes import fuse_affine_chains, optimize
    rng = np.random.default_rng(0)
    consts = {k: rng.standard_normal((1, 4, 1, 1)).astype(np.float32) for k in "abcd"}
    nodes = [helper.make_node("Mul", ["x", "a"], ["t1"]), helper.make_node("Add", ["t1", "b"], ["t2"]),
             helper.make_node("Cast", ["t2"], ["t3"], to=TensorProto.FLOAT),
             helper.make_node("Div", ["t3", "c"], ["t4"]), helper.make_node("Sub", ["t4", "d"], ["t5"]),
             helper.make_node("Relu", ["t5"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4, 3, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4, 3, 3])],
                              [numpy_helper.from_array(v, k) for k, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.standard_normal((2, 4, 3, 3)).astype(np.float32)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    model = optimize(model)                  # the library drops the no-op Cast, keeps the chain
    assert "Cast" not in {n.op_type for n in model.graph.node}
    assert fuse_affine_chains(model) == 1
    assert [n.op_type for n in model.graph.node] == ["Mul", "Add", "Relu"]
    onnx.checker.check_model(model, full_check=True)
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert np.allclose(got, ref, atol=1e-5)


# ------------------------------------------------------------------------------------------
# Manifests


def test_manifest_fields_and_hashes(export_dir):
    out, graphs = export_dir
    den = _graph(graphs["dds"], "denoiser")
    m = read_manifest(den.path.with_suffix(".json"))
    assert m["role"] == "denoiser" and m["precision"] == "fp32" and m["opset"] == 17
    assert m["onnx_sha256"] == sha256_file(den.path)
    assert m["sigma"] == SIGMA and m["t_star"] == SCHEDULE.timestep(SIGMA) == 1984
    assert m["model_timestep"] == 496.0 and m["image_shape"] == list(SHAPE)
    assert m["schedule"] == {"name": "cosine", "num_steps": 4000, "rescale_timesteps": True}
    assert m["unet_config"]["model_channels"] == 32
    assert set(m["versions"]) >= {"torch", "onnx", "onnxruntime"} and m["versions"]["torch"]
    assert "source" in m and m["source"]["sha256"] is None       # in-memory weights
    for key in ("method", "m", "local_sigma", "local_noise", "num_classes"):
        assert key in m
    c = read_manifest(_graph(graphs["diffsmooth-fresh"], "classifier").path.with_suffix(".json"))
    assert (c["role"], c["method"], c["m"], c["local_sigma"], c["local_noise"], c["num_classes"]) == \
        ("classifier", "diffsmooth", 2, 0.25, "fresh", 10)
    assert c["inputs"] == {"x": ["batch", *SHAPE], "noise": ["batch", 2, *SHAPE]}
    assert c["output"]["name"] == "probs"
    r = read_manifest(_graph(graphs["rs"], "classifier").path.with_suffix(".json"))
    assert r["output"]["name"] == "logits" and r["m"] is None


# ------------------------------------------------------------------------------------------
# Validation


@pytest.mark.slow
def test_validation_passes_and_is_recorded(export_dir, models):
    denoiser, classifier = models
    _, graphs = export_dir
    config = CONFIGS["diffsmooth-fixed"]
    results = validate_graphs(graphs["diffsmooth-fixed"], config, SHAPE, denoiser=denoiser,
                              classifier=classifier, samples=SAMPLES)
    assert len(results) == 4 and all(r["passed"] for r in results.values())
    m = read_manifest(_graph(graphs["diffsmooth-fixed"], "classifier", "fp16").path.with_suffix(".json"))
    v = m["validation"]
    assert v["passed"] and v["samples"] >= SAMPLES and v["votes"]["threshold"] == 0.999
    assert v["votes"]["agreement"] >= 0.999 and v["denoiser"]["max_abs_err"] < 5e-2
    m32 = read_manifest(_graph(graphs["diffsmooth-fixed"], "classifier").path.with_suffix(".json"))
    assert m32["validation"]["votes"]["threshold"] == 0.9999 and m32["validation"]["votes"]["agreement"] >= 0.9999


def _perturb_weights(path: Path, scale: float = 0.5):
    model = onnx.load(str(path))
    rng = np.random.default_rng(0)
    for t in model.graph.initializer:
        arr = onnx.numpy_helper.to_array(t)
        if arr.dtype == np.float32 and arr.ndim == 4 and arr.shape[0] >= 16:
            t.CopyFrom(onnx.numpy_helper.from_array(arr + scale * rng.standard_normal(arr.shape).astype(np.float32), t.name))
    onnx.save(model, str(path))


def test_validation_fails_on_corrupted_graph(tmp_path, models):
    _, classifier = models
    config = CONFIGS["rs"]
    graphs = export_models(config, SHAPE, tmp_path, classifier=classifier)
    _perturb_weights(_graph(graphs, "classifier").path, scale=0.05)
    with pytest.raises(ValidationFailed, match="vote agreement"):
        validate_graphs(graphs, config, SHAPE, classifier=classifier, samples=SAMPLES)
    m = read_manifest(_graph(graphs, "classifier").path.with_suffix(".json"))
    assert m["validation"]["passed"] is False and m["validation"]["votes"]["agreement"] < 0.9999


# ------------------------------------------------------------------------------------------
# Backend


def test_backend_refuses_hash_mismatch_and_wrong_config(tmp_path, export_dir):
    out, graphs = export_dir
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    stages = build_onnx_stages(copy, CONFIGS["dds"], SHAPE, 10)
    assert isinstance(stages, BaseClassifierStages) and stages.num_classes == 10
    with pytest.raises(UserError, match="sigma=0.5 \\(want 0.25\\)"):
        build_onnx_stages(copy, MethodConfig("dds", 0.25), SHAPE)
    with pytest.raises(UserError, match="m=2 \\(want 7\\)"):
        build_onnx_stages(copy, MethodConfig("diffsmooth", SIGMA, m=7, local_sigma=0.25), SHAPE)
    with pytest.raises(UserError, match="no denoiser graph|no matching denoiser"):
        build_onnx_stages(copy, MethodConfig("dds", SIGMA), (1, 28, 28))
    with pytest.raises(UserError, match="10 classes"):
        build_onnx_stages(copy, CONFIGS["rs"], SHAPE, 12)           # the data has labels the graph cannot score
    assert build_onnx_stages(copy, CONFIGS["rs"], SHAPE, 4).num_classes == 10   # as on torch: fewer labels is fine
    den = copy / _graph(graphs["dds"], "denoiser").path.name
    with open(den, "ab") as f:
        f.write(b"\0")
    with pytest.raises(UserError, match="sha256"):
        build_onnx_stages(copy, CONFIGS["dds"], SHAPE)
    with pytest.raises(UserError, match="no exported graphs|no such directory"):
        build_onnx_stages(tmp_path / "empty", CONFIGS["rs"], SHAPE)


def test_backend_refuses_graph_that_failed_validation(tmp_path, export_dir):
    out, graphs = export_dir
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    man = copy / _graph(graphs["rs"], "classifier").path.with_suffix(".json").name
    data = json.loads(man.read_text())
    data["validation"] = {"passed": False, "summary": "vote agreement 97.00% < 99.99%"}
    man.write_text(json.dumps(data))
    with pytest.raises(UserError, match="failed validation"):
        build_onnx_stages(copy, CONFIGS["rs"], SHAPE)


def test_cuda_without_gpu_runtime_is_a_clear_error(export_dir):
    out, _ = export_dir
    if torch.cuda.is_available():
        pytest.skip("has CUDA")
    with pytest.raises(UserError, match="CUDA is not available"):
        build_onnx_stages(out, CONFIGS["rs"], SHAPE, device="cuda")


def test_an_exported_sweep_opens_hashes_and_probes_the_denoiser_once(export_dir, monkeypatch):
    """A sweep's configurations share one session of the denoiser graph: it is opened, its sha256 checked and
    probed once however many configurations read it (each classifier graph still opened once)."""
    from diffsmooth.engine.base_classifier.configurations import Configuration
    from diffsmooth.engine.runs.assemble import ModelSources
    from diffsmooth.engine.runs.stage_build import build_sweep_stages
    from diffsmooth.engine.stages import manifests
    out, graphs = export_dir
    denoiser = _graph(graphs["dds"], "denoiser").path.name
    opened, hashed, runs = [], [], []

    class Counting(ort.InferenceSession):
        def __init__(self, path, *args, **kwargs):
            self.counted_name = Path(path).name
            opened.append(self.counted_name)
            super().__init__(path, *args, **kwargs)

        def run(self, *args, **kwargs):
            runs.append(self.counted_name)
            return super().run(*args, **kwargs)

    def counting_sha256(path):
        hashed.append(Path(path).name)
        return sha256_file(path)

    monkeypatch.setattr(ort, "InferenceSession", Counting)
    monkeypatch.setattr(manifests, "sha256_file", counting_sha256)
    names = ["dds", "diffsmooth-fixed", "diffsmooth-fresh", "rs"]
    configs = [Configuration(CONFIGS[name], "clf") for name in names]
    stages = build_sweep_stages(configs, {"clf": None}, ModelSources(), SHAPE, 10, backend="onnxruntime",
                                onnx_dir=str(out))
    assert stages.num_classes == 10 and stages.configs == tuple(c.name for c in configs)
    assert opened.count(denoiser) == 1 and hashed.count(denoiser) == 1 and runs.count(denoiser) == 1
    assert len(opened) == 1 + len(names) and len(set(opened)) == len(opened)    # the four classifier graphs once each
    assert stages.inputs == ("noisy", "denoised")
    x = torch.full((3, *SHAPE), 0.5)
    scores = stages.score(x, stages.purify(x), torch.zeros((3, *stages.local_noise_shape)))
    assert scores.shape == (3, len(names), 10) and runs.count(denoiser) == 2


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CONFIGS))
def test_onnxruntime_certify_matches_torch(export_dir, models, name):
    """The key property: same seed -> same predictions and radii with either backend."""
    denoiser, classifier = models
    out, _ = export_dir
    config = CONFIGS[name]
    torch_stages = build_torch_stages(config, classifier, denoiser if config.purifier.denoises else None,
                                      TorchRunner(), SHAPE, 10)
    ort_stages = build_onnx_stages(out, config, SHAPE, 10)
    a, b = Smooth(MonteCarloPipeline(torch_stages, SIGMA, 3)), Smooth(MonteCarloPipeline(ort_stages, SIGMA, 3))
    for i, x in enumerate(real_images(3)):
        ra = a.certify(x, 20, 200, 0.05, 64, image_index=i)
        rb = b.certify(x, 20, 200, 0.05, 64, image_index=i)
        assert ra.prediction == rb.prediction and abs(ra.radius - rb.radius) < 1e-6, (name, i, ra, rb)
    counts = [s.pipeline.count(x, 7, 0, 300, 100) for s in (a, b)]    # every vote, not just the top class
    assert np.array_equal(*counts), counts


# ------------------------------------------------------------------------------------------
# Command line


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, models):
    denoiser, classifier = models
    d = tmp_path_factory.mktemp("ckpt")
    save_unet_state(d / "unet.pt", denoiser.unet)
    save_cohen_checkpoint(d / "clf.pt", classifier, "cifar_resnet20")
    return d


@pytest.mark.slow
def test_cli_export_validate_and_certify_backends_agree(tmp_path, checkpoints):
    import click
    from click.testing import CliRunner

    from diffsmooth.cli import main
    from diffsmooth.cli.export import export
    from diffsmooth.cli.validate import validate

    group = click.Group(commands={"export": export, "validate": validate})
    runner = CliRunner()
    x = real_images(2)
    data = tmp_path / "imgs.npz"
    np.savez(data, images=(x[:, 0].numpy() * 255).round().astype(np.uint8), labels=np.array([0, 1]),
             num_classes=np.array(10))
    model_args = ["--denoiser", str(checkpoints / "unet.pt"), "--unet-config", json.dumps(TINY_UNET),
                  "--schedule", "cosine", "--diffusion-steps", "4000", "--classifier", str(checkpoints / "clf.pt"),
                  "--stats", "fashion-mnist"]
    method_args = ["--method", "diffsmooth", "--sigma", "0.5", "--m", "2", "--local-sigma", "0.25",
                   "--local-noise", "fresh"]
    onnx_dir = tmp_path / "onnx"
    r = runner.invoke(group, ["export", *model_args, *method_args, "--image-shape", "1,16,16",
                              "--out", str(onnx_dir), "--samples", "50"])
    assert r.exit_code == 0, (r.output, r.exception)
    assert r.output.count("ok ") == 2 and len(list(onnx_dir.glob("*.onnx"))) == 2
    m = read_manifest(next(onnx_dir.glob("denoiser_*.json")))
    assert m["source"]["sha256"] == sha256_file(checkpoints / "unet.pt") and m["validation"]["passed"]
    r = runner.invoke(group, ["validate", "--onnx-dir", str(onnx_dir), "--samples", "50"])
    assert r.exit_code == 0, (r.output, r.exception)
    rows = {}
    for backend in ("torch", "onnxruntime"):
        out = tmp_path / f"{backend}.tsv"
        r = runner.invoke(main, ["certify", *model_args, *method_args, "--dataset", "npz", "--data", str(data),
                                 "--n0", "10", "--n", "40", "--alpha", "0.05", "--batch", "25", "--seed", "1",
                                 "--backend", backend, "--onnx-dir", str(onnx_dir), "--out", str(out), "--quiet"])
        assert r.exit_code == 0, (backend, r.output, r.exception)
        rows[backend] = [line.split("\t")[:4] for line in out.read_text().splitlines()[1:]]
    assert len(rows["torch"]) == 2 and rows["torch"] == rows["onnxruntime"]
    # A corrupted graph (even with a consistent hash) fails `validate` with a non-zero exit.
    cls = next(onnx_dir.glob("classifier_*.onnx"))
    _perturb_weights(cls, scale=0.05)
    man = cls.with_suffix(".json")
    data = json.loads(man.read_text())
    data["onnx_sha256"] = sha256_file(cls)
    man.write_text(json.dumps(data))
    r = runner.invoke(group, ["validate", "--onnx-dir", str(onnx_dir), "--samples", "50"])
    assert r.exit_code != 0 and isinstance(r.exception, ValidationFailed)


def test_backend_refuses_external_data_outside_its_folder_and_corrupt_graphs(tmp_path):
    """Hostile ONNX: a tensor whose external data points outside the folder, and a corrupt file."""
    import onnx
    from onnx import TensorProto, helper

    from diffsmooth.engine.stages.manifests import check_external_data_paths
    weight = helper.make_tensor("w", TensorProto.FLOAT, [1], [1.0])
    weight.data_location = TensorProto.EXTERNAL
    del weight.float_data[:]
    entry = weight.external_data.add()
    entry.key, entry.value = "location", "../../etc/passwd"
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])], [weight])
    path = tmp_path / "evil.onnx"
    onnx.save_model(helper.make_model(graph), str(path))
    with pytest.raises(UserError, match="outside"):
        check_external_data_paths(path)
    with pytest.raises(UserError, match="outside"):
        check_external_data_paths(tmp_path / "evil.onnx", ["/abs/data.bin"])
    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(b"\x08\x07garbage" * 10)
    with pytest.raises(UserError, match="not a readable ONNX file"):
        check_external_data_paths(corrupt)


@pytest.mark.slow
def test_sweep_on_onnxruntime_gives_the_torch_rows(tmp_path, tiny_cli_args):
    """A sweep runs through the one voter on any backend: exported graphs of every configuration
    (one denoiser graph serves all) give the torch sweep's rows under the backends' agreement rule
    (CPU fp32: the same prediction and radius in every row)."""
    from click.testing import CliRunner

    from diffsmooth.cli import main
    onnx_dir = tmp_path / "onnx"
    models_args = [a for a in tiny_cli_args]
    shape = ["--image-shape", "3,8,8"]
    model_only = models_args[:models_args.index("--dataset")] + models_args[models_args.index("--sigma"):]
    for method in (["--method", "rs"], ["--method", "dds"],
                   *(["--method", "diffsmooth", "--m", m, "--local-sigma", "0.12", "--local-noise", "fresh"]
                     for m in ("1", "2"))):
        r = CliRunner().invoke(main, ["export", *model_only, *method, *shape, "--no-validate", "--out", str(onnx_dir)])
        assert r.exit_code == 0, (method, r.output, r.exception)
    assert len(list(onnx_dir.glob("*.onnx"))) == 5                 # one denoiser graph, four classifier graphs
    args = ["certify", *models_args, "--method", "rs", "--method", "dds", "--method", "diffsmooth", "--m", "1",
            "--m", "2", "--local-sigma", "0.12", "--local-noise", "fresh", "--n0", "8", "--n", "40", "--batch", "16",
            "--max", "4", "--quiet", "--onnx-dir", str(onnx_dir)]
    rows = {}
    for backend in ("torch", "onnxruntime"):
        out = tmp_path / backend
        r = CliRunner().invoke(main, [*args, "--backend", backend, "--out", str(out)])
        assert r.exit_code == 0, (backend, r.output, r.exception)
        rows[backend] = {f.name: [line.split("\t")[:4] for line in f.read_text().splitlines()[1:]]
                         for f in sorted(out.glob("*.tsv"))}
    assert len(rows["torch"]) == 4 and all(len(v) == 4 for v in rows["torch"].values())
    assert rows["torch"] == rows["onnxruntime"]
    predictions = {row[2] for file_rows in rows["torch"].values() for row in file_rows}
    radii = {row[3] for file_rows in rows["torch"].values() for row in file_rows}
    assert len(predictions - {"-1"}) >= 2 and len(radii) >= 3, (predictions, radii)

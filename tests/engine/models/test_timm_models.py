"""timm classifiers (BEiT): official-format checkpoints, key remapping, one-line errors, the engine's
paths (certify, export, bench FLOPs) and running without torchvision. Tiny BEiT configs only."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from diffsmooth.engine.errors import UserError
from diffsmooth.engine.models.checkpoints import load_classifier, save_cohen_checkpoint

pytestmark = [pytest.mark.skipif(importlib.util.find_spec("timm") is None,
                                 reason="timm not installed (pip install --no-deps timm)"),
              pytest.mark.usefixtures("one_thread")]     # tests/conftest.py

# beit_large_patch16_224's own kwargs are overridden by these: the same code path, 32x32 images, 2 blocks.
TINY = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2)
SHAPE = (3, 32, 32)


def tiny_beit(arch="beit_large_patch16_224", num_classes=10, seed=0, **overrides):
    from diffsmooth.engine.models.timm_models import create_timm_net
    torch.manual_seed(seed)
    net = create_timm_net(arch, num_classes, None, {**TINY, **overrides})
    with torch.no_grad():          # timm's 1e-5 layer scale and tiny head make every logit ~0: spread them
        for name, p in net.named_parameters():
            if name.endswith(("gamma_1", "gamma_2")):
                p.fill_(1.0)
            if name == "head.weight":
                p.normal_(0, 1.0)
    return net


def official_checkpoint(path, net, arch="beit_large_patch16_224", with_index=True, kwargs=True):
    """The official code's format: {'arch', 'state_dict' of Sequential(normalisation, model)} (keys `1.*`);
    timm 0.9.5 also saved each block's relative_position_index buffer, which newer timm does not keep."""
    sd = {f"1.{k}": v.clone() for k, v in net.state_dict().items()}
    if with_index:
        for i, block in enumerate(net.blocks):
            sd[f"1.blocks.{i}.attn.relative_position_index"] = block.attn.relative_position_index.clone()
    ckpt = {"arch": arch, "state_dict": sd, "epoch": 30}
    if kwargs:
        ckpt["model_kwargs"] = dict(TINY)
    torch.save(ckpt, path)
    return path


def test_official_format_loads_with_vit_normalisation_and_equals_timm(tmp_path):
    net = tiny_beit()
    path = official_checkpoint(tmp_path / "beit.pth.tar", net)
    assert any("relative_position_index" in k for k in torch.load(path)["state_dict"])
    clf = load_classifier(path, dataset="imagenet")
    norm = clf.normalization
    assert norm.mean.flatten().tolist() == [0.5] * 3 and norm.std.flatten().tolist() == [0.5] * 3
    x = torch.rand(4, *SHAPE, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, theirs = clf(x), net.eval()((x - 0.5) / 0.5)
    assert torch.equal(ours, theirs)
    assert ours.argmax(1).unique().numel() > 1          # logits differ per image: a real comparison
    assert isinstance(clf.net, torch.nn.Module) and type(clf.net).__module__.startswith("timm.")


def test_plain_state_dict_with_arch_and_explicit_normalisation(tmp_path):
    net = tiny_beit("timm:beit_base_patch16_224", num_classes=7)
    torch.save(net.state_dict(), tmp_path / "plain.pt")
    with pytest.raises(UserError, match="does not record its architecture"):
        load_classifier(tmp_path / "plain.pt")
    clf = load_classifier(tmp_path / "plain.pt", arch="timm:beit_base_patch16_224", normalization="normalize",
                          dataset="imagenet", model_kwargs=TINY)
    x = torch.rand(2, *SHAPE)
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
    with torch.no_grad():
        assert torch.allclose(clf(x), net.eval()((x - mean) / std), atol=1e-6)
    assert clf(x).shape == (2, 7)                        # classes read from the head


def test_save_cohen_checkpoint_round_trip(tmp_path):
    net = tiny_beit()
    save_cohen_checkpoint(tmp_path / "c.pt", net, "beit_large_patch16_224", model_kwargs=TINY)
    clf = load_classifier(tmp_path / "c.pt")
    x = torch.rand(2, *SHAPE)
    with torch.no_grad():
        assert torch.equal(clf(x), net((x - 0.5) / 0.5))


def test_mismatches_are_one_line_errors_naming_the_key(tmp_path):
    deeper = tiny_beit(depth=3)
    path = official_checkpoint(tmp_path / "deep.pt", deeper)
    with pytest.raises(UserError) as err:               # the checkpoint has a third block
        load_classifier(path)
    msg = str(err.value)
    assert "\n" not in msg and "unexpected" in msg and "blocks.2." in msg
    # Another patch size: timm would silently resample the patch kernel; we refuse and name the key.
    other = tiny_beit(patch_size=4)
    path = official_checkpoint(tmp_path / "p4.pt", other, kwargs=False)
    with pytest.raises(UserError) as err:
        load_classifier(path, model_kwargs=TINY)
    assert "\n" not in str(err.value) and "patch_embed.proj.weight" in str(err.value)
    with pytest.raises(UserError, match="no model 'beit_huge_nope'"):
        load_classifier(path, arch="timm:beit_huge_nope")
    with pytest.raises(UserError, match="not allowed"):
        load_classifier(path, model_kwargs={**TINY, "pretrained": True})


def test_without_timm_one_line_install_hint(tmp_path, monkeypatch):
    from diffsmooth.cli import main
    net = tiny_beit()
    path = official_checkpoint(tmp_path / "b.pt", net)
    for name in [n for n in sys.modules if n == "timm" or n.startswith("timm.")]:
        monkeypatch.delitem(sys.modules, name)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "timm" else real(name, *a))
    with pytest.raises(UserError, match=r"needs timm.*pip install"):
        load_classifier(path)
    data = tmp_path / "d.npz"
    np.savez(data, images=np.zeros((1, 32, 32, 3), np.uint8), labels=np.array([0]), num_classes=np.array(10))
    r = CliRunner().invoke(main, ["certify", "--classifier", str(path), "--method", "rs", "--dataset", "npz",
                                  "--data", str(data), "--n0", "2", "--n", "2", "--out", str(tmp_path / "o.tsv"),
                                  "--quiet"])
    assert r.exit_code == 2, r.output
    assert r.output.strip().startswith("error:") and "pip install" in r.output and len(r.output.strip().splitlines()) == 1


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("torchvision") is not None, reason="torchvision is installed here")
def test_timm_imports_without_torchvision_and_leaves_none_behind():
    code = (
        "import sys, importlib.util\n"
        "from diffsmooth.engine.models.timm_models import import_timm, create_timm_net\n"
        "timm = import_timm()\n"
        "assert not [m for m in sys.modules if m.startswith('torchvision')]\n"
        "assert importlib.util.find_spec('torchvision') is None\n"
        "net = create_timm_net('beit_large_patch16_224', 10, None,\n"
        "                      dict(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2))\n"
        "import torch; print(tuple(net(torch.rand(1, 3, 32, 32)).shape))\n"
        "from timm.layers import create_norm\n"
        "try:\n"
        "    create_norm.FrozenBatchNorm2d(4)\n"
        "except ImportError as e:\n"
        "    print('refused:', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "(1, 10)" in out.stdout and "needs torchvision" in out.stdout


def test_certify_cli_with_beit_classifier(tmp_path):
    from diffsmooth.cli import main
    from diffsmooth.engine.runs.results import read_rows
    net = tiny_beit()
    path = official_checkpoint(tmp_path / "b.pt", net)
    g = np.random.default_rng(0)
    data = tmp_path / "d.npz"
    np.savez(data, images=g.integers(0, 256, (3, 32, 32, 3), dtype=np.uint8), labels=np.array([0, 1, 2]),
             num_classes=np.array(10))
    outs = []
    for batch in ("7", "40"):
        out = tmp_path / f"o{batch}.tsv"
        r = CliRunner().invoke(main, ["certify", "--classifier", str(path), "--method", "rs", "--sigma", "0.25",
                                      "--dataset", "npz", "--data", str(data), "--n0", "10", "--n", "40",
                                      "--alpha", "0.05", "--batch", batch, "--out", str(out), "--quiet"])
        assert r.exit_code == 0, (r.output, r.exception)
        outs.append([{k: v for k, v in row.items() if k != "time"} for row in read_rows(out)])
    assert len(outs[0]) == 3 and outs[0] == outs[1]     # batch size does not change the result
    # PREDICT-side check that the votes really spread over classes for this classifier.
    from diffsmooth.engine.models.checkpoints import load_classifier as lc
    clf = lc(path)
    x = torch.from_numpy(np.load(data)["images"][0]).permute(2, 0, 1).float() / 255
    with torch.no_grad():
        votes = clf(x + 0.25 * torch.randn(200, *SHAPE, generator=torch.Generator().manual_seed(0))).argmax(1)
    assert votes.unique().numel() > 1


def test_attention_matmuls_are_counted_in_flops():
    from diffsmooth.bench.flops import count_flops
    net = tiny_beit()
    total, by_op = count_flops(net, torch.zeros(2, *SHAPE))
    tokens, dim, depth = (32 // 8) ** 2 + 1, 32, 2
    attention = depth * 2 * (2 * tokens * tokens * dim)   # q@k^T and attn@v, 2 FLOPs per multiply-add
    assert by_op.get("bmm", 0) // 2 == attention
    assert total // 2 > attention


def test_bench_cli_with_timm_arch():
    """`bench --arch timm:<name>`: the set's classifier replaced (random weights), FLOPs include attention."""
    import json

    from diffsmooth.cli.bench import bench
    args = ["--models", "cifar10", "--method", "rs", "--arch", "timm:test_vit", "--n0", "2", "--measure-n", "2",
            "--batch", "2", "--no-reference", "--peak-tflops", "1", "--json", "--quiet"]
    out = CliRunner().invoke(bench, args)
    assert out.exit_code == 0, (out.output, out.exception)
    doc = json.loads(out.stdout)
    text = json.dumps(doc)
    assert "timm:test_vit" in text and "bmm" in text


def test_export_and_validate_tiny_beit(tmp_path):
    """fp32 + mixed-fp16 graphs of the DiffSmooth classifier head (m local noises), weights as external
    data (forced by a tiny threshold, as BEiT-L's would be past 2 GiB), validated against torch."""
    pytest.importorskip("onnxruntime")
    from diffsmooth.engine.base_classifier.methods import MethodConfig
    from diffsmooth.export.onnx_export import export_models
    from diffsmooth.export.validate import validate_graphs
    net = tiny_beit()
    clf = load_classifier(official_checkpoint(tmp_path / "b.pt", net))
    config = MethodConfig("diffsmooth", 0.25, m=2, local_sigma=0.12, local_noise="fixed")
    graphs = export_models(config, SHAPE, tmp_path / "onnx", classifier=clf, fp16=True, external_data_threshold=1000)
    assert sorted(g.precision for g in graphs) == ["fp16", "fp32"]
    fp32 = next(g.path for g in graphs if g.precision == "fp32")
    assert fp32.with_suffix(".data").stat().st_size > 0.9 * 4 * sum(p.numel() for p in net.parameters())
    results = validate_graphs(graphs, config, SHAPE, classifier=clf, samples=300)
    assert len(results) == 2 and all(r["passed"] for r in results.values())


@pytest.mark.slow
def test_broken_torchvision_falls_back_to_placeholders(tmp_path):
    """A torchvision that fails at import (built for another torch) does not block timm models."""
    fake = tmp_path / "torchvision"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise RuntimeError('operator torchvision::nms does not exist')\n")
    code = (
        "import sys\n"
        "from diffsmooth.engine.models.timm_models import create_timm_net\n"
        "net = create_timm_net('beit_large_patch16_224', 10, None,\n"
        "                      dict(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2))\n"
        "import torch; print(tuple(net(torch.rand(1, 3, 32, 32)).shape))\n"
        "print('left:', sorted(m for m in sys.modules if m.startswith('torchvision')))\n"
    )
    import os
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert "(1, 10)" in out.stdout and "left: []" in out.stdout


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_beit_counts_on_cuda(tmp_path, precision):
    """Tiny BEiT through the torch backend on CUDA: votes sum to n, do not depend on the batch, and
    (fp32) agree with the CPU's up to near-ties."""
    from diffsmooth.engine.base_classifier.methods import MethodConfig
    from diffsmooth.engine.runs.assemble import ModelSources
    from diffsmooth.engine.runs.stage_build import build_smooth
    path = official_checkpoint(tmp_path / "b.pt", tiny_beit())
    config = MethodConfig("rs", 0.25)
    sources = ModelSources(classifier=str(path), stats="imagenet")
    gpu = build_smooth(config, sources, SHAPE, 10, device="cuda", precision=precision)
    x = torch.rand(SHAPE, generator=torch.Generator().manual_seed(0))
    counts = torch.as_tensor(gpu.pipeline.count(x, 0, 0, 400, 200))
    assert int(counts.sum()) == 400 and int((counts > 0).sum()) > 1
    assert torch.equal(counts, torch.as_tensor(gpu.pipeline.count(x, 0, 0, 400, 64)))
    if precision == "fp32":
        cpu = torch.as_tensor(build_smooth(config, sources, SHAPE, 10).pipeline.count(x, 0, 0, 400, 200))
        assert int(cpu.argmax()) == int(counts.argmax()) and int((cpu - counts).abs().sum()) <= 8

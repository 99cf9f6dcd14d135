"""The benchmark harness: extrapolation arithmetic, FLOP counting, the JSON document of a tiny
run, the reference-equivalent baseline (same maths, every sample counted for its vote) and the sweep table. Not speed."""

import json

import click
import pytest
import torch
from torch import nn

from diffsmooth.engine.demo import shipped as demo_assets

TINY_UNET = {"image_size": 8, "model_channels": 32, "num_res_blocks": 1, "channel_mult": (1, 2),
             "attention_resolutions": (4,), "dropout": 0.0}


pytestmark = pytest.mark.usefixtures("one_thread")     # tests/conftest.py


def tiny_settings(**kw):
    from diffsmooth.bench.harness import BenchSettings
    base = dict(models="cifar10", method="diffsmooth", sigma=0.5, n0=4, n=1000, m=3, batch=4, measure_n=6,
                images=2, unet_overrides=dict(TINY_UNET), arch="cifar_resnet20", measure_cpu_peak=False,
                progress=False, reference_batch=5, sweep_batches=(2, 4), sweep_ms=(1, 2), sweep_n=4)
    base.update(kw)
    return BenchSettings(**base)


@pytest.fixture(scope="module")
def tiny_set():
    from diffsmooth.bench.models import build_model_set
    torch.set_num_threads(1)
    return build_model_set("cifar10", "diffsmooth", 0.5, 0.25, 0, dict(TINY_UNET), "cifar_resnet20")


# ------------------------------------------------------------------------------------------
# extrapolation


def test_extrapolation_is_linear_in_samples():
    from diffsmooth.bench.timing import extrapolate_seconds, extrapolation_table
    assert extrapolate_seconds(0.01, 0.5, 100, 1000) == pytest.approx(0.01 * 1100 + 0.5)
    assert extrapolate_seconds(2e-3, 0.0, 100, 100_000) == pytest.approx(200.2)
    table = extrapolation_table(1e-3, 0.25, 100, [10_000, 100_000])
    assert set(table) == {"10000", "100000"}
    assert table["100000"] - table["10000"] == pytest.approx(90_000 * 1e-3)


def test_split_fractions_sum_to_one():
    from diffsmooth.bench.timing import split_fractions
    f = split_fractions({"a": 1.0, "b": 3.0})
    assert f == {"a": 0.25, "b": 0.75}


# ------------------------------------------------------------------------------------------
# FLOP counting


def test_flops_conv_plus_linear_hand_count():
    from diffsmooth.bench.flops import count_flops, stage_flops
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.Flatten(), nn.Linear(8 * 4 * 4, 10))
    # conv: 8 out channels x 4x4 outputs x (3 x 3 x 3) MACs; linear: 128 x 10 MACs; 2 FLOPs per MAC
    conv = 2 * 8 * 4 * 4 * 27
    linear = 2 * 128 * 10
    total, by_op = count_flops(model, torch.zeros(1, 3, 4, 4))
    assert total == conv + linear == 9472
    assert by_op == {"convolution": conv, "addmm": linear}
    per_sample, _ = stage_flops(model, (3, 4, 4), batch=3)
    assert per_sample == 9472
    assert next(model.parameters()).device.type == "cpu"       # counted on meta copies only


def test_flops_bmm_counted():
    from diffsmooth.bench.flops import count_flops

    class Attn(nn.Module):
        def forward(self, q, k):
            return torch.bmm(q, k)

    total, by_op = count_flops(Attn(), torch.zeros(2, 4, 5), torch.zeros(2, 5, 6))
    assert total == 2 * 2 * 4 * 5 * 6 and "bmm" in by_op


@pytest.mark.slow
def test_flops_full_size_models_match_facts():
    """The reference counts 2 x MAC: 16.8 GFLOP (CIFAR-10 UNet), 0.506 GFLOP (cifar_resnet110)."""
    from diffsmooth.bench.flops import stage_flops
    from diffsmooth.engine.models.resnet import build_classifier_net
    from diffsmooth.engine.models.unet import PRESETS, UNetModel

    class WithT(nn.Module):
        def __init__(self, unet):
            super().__init__()
            self.unet = unet

        def forward(self, x):
            return self.unet(x, torch.zeros(x.shape[0], device=x.device))

    with torch.device("meta"):
        unet = UNetModel(PRESETS["cifar10"])
        resnet = build_classifier_net("cifar_resnet110", 10, 3)
    assert stage_flops(WithT(unet), (3, 32, 32))[0] / 1e9 == pytest.approx(16.77, abs=0.05)
    assert stage_flops(resnet, (3, 32, 32))[0] / 1e9 == pytest.approx(0.506, abs=0.001)


# ------------------------------------------------------------------------------------------
# reference-equivalent baseline


class _OneClass(nn.Module):
    """Scores class 7 highest for every input."""

    def forward(self, x):
        out = torch.zeros(x.shape[0], 10)
        out[:, 7] = 1.0
        return out


@pytest.mark.parametrize("method", ["rs", "dds", "diffsmooth"])
def test_reference_equivalent_counts_every_sample_for_its_vote(tiny_set, method):
    from diffsmooth.bench.reference_equivalent import ReferenceEquivalent
    ref = ReferenceEquivalent(method, _OneClass(), 10, 0.5, tiny_set.denoiser if method != "rs" else None, m=3)
    counts = ref.count(torch.rand(tiny_set.image_shape), 13, batch=5)   # two full batches and a partial one
    assert counts.tolist() == [0] * 7 + [13, 0, 0]


class _RecordsCudnnBenchmark(_OneClass):
    """Remembers torch.backends.cudnn.benchmark at each call."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def forward(self, x):
        self.seen.append(torch.backends.cudnn.benchmark)
        return super().forward(x)


@pytest.mark.parametrize("arch,expected", [("cifar_resnet110", False), ("resnet50", True)])
def test_reference_equivalent_runs_with_the_official_cudnn_autotuning(arch, expected):
    """The official code autotunes cuDNN for its ImageNet classifiers only; the engine's process-wide
    setting must neither leak into the baseline nor be lost after it."""
    from diffsmooth.bench.reference_equivalent import ReferenceEquivalent, official_cudnn_benchmark
    clf = _RecordsCudnnBenchmark()
    ref = ReferenceEquivalent("rs", clf, 10, 0.5, cudnn_benchmark=official_cudnn_benchmark(arch))
    previous = torch.backends.cudnn.benchmark
    try:
        torch.backends.cudnn.benchmark = not expected          # what the engine left behind
        ref.count(torch.rand(3, 8, 8), 7, batch=3)
        assert clf.seen == [expected] * 3
        assert torch.backends.cudnn.benchmark is (not expected)
    finally:
        torch.backends.cudnn.benchmark = previous


def test_reference_equivalent_does_the_engines_maths(tiny_set):
    """Same denoised images and the same local-smoothing probabilities as the engine's modules."""
    from diffsmooth.bench.reference_equivalent import ReferenceEquivalent
    from diffsmooth.engine.backends.torch.stages import score_module
    from diffsmooth.engine.base_classifier.methods import MethodConfig
    ref = ReferenceEquivalent("diffsmooth", tiny_set.classifier, 10, 0.5, tiny_set.denoiser, m=3, local_sigma=0.25)
    x = torch.rand(5, *tiny_set.image_shape)
    head = score_module(MethodConfig("diffsmooth", 0.5, 3, 0.25), tiny_set.classifier, tiny_set.image_shape)
    with torch.no_grad():
        purified = tiny_set.denoiser.purifier(0.5)(x)
        torch.testing.assert_close(ref._denoise(x), purified, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ref._classify(purified), head(purified), rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------
# a tiny run end to end


@pytest.fixture(scope="module")
def tiny_doc(tmp_path_factory):
    from diffsmooth.bench.harness import run_bench, to_jsonable
    torch.set_num_threads(1)
    plot = tmp_path_factory.mktemp("bench") / "sweep.png"
    lines = []                                          # what --results appends: one JSON line per run, the sweep's
    doc = to_jsonable(run_bench(tiny_settings(compare=True, sweep=True, plot=str(plot), precisions=("fp32", "fp16")),
                                on_run=lines.append))
    return doc, plot, lines


@pytest.mark.slow
def test_tiny_run_json_schema(tiny_doc):
    from diffsmooth.bench.harness import SCHEMA
    from diffsmooth.bench.timing import STAGE_NAMES
    doc, _, lines = tiny_doc
    json.dumps(doc)
    assert doc["schema"] == SCHEMA
    for key in ("cpu_model", "cpu_cores", "torch", "onnxruntime", "load_average"):
        assert key in doc["machine"]
    assert doc["settings"]["n"] == 1000 and doc["settings"]["m"] == 3
    assert [s["precision"] for s in doc["skipped"]] == ["fp16"] and "CUDA" in doc["skipped"][0]["reason"]
    (run,) = doc["runs"]
    assert run["backend"] == "torch" and run["precision"] == "fp32"
    meas = run["measured"]
    assert set(meas["stage_seconds"]) == set(STAGE_NAMES)
    assert all(v >= 0 for v in meas["stage_seconds"].values())
    assert meas["samples"] == 2 * (4 + 6)
    assert all(len(p["estimation_counts"]) == 10 and all(isinstance(c, int) and c >= 0 for c in p["estimation_counts"])
               for p in meas["predictions"])
    f = run["flops"]
    assert f["total_per_sample"] == f["denoiser_per_sample"] + f["classifier_per_sample"] > 0
    assert f["classifier_per_sample"] == 3 * f["classifier_per_call"]
    assert run["rates"]["pipeline_samples_per_s"] > 0
    assert set(run["warmup"]) >= {"build_models_s", "build_stages_s", "first_batch_s"}
    ex = run["extrapolated"]["seconds_per_image"]
    assert set(ex) == {"1000", "10000", "100000"}
    assert ex["100000"] > ex["10000"] > ex["1000"]
    ref = run["reference_equivalent"]
    assert ref["batch"] == 5 and ref["speedup"] > 0
    assert all(len(c) == 10 and all(isinstance(v, int) and v >= 0 for v in c) for c in ref["estimation_counts"])
    assert "hardware" in run["compare"]["note"].lower()
    assert len(lines) == 2 and all({"machine", "settings", "timestamp"} <= set(l) for l in lines)
    json.dumps(lines)


@pytest.mark.slow
def test_sweep_table_shape_and_plot(tiny_doc):
    doc, plot, _ = tiny_doc
    sweep = doc["sweep"]
    assert sweep["batches"] == [2, 4] and sweep["ms"] == [1, 2]
    assert len(sweep["table"]) == 2 and all(len(row) == 2 for row in sweep["table"])
    assert all(v > 0 for row in sweep["table"] for v in row)
    assert len(sweep["rows"]) == 4
    assert plot.exists() and plot.stat().st_size > 1000


@pytest.mark.slow
def test_render_mentions_extrapolation_and_hardware(tiny_doc):
    from diffsmooth.bench.report import render
    text = render(tiny_doc[0])
    assert "extrapolated" in text and "reference-equivalent" in text and "RTX A6000" in text
    assert "sweep" in text


def test_sweep_table_grid():
    from diffsmooth.bench.harness import sweep_table
    sweep = {"batches": [1, 2, 3], "ms": [1, 5],
             "rows": [{"batch": b, "m": m, "seconds_per_image": b * 10 + m} for m in (1, 5) for b in (1, 2, 3)]}
    assert sweep_table(sweep) == [[11, 21, 31], [15, 25, 35]]


def test_cli_json_and_results(tmp_path):
    """The click command on the demo set, tiny n: one JSON document on stdout, JSON lines appended."""
    from click.testing import CliRunner

    from diffsmooth.cli.bench import bench
    results = tmp_path / "r.jsonl"
    args = ["--models", "demo", "--method", "rs", "--n0", "2", "--measure-n", "2", "--batch", "2",
            "--reference-batch", "2", "--peak-tflops", "1", "--json", "--quiet", "--results", str(results)]
    out = CliRunner().invoke(bench, args)
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert doc["runs"][0]["method"] == "rs" and doc["runs"][0]["achieved"]["peak_source"] == "--peak-tflops"
    out = CliRunner().invoke(bench, args)
    lines = results.read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[1])["run"]["backend"] == "torch"


def test_extrapolation_counts_what_a_packed_run_computes():
    """One image alone computes whole static batches; a packed run over many images computes
    n0 + n per image (only the run's last batch is padded), which seconds per image count."""
    from diffsmooth.bench.harness import computed_samples, engine_seconds_table
    assert computed_samples(100, 0, 2000, static=True) == 2000
    assert computed_samples(100, 0, 2000, static=False) == 100
    assert computed_samples(100, 100_000, 2000, static=True) == 102_000
    assert computed_samples(100, 9_900, 2000, static=True) == 10_000
    settings = tiny_settings(n0=100)
    measured = {"static_batch": True, "batch": 2000, "per_computed_sample_s": 1e-4, "per_image_fixed_s": 0.5}
    assert engine_seconds_table(measured, settings, [100_000])["100000"] == pytest.approx(1e-4 * 100_100 + 0.5)


def test_kernel_profile_accounts_for_the_pipelines_time(tiny_set, tmp_path):
    """--profile: a table and JSON per run; shares by kind sum to one and convolutions are found."""
    from diffsmooth.bench.harness import build_stages
    from diffsmooth.bench.kernel_profile import kind_of, profile_pipeline, summary_lines
    assert kind_of("sm90_xmma_fprop_implicit_gemm_f16f16") == "convolution"
    assert kind_of("pytorch_flash::flash_fwd_kernel") == "attention"
    assert kind_of("triton_per_fused_native_group_norm_silu_3") == "fused elementwise / normalisation (inductor)"
    assert kind_of("sm90_xmma_gemm_f16f16") == "matmul" and kind_of("Memset (Device)") == "other"
    # inductor's fused kernels are named after the ops they fused, a conv's bias add among them
    assert kind_of("triton_red_fused__to_copy_clone_convolution_mul_native_group_norm_sub_2") == \
        "fused elementwise / normalisation (inductor)"
    assert kind_of("triton_poi_fused__scaled_dot_product_cudnn_attention__to_copy_add_split_transpose_view_31") == \
        "fused elementwise / normalisation (inductor)"
    assert kind_of("triton_tem_fused_convolution_relu_0") == "convolution" and kind_of("triton_tem_fused_mm_1") == "matmul"
    assert kind_of("nvjet_sm90_hsh_256x128_64x4_1x2_h_bz_coopA_TTT") == "matmul"      # cuBLAS on Hopper
    settings = tiny_settings().resolved()
    stages = build_stages("torch", "fp32", tiny_set, settings)
    x = torch.rand(tiny_set.image_shape)
    report = profile_pipeline(stages, 0.5, x, 8, tmp_path, "tiny", batches=2)
    assert (tmp_path / "tiny.kernels.txt").read_text().count("aten::") > 3
    assert json.loads((tmp_path / "tiny.kernels.json").read_text())["label"] == "tiny"
    assert sum(report["share_by_kind"].values()) == pytest.approx(1.0)
    assert report["share_by_kind"]["convolution"] > 0.1 and report["device_us_per_sample"] > 0
    assert "convolution" in summary_lines(report)[0]


def test_gpu_summary_reads_every_part_of_the_gpu_check(tmp_path):
    """The summary table of bench/gpu_check.sh: the bench runs with their targets, the kernel profile,
    the fused-attention ablation and the sequential table, from the files the script writes."""
    from click.testing import CliRunner

    from diffsmooth.bench.gpu_summary import summarize
    from diffsmooth.cli.bench import bench
    args = ["--models", "demo", "--method", "dds", "--n0", "2", "--n", "1000", "--measure-n", "4", "--batch", "2",
            "--reference-batch", "2", "--peak-tflops", "1", "--quiet"]
    out = CliRunner().invoke(bench, [*args, "--results", str(tmp_path / "bench.jsonl"), "--profile",
                                     str(tmp_path / "profile")])
    assert out.exit_code == 0, out.output
    out = CliRunner().invoke(bench, [*args, "--no-reference", "--results", str(tmp_path / "ablation.jsonl")])
    assert out.exit_code == 0, out.output
    (tmp_path / "sequential").mkdir()
    (tmp_path / "sequential" / "sequential.md").write_text("| run | samples (total) |\n| fixed | 5,050,000 |\n")
    (tmp_path / "steps.tsv").write_text("cifar10\t0\t97\t110\nimagenet\t124\t135\t135\n")
    text = summarize(tmp_path)
    row = next(line for line in text.splitlines() if line.startswith("| demo | 1,000 |"))
    assert "torch fp32" in row and row.count("|") == 11 and row.endswith("| - |")      # no GPU: no peak memory
    assert "| cifar10 | 0 | 97 | 110 |" in text and "| imagenet | timed out | 135 | 135 |" in text
    assert "demo: kernel profile" in text and "convolution" in text
    assert "ablation, demo without fused attention:" in text and "5,050,000" in text


def test_gpu_summary_of_the_fixes_part_names_the_gpu_and_the_table_variants(tmp_path):
    """A part without bench runs takes the GPU's name from the import step; the demo table's variants
    show rows and cells against the first, a variant whose cells moved says NO."""
    import json

    from diffsmooth.bench.gpu_summary import summarize
    (tmp_path / "import.log").write_text("torch 2.11.0+cu130 cuda 13.0 gpu NVIDIA H200\n")
    cells = {"RS": [1.0, 0.5]}
    variants = [{"name": "0-cpu-fp32", "wall_s": 30.4, "samples": 34940, "builds": 4, "compiles": 0, "cells": cells},
                {"name": "1-cuda-fp16-compile", "wall_s": 53.8, "samples": 34840, "builds": 4, "compiles": 5,
                 "cells": {"RS": [1.0, 0.25]}, "against_first": {"rows": 100, "equal": 97}}]
    (tmp_path / "table_gpu.txt").write_text(json.dumps(variants))
    text = summarize(tmp_path)
    assert text.startswith("GPU: NVIDIA H200") and "| models |" not in text
    assert "| 0-cpu-fp32 | 30.4 | 34,940 | 4 | 0 | (reference) | yes |" in text
    assert "| 1-cuda-fp16-compile | 53.8 | 34,840 | 4 | 5 | 97 of 100 | NO |" in text


def test_gpu_summary_lists_the_run_time_checks_and_every_test_log(tmp_path):
    """The certify steps' agreement-check verdicts (passed and refused) are listed by log, other lines are
    not, and each pytest log's last summary line is shown."""
    from diffsmooth.bench.gpu_summary import summarize
    (tmp_path / "diffusers_certify.txt").write_text(
        "# CUDA graph of denoiser at [2000, 1, 32, 32]: replay checked\n"
        "# fast path vs eager fp32 (TF32 off): 4 images x 500 samples: ... budget 10 flips each — ok\n"
        "wrote 20 rows (0 already done) to x.tsv\n"
        "# fast path vs eager fp32 (TF32 off): 4 images x 500 samples: ... budget 59 flips each — REFUSED\n"
        "error: the fast path disagrees with eager fp32: 70 of 2000 per-sample votes differ (budget 59)\n")
    (tmp_path / "diffusers_tests.log").write_text("tests/test_gpu.py::a PASSED\n=== 2 passed in 91.0s ===\n")
    (tmp_path / "gpu_tests_new.log").write_text("=== 1 failed, 3 passed in 120.2s ===\n")
    text = summarize(tmp_path)
    checks = [line for line in text.splitlines() if line.startswith("- diffusers_certify.txt: ")]
    assert len(checks) == 3 and checks[0].endswith("— ok") and "REFUSED" in checks[1] and "error:" in checks[2]
    assert "replay checked" not in text and "wrote 20 rows" not in text
    assert "GPU tests (diffusers_tests.log): 2 passed in 91.0s" in text
    assert "GPU tests (gpu_tests_new.log): 1 failed, 3 passed in 120.2s" in text


@pytest.mark.skipif(not demo_assets.DEMO_UNET.exists(), reason="embedded demo models not shipped")
def test_agreement_bench_judges_every_variant_and_checks_the_fast_path(monkeypatch):
    """The GPU check's agreement step end to end on the CPU (fp32 in place of the GPU precisions)."""
    from diffsmooth.bench import agreement
    monkeypatch.setattr(agreement, "VARIANTS", (("compiled fp16 (fast path)", "fp32", None),))
    doc = agreement.run("cpu", images=2, samples=24, batch=8, variants=["compiled fp16 (fast path)"])
    row, = doc["rows"]
    assert row["verdict"] == "ok" and row["samples"] == 48 and row["differ"] == 0
    assert doc["checks"]["repeat_identical"] and doc["checks"]["two_streams_equal_one"]
    assert "fast path: repeated run identical True" in agreement.table(doc)


@pytest.mark.skipif(not demo_assets.DEMO_DDPM.exists(), reason="the demo's diffusers denoiser is not built")
def test_agreement_bench_judges_dds_on_either_denoiser(monkeypatch):
    """The DDS setups (and DensePure's) smooth the clean-image classifier behind the demo UNet or the diffusers DDPM; a variant
    that is eager fp32 again agrees exactly, and without a compiled variant the fast-path checks are skipped."""
    pytest.importorskip("diffusers")
    from diffsmooth.bench import agreement
    from diffsmooth.engine.base_classifier.methods import MethodConfig
    monkeypatch.setattr(agreement, "VARIANTS", (("eager fp32 again", "fp32", {}),))
    what, _, sources = agreement.SETUPS["densepure"]            # its wiring at K = 2, S = 1: a tenth of the defaults
    monkeypatch.setitem(agreement.SETUPS, "densepure", (what, MethodConfig(
        "densepure", 0.5, options=(("reverse_runs", 2), ("steps", 1))), sources))
    for setup, denoiser in (("dds", "DiffusionDenoiser"), ("dds-diffusers", "DiffusersDenoiser"),
                            ("densepure", "DiffusionDenoiser")):
        doc = agreement.run("cpu", images=2, samples=24, batch=8, setup=setup, variants=["eager fp32 again"])
        row, = doc["rows"]
        assert doc["denoiser"] == denoiser and row["pipeline"].startswith(setup.split("-")[0] + ":")
        assert row["verdict"] == "ok" and row["differ"] == 0 and doc["checks"] == "no compiled variant judged"
    with pytest.raises(click.BadParameter, match="unknown variant"):
        agreement.run("cpu", images=2, samples=24, batch=8, variants=["eager fp64"])


def test_gpu_summary_sets_the_headline_tables_against_the_measured_one(tmp_path):
    """`headline`'s folders (one demo table per line) are summarised as samples, fixed-n, the factor and the change
    against the 2026-11-27 H200 table; a part without them prints no such table."""
    from click.testing import CliRunner

    from diffsmooth.bench.gpu_summary import HEADLINE_BEFORE, summarize
    from diffsmooth.cli import main
    assert "paper's shape" not in summarize(tmp_path)
    result = CliRunner().invoke(main, ["table", "--demo", "--rows", "rs", "--images", "4", "--n-max", "300",
                                       "--pilot", "2", "--quiet", "--out", str(tmp_path / "headline_rs")])
    assert result.exit_code == 0, result.output
    samples = json.loads((tmp_path / "headline_rs" / "summary.json").read_text())["samples"]
    row = next(l for l in summarize(tmp_path).splitlines() if l.startswith("| rs |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1:5] == [f"{samples['total']:,}", f"{samples['fixed_n']:,}",
                          f"{samples['fixed_n'] / samples['total']:.1f}x", f"{HEADLINE_BEFORE['rs']:,}"]
    assert cells[5] == f"{samples['total'] / HEADLINE_BEFORE['rs'] - 1:+.1%}" and cells[6].isdigit()


def test_a_methods_flops_count_its_unet_and_classifier_calls():
    """DensePure's sample costs K x S UNet calls and K classifier calls: the FLOP count multiplies the one-shot
    purifier's by its UNet calls and counts its classifier head on its K purified samples."""
    from diffsmooth.bench.harness import count_model_flops
    from diffsmooth.bench.models import build_model_set
    model_set = build_model_set("demo", "dds")
    dds = count_model_flops(model_set, tiny_settings(models="demo", method="dds"))
    dense = count_model_flops(model_set, tiny_settings(models="demo", method="densepure"))
    assert (dense["unet_calls_per_sample"], dense["classifier_calls_per_sample"]) == (20, 10)
    assert dense["denoiser_per_sample"] == 20 * dds["denoiser_per_sample"] > 0
    assert dense["classifier_per_sample"] == 10 * dds["classifier_per_sample"] > 0
    own = count_model_flops(model_set, tiny_settings(models="demo", method="densepure",
                                                     method_options=(("reverse_runs", "3"), ("steps", "1"))))
    assert (own["unet_calls_per_sample"], own["classifier_calls_per_sample"]) == (3, 3)       # `bench --option`


def test_bench_takes_a_methods_own_settings_and_refuses_others_in_one_line():
    from click.testing import CliRunner

    from diffsmooth.cli import main
    result = CliRunner().invoke(main, ["bench", "--method", "dds", "--option", "steps=2", "--quiet"])
    assert result.exit_code == 2 and "method dds has no setting 'steps'" in result.output, result.output
    assert "Traceback" not in result.output

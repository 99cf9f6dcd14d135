"""`diffsmooth bench --variants`: several fast-path variants measured in turn on the same models, each run
named and appended as it finishes, the baseline beside the first only, a failed or late variant skipped
with why (bench/variants.py, bench/harness.py)."""

from __future__ import annotations

import itertools
import json

import pytest
from test_bench import tiny_settings

from diffsmooth.bench import harness
from diffsmooth.bench.variants import parse_variant, parse_variants, variant_flags
from diffsmooth.engine.demo import shipped as demo_assets
from diffsmooth.engine.errors import UserError

pytestmark = pytest.mark.usefixtures("one_thread")     # tests/conftest.py


def test_variant_specs_parse_to_the_settings_they_change():
    assert parse_variant("default") == {}
    assert parse_variant("lean-unet+freezing+coordinate-descent+batch=64") == {
        "lean_unet": True, "inductor": ("freezing", "coordinate-descent"), "batch": 64}
    assert parse_variant("max-autotune+classifier-batch=400") == {
        "compile_mode": "max-autotune-no-cudagraphs", "classifier_batch": 400}
    assert variant_flags("triton-conv+batch=8") == {"triton_conv": True}
    assert parse_variant("triton-blocks") == parse_variant("triton-conv+triton-blocks") == {
        "triton_conv": True, "triton_blocks": True}
    assert parse_variants("default, lean-unet ,fused-conv") == ("default", "lean-unet", "fused-conv")


@pytest.mark.parametrize("spec, message", [("turbo", "unknown token"), ("batch=0", "integer"),
                                           ("batch=x", "integer"), ("freezing+freezing", "twice"),
                                           ("batch=4+batch=8", "twice"), ("fused-conv+triton-conv", "two kernels"),
                                           ("", "empty")])
def test_bad_variant_specs_are_refused_in_one_line(spec, message):
    with pytest.raises(UserError, match=message):
        parse_variant(spec)


def test_a_variant_named_twice_is_refused():
    with pytest.raises(UserError, match="named twice"):
        parse_variants("default,lean-unet,lean-unet")


def test_variants_that_cannot_run_are_refused_before_anything_is_built():
    with pytest.raises(UserError, match="need `compile`"):
        tiny_settings(variants=("default", "freezing")).resolved()


def test_each_variant_is_measured_on_the_same_models_and_appended_as_it_finishes(monkeypatch):
    from stage_fixtures import spread_classifier
    real = harness.build_model_set

    def spreading(*args, **kwargs):                 # a classifier whose votes spread, so equal counts mean something
        model_set = real(*args, **kwargs)
        model_set.classifier = spread_classifier(2)
        return model_set

    monkeypatch.setattr(harness, "build_model_set", spreading)
    lines = []
    doc = harness.run_bench(tiny_settings(images=1, variants=("default", "lean-unet", "classifier-batch=2")),
                            on_run=lines.append)
    assert [r["variant"] for r in doc["runs"]] == ["default", "lean-unet", "classifier-batch=2"]
    assert [line["run"]["variant"] for line in lines] == ["default", "lean-unet", "classifier-batch=2"]
    json.dumps(lines)
    default, lean, split = doc["runs"]
    assert "reference_equivalent" in default and "reference_equivalent" not in lean
    assert lean["fast_path"]["lean_unet"] is True and "lean_unet" not in default["fast_path"]
    assert lines[1]["settings"]["lean_unet"] is True and "lean_unet" not in lines[0]["settings"]
    assert split["fast_path"]["classifier_batch"] == 2 and lines[2]["settings"]["classifier_batch"] == 2
    assert lean["flops"]["denoiser_per_sample"] < default["flops"]["denoiser_per_sample"]
    counts = [[p["estimation_counts"] for p in r["measured"]["predictions"]] for r in doc["runs"]]
    assert counts[0] == counts[1] == counts[2]          # the same samples and maths: the same votes
    assert sum(1 for c in counts[0][0] if c) >= 2


def test_a_failing_variant_is_skipped_with_why_and_the_rest_still_run(monkeypatch):
    real = harness.build_stages

    def build(backend, precision, model_set, settings, m=None, workdir=None):
        if settings.asked_fast_path.lean_unet:
            raise RuntimeError("simulated kernel failure\nwith a long trace")
        return real(backend, precision, model_set, settings, m, workdir)

    monkeypatch.setattr(harness, "build_stages", build)
    doc = harness.run_bench(tiny_settings(images=1, reference=False,
                                          variants=("default", "lean-unet", "classifier-batch=2")))
    assert [r["variant"] for r in doc["runs"]] == ["default", "classifier-batch=2"]
    (skip,) = doc["skipped"]
    assert skip["variant"] == "lean-unet" and skip["reason"] == "failed: RuntimeError: simulated kernel failure"
    from diffsmooth.bench.report import render
    text = render(harness.to_jsonable(doc))
    assert "skipped variant lean-unet: failed: RuntimeError" in text and "[variant classifier-batch=2, batch 4]" in text


def test_a_variant_that_would_end_past_the_deadline_is_not_started(monkeypatch):
    clock = itertools.count(0, 100)                     # every look at the clock: 100 s later
    monkeypatch.setattr(harness.time, "perf_counter", lambda: float(next(clock)))
    doc = harness.run_bench(tiny_settings(images=1, reference=False, deadline_s=1500,
                                          variants=("default", "lean-unet", "classifier-batch=2")))
    ran = [r["variant"] for r in doc["runs"]]
    assert ran[0] == "default" and len(ran) < 3
    assert all("deadline" in s["reason"] for s in doc["skipped"]) and len(ran) + len(doc["skipped"]) == 3


def test_the_bench_command_appends_one_named_line_per_variant(tmp_path):
    from cli_helpers import invoke_ok
    results = tmp_path / "bench.jsonl"
    invoke_ok(["bench", "--models", "demo", "--n0", "10", "--n", "1000", "--measure-n", "20", "--batch", "10",
               "--no-reference", "--quiet", "--threads", "1", "--peak-tflops", "1",
               "--variants", "default,lean-unet", "--results", results])
    lines = [json.loads(line) for line in results.read_text().splitlines()]
    assert [line["run"]["variant"] for line in lines] == ["default", "lean-unet"]
    assert lines[1]["run"]["fast_path"]["lean_unet"] is True


@pytest.mark.skipif(not demo_assets.DEMO_UNET.exists(), reason="embedded demo models not shipped")
def test_agreement_judges_bench_variants_by_name_and_a_failing_one_says_so(monkeypatch):
    """bench.agreement --variants on the CPU (fp32 for the GPU's fp16): each variant a row named after it,
    its batch token dropped, one that cannot build a FAILED row, and the rest still judged."""
    from diffsmooth.bench import agreement
    monkeypatch.setattr(agreement, "SPEC_PRECISION", "fp32")
    doc = agreement.run("cpu", images=2, samples=8, batch=8, specs=("lean-unet+classifier-batch=4+batch=64",
                                                                    "max-autotune"))
    rows = {row["variant"]: row for row in doc["rows"]}
    assert list(rows) == ["compiled fp16 + lean-unet+classifier-batch=4", "compiled fp16 + max-autotune"]
    judged = rows["compiled fp16 + lean-unet+classifier-batch=4"]
    assert judged["verdict"] == "ok" and judged["differ"] == 0 and judged["spec"] == "lean-unet+classifier-batch=4"
    failed = rows["compiled fp16 + max-autotune"]            # on the CPU: a compile mode without --compile
    assert failed["verdict"] == "FAILED" and "need `compile`" in failed["problems"][0]
    assert "FAILED: UserError" in agreement.table(doc)


def test_gpu_summary_shows_each_variant_against_the_default_with_its_flips(tmp_path):
    from diffsmooth.bench.gpu_summary import summarize

    def line(variant, seconds, denoiser, phases=None):
        run = {"models": "cifar10", "variant": variant, "batch": 2000, "backend": "torch", "precision": "fp16",
               "rates": {"denoiser_samples_per_s": denoiser, "classifier_samples_per_s": 25100.0,
                         "pipeline_samples_per_s": 9830.0},
               "achieved": {"denoiser_fraction_of_peak": 0.278, "classifier_fraction_of_peak": 0.064},
               "extrapolated": {"seconds_per_image": {"100000": seconds}}, "warmup": {"first_batch_s": 50.0},
               "fast_path": {"compile": True}, "peak_memory": {"max_allocated_gib": 7.4, "max_reserved_gib": 14.1,
                                                              "phases": phases or {}}}
        return json.dumps({"machine": {"gpu": "NVIDIA H200"}, "settings": {"n": 100000}, "run": run})

    steady = {"warmup": {"max_allocated_gib": 7.4}, "steady": {"max_allocated_gib": 5.1}}
    (tmp_path / "bench.jsonl").write_text("\n".join([line("default", 8.57, 16400.0, steady),
                                                     line("lean-unet+classifier-batch=250", 6.0, 17000.0)]) + "\n")
    (tmp_path / "agreement.json").write_text(json.dumps({
        "device": "NVIDIA H200", "images": 12, "samples_per_image": 2000, "method": "diffsmooth",
        "rows": [{"variant": "compiled fp16 (fast path)", "differ": 0, "samples": 24000, "verdict": "ok",
                  "max_abs_score_diff": 0.001},
                 {"variant": "compiled fp16 + lean-unet", "differ": 2, "samples": 24000,
                  "verdict": "ok", "max_abs_score_diff": 0.001}], "checks": None}))
    (tmp_path / "bench_cifar10.txt").write_text("skipping variant max-autotune: past the deadline\n")
    text = summarize(tmp_path)
    rows = [r for r in text.splitlines() if r.startswith("| cifar10 | ")]
    default = next(r for r in rows if "| default |" in r)
    variant = next(r for r in rows if "| lean-unet+classifier-batch=250 |" in r)
    assert "16.4k (27.8%)" in default and "| 1.00x |" in default and "0 of 24000 (ok)" in default
    assert "| 7.4 / 5.1 |" in default and "| - / - |" in variant
    assert "| 1.43x |" in variant and "2 of 24000 (ok) as lean-unet" in variant     # classifier-batch moves no vote
    assert "- bench_cifar10.txt: skipping variant max-autotune: past the deadline" in text


def test_the_record_peak_is_the_most_of_its_phases_and_keeps_them():
    phases = {"warmup": {"max_allocated_gib": 115.3, "max_reserved_gib": 129.3},
              "timed": {"max_allocated_gib": 30.0, "max_reserved_gib": 40.0},
              "steady": {"max_allocated_gib": 14.0, "max_reserved_gib": 20.0, "current_allocated_gib": 3.0}}
    peak = harness._peak_over_phases(phases)
    assert (peak["max_allocated_gib"], peak["max_reserved_gib"]) == (115.3, 129.3) and peak["phases"] is phases
    assert harness._peak_over_phases({"warmup": {}}) == {}         # off CUDA: nothing measured

"""DensePure on the exported path: `diffsmooth export --method densepure` writes the reverse step alone as one
graph (x_t, t, c, noise) -> x_{t-1}, whose timestep and coefficients are inputs, so one file serves every step,
sigma and number of steps, and the majority-vote classifier over K runs; both are validated against torch with
the chains' own noises; `certify --backend onnxruntime` then writes the torch backend's rows."""

import json

import pytest
from cli_helpers import assert_rows_spread, invoke_ok, rows_without_time
from click.testing import CliRunner

from diffsmooth.cli import main
from diffsmooth.export.manifest import read_manifest

RUNS, STEPS = 3, 2
OPTIONS = ["--option", f"reverse_runs={RUNS}", "--option", f"steps={STEPS}"]
FAST = ["--n0", "6", "--n", "24", "--alpha", "0.2", "--batch", "8", "--quiet"]


def _model_args(tiny_models) -> list:
    return ["--denoiser", str(tiny_models["unet"]), "--preset", "cifar10", "--unet-config", tiny_models["unet_config"],
            "--classifier", str(tiny_models["classifier"])]


@pytest.mark.slow
def test_exported_step_and_vote_graphs_validate_and_certify_as_torch(tiny_models, tiny_cli_args, tmp_path):
    onnx_dir = tmp_path / "onnx"
    plain = ["export", *_model_args(tiny_models), "--method", "densepure", "--image-shape", "3,8,8",
             "--dataset", "npz", "--data", str(tiny_models["data"]), "--samples", "48", "--out", onnx_dir]
    export = [*plain, *OPTIONS]
    for sigma, extra in ((tiny_models["sigma"], []), ("0.5", ["--fp16"])):    # the same step graph rewritten
        output = invoke_ok([*export, "--sigma", sigma, *extra]).output
        assert output.count("ok ") == 2 * (1 + len(extra)), output   # the step graph and the vote graph, chained
    step, vote = "reverse_step_3x8x8_fp32.onnx", "classifier_densepure_s0.25_K3_3x8x8_fp32.onnx"
    assert sorted(p.name for p in onnx_dir.glob("reverse_step*.onnx")) == [step.replace("32", "16"), step]
    assert (onnx_dir / vote).is_file(), sorted(onnx_dir.iterdir())
    manifest = read_manifest((onnx_dir / step).with_suffix(".json"))
    assert (manifest["method"], manifest["purifier"], manifest["learned_variance"]) == ("densepure", "reverse-step",
                                                                                         True)
    assert manifest["inputs"] == {"x_t": ["batch", 3, 8, 8], "t": [1], "c": [7], "noise": ["batch", 3, 8, 8]}
    assert manifest["validation"]["passed"] and manifest["validation"]["denoiser"]["max_abs_err"] < 1e-4
    assert read_manifest((onnx_dir / vote).with_suffix(".json"))["inputs"] == {"x": ["batch", RUNS, 3, 8, 8]}
    invoke_ok(["validate", "--onnx-dir", onnx_dir, "--dataset", "npz", "--data", str(tiny_models["data"]),
               "--samples", "48"])

    rows = {}
    for backend in ("torch", "onnxruntime"):
        out = tmp_path / f"{backend}.tsv"
        invoke_ok(["certify", *tiny_cli_args, "--method", "densepure", *OPTIONS, *FAST, "--backend", backend,
                   "--onnx-dir", onnx_dir, "--out", out])
        rows[backend] = rows_without_time(out)
    assert_rows_spread(tmp_path / "torch.tsv", min_classes=3)
    assert rows["onnxruntime"] == rows["torch"]
    recorded = json.loads((tmp_path / "onnxruntime.tsv.settings.json").read_text())
    assert (recorded["backend"], recorded["reverse_runs"], recorded["steps"]) == ("onnxruntime", RUNS, STEPS)

    # five steps run on the same step graph; another K needs its own vote graph, said in one line
    invoke_ok(["certify", *tiny_cli_args, "--method", "densepure", "--option", f"reverse_runs={RUNS}",
               "--option", "steps=5", *FAST, "--max", "1", "--backend", "onnxruntime", "--onnx-dir", onnx_dir,
               "--out", tmp_path / "five.tsv"])
    result = CliRunner().invoke(main, ["certify", *tiny_cli_args, "--method", "densepure", "--option", "reverse_runs=4",
                                       *FAST, "--backend", "onnxruntime", "--onnx-dir", str(onnx_dir),
                                       "--out", str(tmp_path / "k4.tsv")])
    assert result.exit_code != 0 and "reverse_runs=3 (want 4)" in result.output, result.output
    assert "Traceback" not in result.output

    # a sweep over K on the exported graphs: the K = 3 chains around the step graph serve K = 1's vote graph too
    invoke_ok([*plain, "--sigma", tiny_models["sigma"], "--option", "reverse_runs=1", "--option", f"steps={STEPS}"])
    for backend in ("torch", "onnxruntime"):
        invoke_ok(["certify", *tiny_cli_args, "--method", "densepure", "--option", "reverse_runs=1,3", "--option",
                   f"steps={STEPS}", *FAST, "--backend", backend, "--onnx-dir", onnx_dir, "--out", tmp_path / backend])
    for name in ("densepure__clf__K1__S2.tsv", "densepure__clf__K3__S2.tsv"):
        assert rows_without_time(tmp_path / "onnxruntime" / name) == rows_without_time(tmp_path / "torch" / name)
    assert rows_without_time(tmp_path / "torch" / "densepure__clf__K3__S2.tsv") == rows["torch"]


@pytest.mark.slow
def test_tensorrt_engine_file_validation_chains_the_step_and_refuses_a_wrong_one(tiny_models, tmp_path):
    """validate_engine_files (what `build-engine` runs) on DensePure's two engine files, an ONNX Runtime stage of each
    graph standing in for TensorRT: the chains around the step's engine file and its ONNX reference draw the same keyed
    noises (the profile keeps the timestep and coefficients static); a step engine file that ignores its noise fails."""
    import torch

    from diffsmooth.engine.backends.onnxruntime.runner import OrtStage
    from diffsmooth.engine.backends.tensorrt.engine_files import (
        profile_for,
        read_engine_file_manifest,
        write_engine_file_manifest,
    )
    from diffsmooth.engine.base_classifier.denoise import load_denoiser
    from diffsmooth.engine.base_classifier.methods import MethodConfig
    from diffsmooth.engine.models.checkpoints import load_classifier
    from diffsmooth.export.onnx_export import export_models
    from diffsmooth.export.trt_build import EngineFileResult
    from diffsmooth.export.trt_validate import validate_engine_files
    from diffsmooth.export.validate import ValidationFailed

    torch.set_num_threads(1)
    config = MethodConfig("densepure", float(tiny_models["sigma"]), options=(("reverse_runs", 2), ("steps", 2)))
    denoiser = load_denoiser(tiny_models["unet"], "cifar10", **json.loads(tiny_models["unet_config"]))
    classifier = load_classifier(tiny_models["classifier"], dataset="cifar10")
    graphs = export_models(config, (3, 8, 8), tmp_path, denoiser=denoiser, classifier=classifier)
    results, stand_ins = [], {}
    for g in graphs:
        engine_file = tmp_path / f"{g.role}.plan"
        engine_file.write_bytes(b"stand-in")
        key = {"profile": profile_for(g.manifest["inputs"], 100), "precision": "fp32"}
        write_engine_file_manifest(engine_file, {"key": key, "plan_sha256": "-", "validation": None})
        results.append(EngineFileResult(g.path, engine_file, g.role, "fp32", g.manifest, {"key": key}, True))
        stand_ins[engine_file] = OrtStage(g.path, f"{g.role} stand-in", "cpu", "fp32", threads=1)
    assert results[0].manifest["key"]["profile"]["c"]["static"]
    out = validate_engine_files(results, tmp_path, stage_fn=lambda p, n, prec: stand_ins[p], threads=1, echo=print,
                                dataset="npz", data=str(tiny_models["data"]))
    res = out[str(tmp_path / "denoiser.plan")]
    assert res["passed"] and res["denoiser"]["max_abs_err"] == 0 and res["votes"]["samples"] >= 1000

    class Quiet:
        """A step engine file that adds no noise: another purifier."""
        name, device, precision = "quiet step", torch.device("cpu"), "fp32"

        def __call__(self, x, t, c, noise):
            return stand_ins[tmp_path / "denoiser.plan"](x, t, c, torch.zeros_like(noise))

    def broken(p, n, prec):
        return Quiet() if p.name == "denoiser.plan" else stand_ins[p]
    with pytest.raises(ValidationFailed, match="denoiser max abs err"):
        validate_engine_files(results, tmp_path, stage_fn=broken, threads=1, echo=print, dataset="npz",
                       data=str(tiny_models["data"]))
    assert read_engine_file_manifest(tmp_path / "denoiser.plan")[0]["validation"]["passed"] is False

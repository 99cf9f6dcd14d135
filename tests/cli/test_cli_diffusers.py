"""The command line with a diffusers denoiser folder: certify / predict / purify run on tiny DDPM and
consistency pipelines, the settings record the format and the weights' hash (a resume with another
model is refused), and every refusal is one line, exit code 2, with no result file written."""

import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

pytest.importorskip("diffusers")
pytest.importorskip("safetensors")

from cli_helpers import invoke_ok, rows_without_time  # noqa: E402
from diffusers import CMStochasticIterativeScheduler, DDPMScheduler  # noqa: E402
from diffusers_fixtures import save_pipeline, tiny_unet  # noqa: E402
from tiny_fixtures import SIGMA, centroid_classifier, tiny_images  # noqa: E402

from diffsmooth.cli import main  # noqa: E402
from diffsmooth.engine.base_classifier.denoise import load_denoiser  # noqa: E402
from diffsmooth.engine.models.checkpoints import save_cohen_checkpoint  # noqa: E402
from diffsmooth.engine.runs.results import read_rows  # noqa: E402


@pytest.fixture(scope="module")
def diffusers_models(tmp_path_factory):
    """A DDPM pipeline, a consistency pipeline, a classifier fitted to the DDPM one's denoised images, and data."""
    root = tmp_path_factory.mktemp("diffusers")
    ddpm = save_pipeline(root / "ddpm", tiny_unet(0), DDPMScheduler())
    cm = save_pipeline(root / "cm", tiny_unet(1), CMStochasticIterativeScheduler())
    images = tiny_images()
    purify = load_denoiser(ddpm, None).purifier(SIGMA)
    save_cohen_checkpoint(root / "clf.pt", centroid_classifier(0, images, SIGMA, purify), "cifar_resnet20")
    np.savez(root / "data.npz", images=images, labels=np.arange(6))
    return {"ddpm": ddpm, "cm": cm, "classifier": root / "clf.pt", "data": root / "data.npz", "root": root}


def _args(models, denoiser, out, *extra):
    return ["--denoiser", denoiser, "--classifier", models["classifier"], "--dataset", "npz", "--data",
            models["data"], "--sigma", SIGMA, "--n0", 10, "--n", 60, "--batch", 40, "--out", out, *extra]


def _refused(args, match):
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and match in lines[0], result.output
    return lines[0]


@pytest.mark.slow
def test_certify_dds_with_a_pipeline_folder_records_its_identity_and_resumes(diffusers_models, tmp_path):
    out = tmp_path / "dds.tsv"
    invoke_ok(["certify", *_args(diffusers_models, diffusers_models["ddpm"], out, "--method", "dds")])
    rows = read_rows(out)
    assert [int(r["idx"]) for r in sorted(rows, key=lambda r: int(r["idx"]))] == list(range(6))
    assert len({r["predict"] for r in rows}) >= 2
    settings = json.loads((out.parent / (out.name + ".settings.json")).read_text())
    assert settings["denoiser_format"] == "diffusers UNet2DModel + DDPMScheduler"
    assert len(settings["denoiser_sha256"]) == 64 and settings["preset"] is None
    invoke_ok(["certify", *_args(diffusers_models, diffusers_models["ddpm"], out, "--method", "dds")])   # resumes
    assert len(read_rows(out)) == 6


def test_resume_with_another_model_in_the_same_folder_is_refused(diffusers_models, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(diffusers_models["ddpm"], folder)
    out = tmp_path / "dds.tsv"
    invoke_ok(["certify", *_args(diffusers_models, folder, out, "--method", "dds", "--max", 2)])
    before = out.read_text()
    shutil.rmtree(folder)
    save_pipeline(folder, tiny_unet(7), DDPMScheduler())          # other weights, same path and configs
    _refused(["certify", *_args(diffusers_models, folder, out, "--method", "dds")], "denoiser_sha256")
    assert out.read_text() == before


@pytest.mark.slow
def test_unet_folder_with_scheduler_equals_the_pipeline_folder(diffusers_models, tmp_path):
    a, b = tmp_path / "a.tsv", tmp_path / "b.tsv"
    ddpm = diffusers_models["ddpm"]
    invoke_ok(["certify", *_args(diffusers_models, ddpm, a, "--method", "diffsmooth", "--m", 3, "--max", 3)])
    invoke_ok(["certify", *_args(diffusers_models, ddpm / "unet", b, "--method", "diffsmooth", "--m", 3, "--max", 3,
                                 "--scheduler", ddpm / "scheduler")])
    assert rows_without_time(a) == rows_without_time(b)


def test_predict_with_a_consistency_model(diffusers_models, tmp_path):
    out = tmp_path / "cm.tsv"
    invoke_ok(["predict", *_args(diffusers_models, diffusers_models["cm"], out, "--method", "diffsmooth", "--m", 3)])
    assert len(read_rows(out)) == 6
    settings = json.loads((tmp_path / "cm.tsv.settings.json").read_text())
    assert settings["denoiser_format"] == "diffusers UNet2DModel + CMStochasticIterativeScheduler"


def test_purify_takes_a_folder(diffusers_models, tmp_path):
    out = tmp_path / "grid.png"
    invoke_ok(["purify", "--denoiser", diffusers_models["cm"], "--dataset", "npz", "--data", diffusers_models["data"],
               "--sigma", SIGMA, "--images", 3, "--out", out])
    assert out.stat().st_size > 0


def test_refusals_are_one_line_exit_2_and_write_nothing(diffusers_models, tmp_path):
    out = tmp_path / "r.tsv"
    cm, ddpm = diffusers_models["cm"], diffusers_models["ddpm"]
    _refused(["certify", *_args(diffusers_models, cm, out, "--method", "dds", "--sigma", 50)], "outside its")
    _refused(["certify", *_args(diffusers_models, ddpm, out, "--method", "dds", "--preset", "cifar10")], "leave out")
    _refused(["certify", *_args(diffusers_models, ddpm, out, "--method", "dds", "--scheduler", cm)], "pipeline folder")
    _refused(["certify", *_args(diffusers_models, ddpm / "unet", out, "--method", "dds")], "without a scheduler")
    latent = tmp_path / "latent"
    shutil.copytree(ddpm, latent)
    index = json.loads((latent / "model_index.json").read_text())
    (latent / "model_index.json").write_text(json.dumps(dict(index, vae=["diffusers", "AutoencoderKL"])))
    assert "pixel space" in _refused(["certify", *_args(diffusers_models, latent, out, "--method", "dds")], "latent")
    assert not out.exists() and not (tmp_path / "r.tsv.settings.json").exists()


@pytest.mark.slow
def test_table_line_with_a_folder_reuses_the_model_across_sigmas(diffusers_models, tmp_path):
    """A table spec's [models] denoiser is a folder; the model built at one sigma and moved to the next
    writes the rows a table of that sigma alone writes."""
    def spec(sigmas):
        text = (f'title = "t"\nsigmas = {sigmas}\nradii = [0.0, 0.25]\nn0 = 10\nn_max = 60\n'
                f'[data]\ndataset = "npz"\ndata = "{diffusers_models["data"]}"\n'
                f'[models]\ndenoiser = "{diffusers_models["ddpm"]}"\n[run]\nbatch = 40\n'
                f'[[line]]\nname = "DDS"\nmethod = "dds"\nclassifier = "{diffusers_models["classifier"]}"\n')
        path = tmp_path / f"spec{len(sigmas)}.toml"
        path.write_text(text)
        return path
    invoke_ok(["table", spec([0.25, 0.5]), "--out", tmp_path / "two", "--plan", "all"])
    invoke_ok(["table", spec([0.25]), "--out", tmp_path / "one", "--plan", "all"])
    rows = [rows_without_time(tmp_path / name / "runs" / "dds_s0.25.tsv") for name in ("two", "one")]
    assert rows[0] == rows[1] and len(rows[0]) == 6


@pytest.mark.slow
def test_a_line_with_its_own_denoiser_writes_the_rows_of_a_table_with_that_denoiser(diffusers_models, tmp_path):
    """Two DDS lines side by side, [models]' consistency model and a line's own DDPM folder: the DDPM line's
    rows are those of a table whose [models] denoiser is the DDPM folder, and the two lines differ."""
    def spec(name, models_denoiser, line_denoiser=None):
        own = f'denoiser = "{line_denoiser}"\n' if line_denoiser else ""
        text = (f'title = "t"\nsigmas = [0.25]\nradii = [0.0, 0.25]\nn0 = 10\nn_max = 60\n'
                f'[data]\ndataset = "npz"\ndata = "{diffusers_models["data"]}"\n'
                f'[models]\ndenoiser = "{models_denoiser}"\n[run]\nbatch = 40\n'
                f'[[line]]\nname = "DDS"\nmethod = "dds"\nclassifier = "{diffusers_models["classifier"]}"\n'
                + (f'[[line]]\nname = "DDS own"\nmethod = "dds"\nclassifier = "{diffusers_models["classifier"]}"\n'
                   + own if line_denoiser else ""))
        path = tmp_path / f"{name}.toml"
        path.write_text(text)
        return path
    invoke_ok(["table", spec("both", diffusers_models["cm"], diffusers_models["ddpm"]), "--out", tmp_path / "both",
               "--plan", "all"])
    invoke_ok(["table", spec("ddpm", diffusers_models["ddpm"]), "--out", tmp_path / "ddpm", "--plan", "all"])
    own = rows_without_time(tmp_path / "both" / "runs" / "dds-own_s0.25.tsv")
    assert own == rows_without_time(tmp_path / "ddpm" / "runs" / "dds_s0.25.tsv") and len(own) == 6
    assert len({row["predict"] for row in own}) >= 2, own                 # votes spread over classes
    assert own != rows_without_time(tmp_path / "both" / "runs" / "dds_s0.25.tsv")
    settings = json.loads((tmp_path / "both" / "runs" / "dds-own_s0.25.tsv.settings.json").read_text())
    assert "ddpm" in json.dumps(settings)


def test_a_run_reads_its_pipeline_folder_once(diffusers_models, tmp_path, monkeypatch):
    """Planning (sources, the sigma check, the recorded identity) and loading read the folder's configs once."""
    from diffsmooth.engine.base_classifier import diffusers_denoise
    from diffsmooth.engine.models import diffusers_folder
    from diffsmooth.engine.runs import sources
    from diffsmooth.engine.runs.assemble import load_denoiser_from
    from diffsmooth.engine.runs.request import RunRequest
    from diffsmooth.engine.runs.resolve import resolve_run
    reads = []
    read = diffusers_folder.read_diffusers_folder
    for module in (sources, diffusers_denoise, diffusers_folder):
        monkeypatch.setattr(module, "read_diffusers_folder", lambda *a: reads.append(a) or read(*a))
    m = diffusers_models
    run = resolve_run(RunRequest.parse("certify", out=str(tmp_path / "dds.tsv"), denoiser=str(m["ddpm"]), method="dds",
                                    classifier=str(m["classifier"]), dataset="npz", data=str(m["data"]), sigma=SIGMA))
    assert run.recorded()["denoiser_format"] == "diffusers UNet2DModel + DDPMScheduler"
    assert load_denoiser_from(run.sources).folder is run.sources.diffusers
    assert len(reads) == 1

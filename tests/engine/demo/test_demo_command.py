"""The main job end to end at a tiny n on the shipped models and data, and the purify figure."""

import numpy as np
import pytest
from click.testing import CliRunner

from diffsmooth.cli import main
from diffsmooth.engine.demo import shipped as demo_assets
from diffsmooth.engine.runs.results import read_rows

pytestmark = pytest.mark.skipif(not demo_assets.DEMO_UNET.exists(), reason="embedded demo weights not built")


@pytest.mark.slow
def test_demo_runs_end_to_end(tmp_path):
    out = tmp_path / "demo"
    result = CliRunner().invoke(main, ["demo", "--out", str(out), "--images", "2", "--n", "30", "--n0", "10",
                                       "--batch", "40", "--quiet"])
    assert result.exit_code == 0, result.output
    for method in ("rs", "dds", "diffsmooth"):
        rows = read_rows(out / f"{method}.tsv")
        assert [int(r["idx"]) for r in rows] == [0, 250]
        assert f"| {method} | 2 |" in result.output
    assert (out / "certified_accuracy.png").stat().st_size > 1000
    assert "n=30" in (out / "summary.md").read_text()


@pytest.mark.slow
def test_demo_refuses_a_folder_of_other_settings(tmp_path):
    out = tmp_path / "demo"
    base = ["demo", "--out", str(out), "--images", "2", "--n0", "10", "--batch", "40", "--quiet"]
    assert CliRunner().invoke(main, [*base, "--n", "20"]).exit_code == 0
    before = {p.name: p.read_text() for p in out.iterdir() if p.suffix in (".tsv", ".md")}
    for other in (["--n", "24"], ["--n", "20", "--images", "3"], ["--n", "20", "--sigma", "0.25"]):
        result = CliRunner().invoke(main, [*base, *other])
        assert result.exit_code == 2, result.output
        lines = [l for l in result.output.splitlines() if l.strip()]
        assert len(lines) == 1 and lines[0].startswith("error:") and "another --out" in lines[0]
    assert {p.name: p.read_text() for p in out.iterdir() if p.suffix in (".tsv", ".md")} == before
    again = CliRunner().invoke(main, [*base, "--n", "20"])             # same settings: continues, nothing new
    assert again.exit_code == 0, again.output
    assert all(len(read_rows(out / f"{m}.tsv")) == 2 for m in ("rs", "dds", "diffsmooth"))
    (out / "rs.tsv.settings.json").unlink()                           # rows whose settings are unknown
    assert "not recorded" in CliRunner().invoke(main, [*base, "--n", "20"]).output


def test_certify_without_model_or_data_uses_the_embedded_demo(tmp_path):
    out = tmp_path / "c.tsv"
    result = CliRunner().invoke(main, ["certify", "--method", "dds", "--n0", "5", "--n", "20", "--batch", "25",
                                       "--max", "2", "--quiet", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert len(read_rows(out)) == 2


def test_purify_writes_the_figure(tmp_path):
    from PIL import Image
    out = tmp_path / "grid.png"
    result = CliRunner().invoke(main, ["purify", "--images", "3", "--m", "2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    image = np.asarray(Image.open(out).convert("L"))
    # rows: clean, noisy, denoised, 2 locally noised; 32x32 tiles scaled 3x, after a column of labels
    tiles = 3 * (32 * 3 + 2)
    assert image.shape[0] == 5 * 32 * 3 and image.shape[1] > tiles
    labels = image[:, : image.shape[1] - tiles]
    assert all((labels[k * 96:(k + 1) * 96] < 128).any() for k in range(5))     # every row has its label

"""The README's Python example runs as written (on the embedded demo models), and the public API
refuses what it must."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def readme_python() -> str:
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    assert len(blocks) == 1
    return blocks[0]


@pytest.mark.slow
def test_readme_python_example_runs_as_written(tmp_path, monkeypatch, capsys):
    code = readme_python()
    assert len(code.strip().splitlines()) <= 15
    monkeypatch.chdir(tmp_path)
    scope = {}
    exec(compile(code, "README.md", "exec"), scope)
    printed = capsys.readouterr().out.splitlines()
    label, prediction, radius = printed[0].split()
    assert int(label) == 0 or int(label) > 0                 # a label, the class, the radius as numbers
    assert int(prediction) >= -1 and float(radius) >= 0
    rows = (tmp_path / "diffsmooth.tsv").read_text().splitlines()
    assert rows[0].split("\t") == ["idx", "label", "predict", "radius", "correct", "time"] and len(rows) == 6
    assert "wrote 5 rows" in printed[1]
    predictions = {line.split("\t")[2] for line in rows[1:]}
    assert len(predictions - {"-1"}) >= 3, predictions
    # the same dataset call again resumes: nothing new to write (the example's own objects, not a second run of it)
    again = scope["model"].certify_dataset(scope["data"], "diffsmooth.tsv", n0=100, n=200, alpha=0.001, skip=100)
    assert "wrote 0 rows (5 already done)" in again.line()
    assert 'certify_dataset(data, "diffsmooth.tsv", n0=100, n=200, alpha=0.001, skip=100)' in code


def test_api_certificate_matches_the_command_line_row(tmp_path):
    """DiffSmooth.certify is the CLI's CERTIFY: the same image index and seed give the CLI's row."""
    from click.testing import CliRunner

    from diffsmooth import DiffSmooth, load_dataset, load_demo_classifier, load_demo_denoiser
    from diffsmooth.cli import main
    out = tmp_path / "r.tsv"
    r = CliRunner().invoke(main, ["certify", "--method", "dds", "--sigma", "0.5", "--n0", "20", "--n", "200",
                                  "--batch", "64", "--skip", "100", "--max", "250", "--quiet", "--out", str(out)])
    assert r.exit_code == 0, r.output
    from diffsmooth import DenoisedSmoothing
    from diffsmooth.engine.runs.results import format_radius
    model = DenoisedSmoothing(denoiser=load_demo_denoiser(), classifier=load_demo_classifier(0.0), sigma=0.5, batch=64)
    data = load_dataset("embedded")
    assert len(out.read_text().splitlines()) == 1 + 3                  # images 0, 100 and 200
    for line in out.read_text().splitlines()[1:]:
        idx, label, predict, radius = line.split("\t")[:4]
        c = model.certify(data[int(idx)][0], n0=20, n=200, alpha=0.001, image_index=int(idx))
        assert (c.prediction, format_radius(c.radius)) == (int(predict), radius)
    assert isinstance(DiffSmooth, type)


def test_api_refuses_a_missing_image_index_and_bad_inputs():
    import torch

    from diffsmooth import RandomizedSmoothing, load_demo_classifier
    from diffsmooth.engine.errors import UserError
    model = RandomizedSmoothing(classifier=load_demo_classifier(0.5), sigma=0.5)
    x = torch.rand(1, 32, 32)
    with pytest.raises(UserError, match="give `image_index`"):
        model.certify(x, n0=10, n=20, alpha=0.001)
    with pytest.raises(UserError, match="one image"):
        model.certify(x[None], n0=10, n=20, alpha=0.001, image_index=0)
    with pytest.raises(UserError, match="alpha"):
        model.certify(x, n0=10, n=20, alpha=2.0, image_index=0)
    with pytest.raises(UserError, match="denoiser"):
        from diffsmooth import DiffSmooth
        DiffSmooth(denoiser=None, classifier=load_demo_classifier(0.5), sigma=0.5)
    assert model.predict(x, n=50, alpha=0.001, image_index=3) >= -1


def test_api_checks_a_fast_path_at_its_methods_flip_rate(monkeypatch):
    """The API's once-per-shape agreement check expects the measured flip rate of its method and precision:
    DDS's (a clean-trained classifier) is higher than the noise-trained classifiers' (RS, DiffSmooth)."""
    import torch

    from diffsmooth import DenoisedSmoothing, RandomizedSmoothing, load_demo_classifier, load_demo_denoiser
    from diffsmooth.engine import pipelines
    from diffsmooth.engine.runs.vote_agreement import design_flip_rate
    seen = []
    monkeypatch.setattr(pipelines, "check_against_eager",
                        lambda *args, expected_flip_rate, **kw: seen.append(expected_flip_rate))
    x = torch.rand(1, 32, 32)
    DenoisedSmoothing(denoiser=load_demo_denoiser(), classifier=load_demo_classifier(0.0), sigma=0.5,
                      compile=True).smooth_for(x.shape, (0, x))
    RandomizedSmoothing(classifier=load_demo_classifier(0.5), sigma=0.5, compile=True).smooth_for(x.shape, (0, x))
    assert seen == [design_flip_rate("fp32", ["dds"]), design_flip_rate("fp32", ["rs"])] and seen[0] > seen[1]

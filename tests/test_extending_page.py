"""docs/extending.md's "Files to touch" rows for a backend and a command, held to: a toy backend and a toy command
are each added by touching exactly the files the page's row names (read from the page, so the test fails when the
page's list drifts from what an extension needs), and each then runs: the toy backend certifies (in a copy of the
product, with its rows those of the torch backend), the toy command answers through `diffsmooth` (click's CliRunner)."""

import importlib
import os
import re
import shutil
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import click
import pytest
from cli_helpers import rows_without_time
from click.testing import CliRunner
from test_docs_cli import commands, long_options, names, sections
from test_docs_layout import named_in_table

import diffsmooth.cli as cli_package
from diffsmooth.cli import group, main

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "extending.md"
CODE = re.compile(r"`([^`]+)`")


def files_to_touch(extension: str, name: str) -> set:
    """The paths the page's row for `extension` names, NAME read as `name`: a backticked path (a "/" in it, or a
    root file such as `pyproject.toml`); a folder (ending in "/") owns the bare `.py` names after it in the row."""
    rows = [line for line in PAGE.read_text().splitlines() if line.startswith(f"| {extension} |")]
    assert len(rows) == 1, f"docs/extending.md has {len(rows)} rows for {extension!r} in its table of files to touch"
    found, folder = set(), None
    for code in CODE.findall(rows[0]):
        code = code.replace("NAME", name)
        if code.endswith("/"):
            folder = code
        elif "/" in code:
            found.add(code)
        elif re.fullmatch(r"[\w.-]+\.py", code) and folder:
            found.add(folder + code)
        elif re.fullmatch(r"[\w.-]+\.(toml|md)", code):
            found.add(code)
    return found


def test_the_page_rows_read_as_documented():
    """The reader of the rows: a folder's files, paths, root files; names of code (`STAGE_BACKENDS`) are not files."""
    assert files_to_touch("a new backend", "toy") >= {"engine/backends/toy/backend.py", "engine/choices.py",
                                                      "pyproject.toml", "docs/layout.md"}
    assert "diffsmooth/cli/toy.py" in files_to_touch("a new command", "toy")


# ---- a toy backend: eager fp32 torch modules on the CPU, one configuration at a time -----------------------------
TOY_BACKEND = {
    "__init__.py": '''
        """The toy backend (tests/test_extending_page.py): plain torch modules, eager fp32 on the CPU."""
        ''',
    "backend.py": '''
        """The toy backend as a run sees it: the models loaded by the run, its stages plain eager modules."""

        from diffsmooth.engine.errors import UserError
        from diffsmooth.engine.backends.toy.stages import build_toy_stages


        class ToyStages:
            name = "toy"
            runs_modules = False
            accepts_torch_options = False

            def stages(self, config, sources, image_shape, num_classes, build):
                denoiser, classifier = build.modules(config, sources)
                return build_toy_stages(config, classifier, denoiser, image_shape, num_classes)

            def sweep_stages(self, configs, classifier_paths, sources, image_shape, num_classes, build):
                raise UserError("the toy backend runs one configuration at a time")

            def fast_path_defaults(self, cuda, compile, asked):
                return {}
        ''',
    "stages.py": '''
        """A method config's stages on the toy backend: its purifier's stage and its head's module, probed once."""

        from diffsmooth.engine.stages.base import BaseClassifierStages
        from diffsmooth.engine.base_classifier.probe import probed
        from diffsmooth.engine.backends.toy.runner import EagerRunner


        def build_toy_stages(config, classifier, denoiser, image_shape, num_classes):
            runner = EagerRunner()
            purify = config.purifier.stage(config.sigma, denoiser, runner) if config.purifier.purifies else None
            score = runner.stage(config.method.score_head(config, classifier, image_shape), "classifier")
            stages = BaseClassifierStages(config.name, purify, score, num_classes or 0,
                                          config.head.fresh_noise_shape(image_shape),
                                          purify_noise=config.purifier.draws_noise and purify is not None,
                                          purified_shape=config.purifier.purified_shape(image_shape))
            return probed(stages, tuple(image_shape), num_classes)
        ''',
    "runner.py": '''
        """A torch module as a stage: eager, fp32, on the CPU."""

        import torch


        class EagerStage:
            def __init__(self, module, name):
                self.module, self.name, self.weights = module.eval(), name, module
                self.device, self.precision = torch.device("cpu"), "fp32"

            def __call__(self, *inputs):
                with torch.inference_mode():
                    return self.module(*inputs).float()


        class EagerRunner:
            device, precision, log = torch.device("cpu"), "fp32", None

            def stage(self, module, name):
                return EagerStage(module, name)

            def for_classifier(self):
                return self
        ''',
}


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, f"{path}: {old!r} is not there once (the product moved: update this test)"
    path.write_text(text.replace(old, new))


def _backend_touches(copy: Path) -> dict:
    """{path from the root: how the toy backend touches it in `copy`}: each file the page names, no other."""
    folder = "engine/backends/toy/"
    touches = {folder + name: (lambda name=name, body=body: (copy / folder / name).write_text(
        textwrap.dedent(body).lstrip())) for name, body in TOY_BACKEND.items()}
    touches["engine/backends/registry.py"] = lambda: (
        _edit(copy / "engine/backends/registry.py", "from diffsmooth.engine.backends.torch.backend import "
              "TorchBackend\n", "from diffsmooth.engine.backends.torch.backend import TorchBackend\n"
              "from diffsmooth.engine.backends.toy.backend import ToyStages\n"),
        _edit(copy / "engine/backends/registry.py", "TensorRTBackend())}", "TensorRTBackend(), ToyStages())}"))
    touches["engine/choices.py"] = lambda: _edit(copy / "engine/choices.py", '"tensorrt")\n', '"tensorrt", "toy")\n')
    touches["pyproject.toml"] = lambda: (
        _edit(copy / "pyproject.toml", '    "diffsmooth.engine.backends.tensorrt",\n',
              '    "diffsmooth.engine.backends.tensorrt",\n    "diffsmooth.engine.backends.toy",\n'),
        _edit(copy / "pyproject.toml", '    "torch | exported",\n', '    "torch | exported | toy",\n'))
    touches["docs/layout.md"] = lambda: _edit(
        copy / "docs/layout.md", "\n| `engine/backends/torch/` |",
        "\n| `engine/backends/toy/` | a toy backend: `backend.py`, `stages.py`, `runner.py` |"
        "\n| `engine/backends/torch/` |")
    return touches


def _product_copy(copy: Path) -> None:
    """The product's source (no results, assets or caches), the layout page and pyproject.toml, in `copy`."""
    skip = shutil.ignore_patterns("__pycache__", "results", "assets", "*.pt", "*.npz", "*.onnx")
    for folder in ("engine", "export", "bench", "studies"):
        shutil.copytree(ROOT / folder, copy / folder, ignore=skip)
    shutil.copytree(ROOT / "diffsmooth", copy / "diffsmooth", symlinks=True, ignore=skip)
    (copy / "docs").mkdir()
    shutil.copy(ROOT / "docs" / "layout.md", copy / "docs" / "layout.md")
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    (copy / "engine/backends/toy").mkdir()


RUN_BOTH = """
import sys
from click.testing import CliRunner
import diffsmooth
from diffsmooth.cli import main
from diffsmooth.engine.choices import BACKENDS
from diffsmooth.engine.backends.registry import STAGE_BACKENDS, stage_backend
assert diffsmooth.__file__.startswith(sys.argv[1]), diffsmooth.__file__
assert tuple(STAGE_BACKENDS) == BACKENDS and type(stage_backend("toy")).__module__.endswith(".toy.backend")
for backend, out in (("torch", sys.argv[2]), ("toy", sys.argv[3])):
    result = CliRunner().invoke(main, [*sys.argv[4:], "--backend", backend, "--out", out])
    assert result.exit_code == 0, (backend, result.output)
"""


def _package_folders_missing(root: Path, pyproject: str) -> list:
    """The package folders under engine/ that `pyproject`'s packages leave out (tests/test_ci.py's rule)."""
    listed = set(tomllib.loads(pyproject)["tool"]["setuptools"]["packages"])
    folders = [init.parent.relative_to(root) for init in (root / "engine").rglob("__init__.py")]
    return [p for p in (".".join(("diffsmooth", *f.parts)) for f in folders) if p not in listed]


def test_a_toy_backend_touching_the_pages_files_certifies_as_torch(tiny_models, tiny_cli_args, tmp_path):
    """In a copy of the product, the toy backend added by the page's files alone: the registry, the command line's
    choices, the packages, the import contract and the layout page take it, and `certify --backend toy` writes the
    torch backend's rows (eager fp32 on the CPU both)."""
    copy = tmp_path / "copy"
    _product_copy(copy)
    touches = _backend_touches(copy)
    assert set(touches) == files_to_touch("a new backend", "toy")
    for touch in touches.values():
        touch()

    modules = {p.relative_to(copy).as_posix() for p in (copy / "engine").rglob("*.py") if p.name != "__init__.py"}
    toy_modules = {m for m in modules if "/toy/" in m}
    assert len(toy_modules) == 3 and toy_modules & named_in_table((ROOT / "docs/layout.md").read_text()) == set()
    assert not modules - named_in_table((copy / "docs/layout.md").read_text())
    assert _package_folders_missing(copy, (ROOT / "pyproject.toml").read_text()) == ["diffsmooth.engine.backends.toy"]
    assert _package_folders_missing(copy, (copy / "pyproject.toml").read_text()) == []
    contract = next(c for c in tomllib.loads((copy / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
                    if c["id"] == "backend-folders")
    assert any("toy" in layer.split(" | ") for layer in contract["layers"])
    env = dict(os.environ, PYTHONPATH=str(copy))
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    linted = subprocess.run([lint, "--no-cache", "--contract", "backend-folders"], cwd=copy, env=env,
                            capture_output=True, text=True, check=False)
    assert linted.returncode == 0 and "0 broken" in linted.stdout, linted.stdout + linted.stderr

    torch_rows, toy_rows = tmp_path / "torch.tsv", tmp_path / "toy.tsv"
    args = ["certify", *tiny_cli_args, "--method", "dds", "--n0", "8", "--n", "40", "--batch", "16", "--quiet"]
    ran = subprocess.run([sys.executable, "-c", RUN_BOTH, str(copy), str(torch_rows), str(toy_rows), *args],
                         cwd=copy, env=env, capture_output=True, text=True, check=False, timeout=300)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert rows_without_time(toy_rows) == rows_without_time(torch_rows)
    assert len({r["predict"] for r in rows_without_time(toy_rows)}) >= 3


# ---- a toy command: the certified radius of a lower bound p_A -----------------------------------------------------
TOY_COMMAND = '''
    """`diffsmooth toy-radius`: the certified L2 radius sigma * Phi^-1(p_A) of a lower bound p_A (a toy command,
    tests/test_extending_page.py)."""

    import math
    from statistics import NormalDist

    import click

    from diffsmooth.engine.errors import UserError


    @click.command("toy-radius")
    @click.option("--p-a", type=float, required=True, help="A lower bound of the top class's probability.")
    @click.option("--sigma", type=float, default=0.25, show_default=True, help="The smoothing noise's std.")
    def toy_radius(p_a, sigma):
        """The certified radius of a lower bound p_A."""
        if not 0.5 < p_a < 1:
            raise UserError(f"`p_a` must lie in (0.5, 1), got {p_a}")
        if not (math.isfinite(sigma) and sigma > 0):
            raise UserError(f"`sigma` must be > 0, got {sigma}")
        click.echo(f"{sigma * NormalDist().inv_cdf(p_a):.6f}")
    '''
TOY_SECTION = "\n### `toy-radius`\n\nThe certified radius of `--p-a` at `--sigma`.\n"


@pytest.fixture
def fuzz_cases(monkeypatch):
    """tests/fuzz/test_fuzz_options.py as a module (its CASES and oracles) with tests/fuzz/ on the path; the toy's
    cases stay out of the fuzz run's reliability ledger."""
    monkeypatch.syspath_prepend(str(ROOT / "tests" / "fuzz"))
    cases = importlib.import_module("test_fuzz_options")
    monkeypatch.setattr(importlib.import_module("reliability_ledger"), "record", lambda *args: None)
    return cases


@pytest.fixture
def cli_overlay(tmp_path, monkeypatch):
    """A folder read as part of diffsmooth/cli/ (where the toy command's module goes), gone after the test."""
    overlay = tmp_path / "cli"
    overlay.mkdir()
    monkeypatch.setattr(cli_package, "__path__", [*cli_package.__path__, str(overlay)])
    sys.modules.pop("diffsmooth.cli.toy", None)
    yield overlay
    sys.modules.pop("diffsmooth.cli.toy", None)


def test_a_toy_command_touching_the_pages_files_runs(tmp_path, monkeypatch, fuzz_cases, cli_overlay):
    """The toy command added by the page's files alone (its module beside diffsmooth/cli/'s, at run time): `diffsmooth
    --help` lists it, it runs, docs/cli.md's check misses it until its section is there, and each of its numeric
    options is fuzzed (refused in one line or accepted)."""
    overlay = cli_overlay
    page = {"docs/cli.md": (ROOT / "docs" / "cli.md").read_text()}
    touches = {
        "diffsmooth/cli/toy.py": lambda: (overlay / "toy.py").write_text(textwrap.dedent(TOY_COMMAND).lstrip()),
        "diffsmooth/cli/group.py": lambda: monkeypatch.setitem(group.COMMANDS, "toy-radius", group.Command(
            "diffsmooth.cli.toy", "toy_radius", "The certified L2 radius of a lower bound p_A (a toy).")),
        "docs/cli.md": lambda: page.update({"docs/cli.md": page["docs/cli.md"] + TOY_SECTION}),
        "tests/fuzz/test_fuzz_options.py": lambda: monkeypatch.setitem(fuzz_cases.CASES, "toy-radius", (
            ["toy-radius", "--p-a", "0.9"], {"--p-a": fuzz_cases.f(0.5, 1, True, True),
                                             "--sigma": fuzz_cases.f(0, low_open=True)})),
    }
    assert set(touches) == files_to_touch("a new command", "toy")
    undocumented = sections(page["docs/cli.md"])
    for touch in touches.values():
        touch()

    listed = CliRunner().invoke(main, ["--help"])
    assert "toy-radius" in listed.output and "The certified L2 radius" in listed.output
    ran = CliRunner().invoke(main, ["toy-radius", "--p-a", "0.975", "--sigma", "0.5"])
    assert ran.exit_code == 0 and ran.output.strip() == "0.979982", ran.output
    refused = CliRunner().invoke(main, ["toy-radius", "--p-a", "0.4"])
    assert refused.exit_code == 2 and refused.stderr.strip() == "error: --p-a must lie in (0.5, 1), got 0.4"

    command = dict((" ".join(path), c) for path, c in commands())["toy-radius"]
    assert isinstance(command, click.Command) and "toy-radius" not in undocumented
    documented = sections(page["docs/cli.md"])
    assert all(names(documented["toy-radius"], option) for option in long_options(command))
    assert set(fuzz_cases.CASES["toy-radius"][1]) == set(long_options(command)) - {"--help"}
    for option, rule in fuzz_cases.CASES["toy-radius"][1].items():
        for text in ("nan", "inf", "-1", "0", "0.5", "0.9", "abc", ""):
            fuzz_cases.check(f"toy-radius {option}", fuzz_cases._args("toy-radius", option, text, tmp_path),
                             rule(text), tmp_path)

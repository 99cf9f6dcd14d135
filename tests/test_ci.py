"""CI runs exactly the README's install and test commands, and the import-layer contracts hold."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _commands(lines):
    """pip installs and pytest runs, comments and blank lines dropped."""
    out = []
    for line in lines:
        line = re.sub(r"\s+#.*$", "", line).strip()
        if line.startswith(("pip install", "python -m pytest")):
            out.append(line)
    return out


def _readme_setup():
    text = (ROOT / "README.md").read_text()
    section = text.split("## Install", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash", 1)[1].split("```", 1)[0]
    return _commands(block.splitlines())


def test_ci_runs_the_readmes_install_and_test_commands():
    readme = _readme_setup()
    ci = _commands((ROOT / ".ci" / "run").read_text().splitlines())
    assert readme and any(c.startswith("python -m pytest") for c in readme)
    assert ci == readme


def test_the_install_brings_timm_without_torchvision():
    installs = [c for c in _readme_setup() if c.startswith("pip install")]
    timm = [c for c in installs if "timm" in c]
    assert timm and all("--no-deps" in c for c in timm)
    assert not any("torchvision" in c for c in installs)


def test_import_layers_hold():
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    assert lint, "import-linter is not installed (pip install -e '.[test]')"
    result = subprocess.run([lint, "--no-cache"], capture_output=True, text=True, check=False, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


def test_every_package_folder_is_installed():
    """A non-editable install carries only the listed packages: every folder with an __init__.py must be one."""
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    config = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    for name, folder in config["package-dir"].items():
        for init in (root / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(root / folder)
            if "results" in relative.parts:
                continue
            package = ".".join([name, *relative.parts])
            assert package in listed, f"{package} ({init.parent}) is not in pyproject.toml's packages"


def test_the_heavy_modules_handed_out_first_exist():
    """A renamed module would silently lose its place at the front of the queue (tests/suite_order.py)."""
    from suite_order import HEAVY_FIRST
    assert len(set(HEAVY_FIRST)) == len(HEAVY_FIRST)
    for path in HEAVY_FIRST:
        assert (ROOT / path).is_file(), path

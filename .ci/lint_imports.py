"""Run import-linter (the contracts in pyproject.toml) on the installed-package layout.

The package maps top-level folders (engine/, export/, bench/) into the `diffsmooth` namespace, which
import-linter cannot follow: it walks one folder per package. So this builds that folder from
links in a temporary directory and lints it. Exit status: import-linter's (non-zero on a broken contract).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent


def package_view(where: Path) -> Path:
    """`where/diffsmooth`, laid out as installed: diffsmooth/'s files plus a link per mapped subpackage."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    mapping = config["tool"]["setuptools"]["package-dir"]
    top = where / "diffsmooth"
    top.mkdir()
    for entry in (ROOT / mapping["diffsmooth"]).iterdir():
        if entry.name != "__pycache__":
            (top / entry.name).symlink_to(entry)
    for package, folder in mapping.items():
        if package.count(".") == 1:
            (top / package.split(".", 1)[1]).symlink_to(ROOT / folder)
    return top


def main() -> int:
    from importlinter.cli import lint_imports
    with tempfile.TemporaryDirectory(prefix="diffsmooth-lint-") as tmp:
        package_view(Path(tmp))
        os.chdir(tmp)                                   # import-linter puts the working directory first on sys.path
        sys.path.insert(0, tmp)
        return lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True)


if __name__ == "__main__":
    sys.exit(main())

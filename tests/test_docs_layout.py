"""docs/layout.md names every module under engine/, and no module that is not there.

The convention: the page's table of `engine/` has a row per folder (its first cell names `engine/FOLDER/`)
or per group of top-level modules (a first cell naming no folder). A row names a module of its folder by
its file name in backticks (`plans.py` in the `engine/table/` row; in a row naming no folder, a file name
is a top-level module's: `errors.py` is engine/errors.py), and any row may name any module by its path
from the repository root (`engine/env_report.py`). Every .py file under engine/ but `__init__.py` must be
named so; every module the table names, and every path into engine/ the page's prose names
(`engine/certify/noise.py`, or from inside engine/: `certify/noise.py`), must exist.
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENGINE = ROOT / "engine"
LAYOUT = ROOT / "docs" / "layout.md"
CODE = re.compile(r"`([^`]+)`")


def engine_modules() -> set:
    """Every module under engine/ (recursively, __init__.py left out), as a path from the repository root."""
    return {p.relative_to(ROOT).as_posix() for p in ENGINE.rglob("*.py") if p.name != "__init__.py"}


def table_rows(text: str) -> list:
    """(first cell, whole row) of each row of the page's table of engine/."""
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.lstrip().startswith("|") and "engine/" in cells[0]:
            rows.append((cells[0], line))
    return rows


def named_in_table(text: str) -> set:
    """The modules the table names, as paths from the repository root (they may not exist)."""
    named = set()
    for first, row in table_rows(text):
        folders = [c for c in CODE.findall(first) if c.startswith("engine/") and c.endswith("/")]
        assert len(folders) <= 1, f"a row of docs/layout.md names two folders: {first}"
        home = folders[0] if folders else "engine/"
        for code in CODE.findall(row):
            for name in re.findall(r"[\w/]+\.py\b", code):
                named.add(name if name.startswith("engine/") else home + name)
    return named


def named_in_prose(text: str) -> set:
    """Paths into engine/ anywhere on the page: `engine/x/y.py`, or `x/y.py` where x is one of engine's folders."""
    folders = {p.name for p in ENGINE.iterdir() if p.is_dir() and not p.name.startswith("__")}
    paths = set()
    for path in re.findall(r"(?<![\w/.])((?:[\w]+/)+[\w]+\.py)\b", text):
        if path.startswith("engine/"):
            paths.add(path)
        elif path.split("/")[0] in folders:
            paths.add("engine/" + path)
    return paths


def test_layout_names_every_engine_module():
    missing = engine_modules() - named_in_table(LAYOUT.read_text())
    assert not missing, f"docs/layout.md's table does not name: {sorted(missing)}"


def test_layout_names_no_module_that_is_not_there():
    text = LAYOUT.read_text()
    named = named_in_table(text) | named_in_prose(text)
    absent = sorted(p for p in named if not (ROOT / p).is_file())
    assert not absent, f"docs/layout.md names modules that do not exist: {absent}"


def test_the_convention_reads_rows_as_documented():
    page = ("| folder / module | job |\n|---|---|\n| `engine/choices.py`, `errors.py` | names |\n"
            "| `engine/table/` | `plans.py` (plans), `engine/env_report.py` |\n"
            "Prose: `certify/noise.py`, tests/test_ci.py, bench/x.py.\n")
    assert named_in_table(page) == {"engine/choices.py", "engine/errors.py", "engine/table/plans.py",
                                    "engine/env_report.py"}
    assert named_in_prose(page) == {"engine/choices.py", "engine/certify/noise.py", "engine/env_report.py"}

"""The one-off studies live in studies/, outside the wheel: nothing installed imports them, the package
list leaves them out, bench/ holds only what `diffsmooth bench` and the GPU check run, studies/README.md
indexes every study, and no code cites a file outside the repository.

import-linter's `studies-stay-out` contract (pyproject.toml) sees the packages; this test reads every .py
file with `ast` (bench/results/ too, which no contract sees, and which holds no script).
"""

import ast
import importlib
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
INSTALLED = ("engine", "export", "bench", "diffsmooth")
LOADERS = {"import_module", "run_module", "__import__"}
# Paths that leave the repository: the sibling folder of this project's machines, absolute home or work folders.
OUTSIDE = re.compile(r"\.\./shared\b|(?<![\w.~-])/(work|home|root|Users)/")


def _python_files(folders) -> list:
    """Every .py file under the folders, each once (diffsmooth/ reaches engine/ ... through symlinks)."""
    seen, out = set(), []
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            real = path.resolve()
            if real not in seen and "__pycache__" not in path.parts:
                seen.add(real)
                out.append(path)
    return out


def _is_study(name: str) -> bool:
    return name == "studies" or name.startswith("studies.")


def study_imports(path: Path) -> list:
    """'line: what' for each import of `studies` in `path` (a statement anywhere, or a loader given its name)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [f"{node.lineno}: import {a.name}" for a in node.names if _is_study(a.name)]
        elif isinstance(node, ast.ImportFrom) and not node.level and _is_study(node.module or ""):
            found.append(f"{node.lineno}: from {node.module} import {', '.join(a.name for a in node.names)}")
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name in LOADERS and node.args and isinstance(node.args[0], ast.Constant) \
                    and isinstance(node.args[0].value, str) and _is_study(node.args[0].value):
                found.append(f"{node.lineno}: {name}({node.args[0].value!r})")
    return found


def outside_paths(path: Path) -> list:
    return [f"{i}: {line.strip()}" for i, line in enumerate(path.read_text().splitlines(), 1) if OUTSIDE.search(line)]


def _studies() -> list:
    """The studies: modules of studies/ with a command (a module without one is a helper the studies share)."""
    return sorted(p.stem for p in (ROOT / "studies").glob("*.py")
                  if p.stem != "__init__" and '__name__ == "__main__"' in p.read_text())


def _study_helpers() -> list:
    return sorted(p.stem for p in (ROOT / "studies").glob("*.py") if p.stem not in {"__init__", *_studies()})


def test_nothing_installed_imports_a_study():
    files = _python_files(INSTALLED)
    assert any(p.parts[-3:-1] == ("engine", "table") for p in files)
    assert not [p for p in files if "results" in p.parts], "bench/results/ holds results; its scripts are studies"
    bad = {str(p.relative_to(ROOT)): hits for p in files if (hits := study_imports(p))}
    assert not bad, f"installed code imports a study (move what it needs into the engine or bench/): {bad}"


def test_the_wheel_leaves_studies_out():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    names = list(setuptools["packages"]) + list(setuptools["package-dir"]) + list(setuptools["package-dir"].values())
    assert not [n for n in names if "studies" in n.split(".") or n == "studies"], names
    assert (ROOT / "studies" / "__init__.py").is_file()


def test_no_code_cites_a_file_outside_the_repository():
    files = _python_files((*INSTALLED, "studies")) + sorted((ROOT / "bench").rglob("*.sh"))
    bad = {str(p.relative_to(ROOT)): hits for p in files if (hits := outside_paths(p))}
    assert not bad, f"code cites a path outside the repository (store a copy under bench/results/ or take it " \
                    f"as an argument): {bad}"


def test_the_checks_see_each_form(tmp_path):
    forms = ["import studies", "import studies.race_study as r", "from studies.race_study import rates_from",
             "from studies import race_study", "import importlib\nimportlib.import_module('studies.memory')",
             "import runpy\nrunpy.run_module('studies.memory', run_name='__main__')",
             "def f():\n    from studies.table_study import main\n    return main"]
    for i, form in enumerate(forms):
        script = tmp_path / f"s{i}.py"
        script.write_text(form + "\n")
        assert study_imports(script), form
    fine = tmp_path / "fine.py"
    fine.write_text("import subprocess, sys\nfrom diffsmooth.bench.models import MODEL_SETS\nfrom . import studies\n"
                    "subprocess.run([sys.executable, '-m', 'studies.memory'])\n"
                    "KEY = f\"diffsmooth/work/{0}\"\n")
    assert study_imports(fine) == [] and outside_paths(fine) == []
    for cited in ("# see ../shared/measurements/x.md", "OUT = '/work/wt-onepass'", "p = Path('/home/me/x')"):
        script = tmp_path / "cites.py"
        script.write_text(cited + "\n")
        assert outside_paths(script), cited


def _bench_product() -> set:
    """bench/ modules that `diffsmooth bench` (diffsmooth/cli/bench.py) and bench/gpu_check.sh run, and what
    they import, transitively."""
    check = (ROOT / "bench" / "gpu_check.sh").read_text()
    todo = set(re.findall(r"diffsmooth\.bench\.(\w+)", check))
    todo |= {m for m in re.findall(r"diffsmooth\.bench\.(\w+)", (ROOT / "diffsmooth" / "cli" / "bench.py").read_text())}
    product = set()
    while todo:
        name = todo.pop()
        if name in product:
            continue
        product.add(name)
        tree = ast.parse((ROOT / "bench" / f"{name}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                module = node.module or ""
                if node.level == 1:
                    todo |= {module.split(".")[0]} if module else {a.name for a in node.names}
                elif module.startswith("diffsmooth.bench."):
                    todo.add(module.split(".")[2])
    return {m for m in product if (ROOT / "bench" / f"{m}.py").exists()}


def test_bench_holds_the_product_only():
    product = _bench_product()
    assert {"harness", "models", "report", "variants", "agreement", "gpu_summary", "table_gpu"} <= product
    modules = {p.stem for p in (ROOT / "bench").glob("*.py")} - {"__init__"}
    assert modules == product, f"bench/ modules neither `diffsmooth bench` nor the GPU check runs (studies/ takes " \
                               f"one-off studies): {sorted(modules - product)}"
    assert not set(_studies()) & modules


def test_the_index_names_every_study():
    index = (ROOT / "studies" / "README.md").read_text()
    rows = set(re.findall(r"^\| `(\w+)` \|", index, flags=re.M))
    assert rows == set(_studies())
    for helper in _study_helpers():         # a shared module is named in the index, and no study is one
        assert f"`{helper}.py`" in index, helper
    for name in rows:
        row = next(line for line in index.splitlines() if line.startswith(f"| `{name}` |"))
        assert f"python -m studies.{name}" in row, name
        assert row.count("|") >= 6, name


@pytest.mark.parametrize("name", _studies())
def test_each_study_imports_from_the_repository_root(name):
    module = importlib.import_module(f"studies.{name}")
    assert module.__doc__ and Path(module.__file__).resolve().parent == ROOT / "studies"

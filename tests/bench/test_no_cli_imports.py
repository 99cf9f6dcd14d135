"""bench/ never imports the command line, a script under bench/results/ included (studies/ takes them now).

import-linter's `cli-on-top` contract sees the package bench/ but not bench/results/, which is no
package: this test reads every .py under bench/ with `ast` and refuses an import of diffsmooth.cli
(an import statement anywhere, a relative one reaching it, or importlib / runpy / __import__ given its
name). A script that needs the command line runs it as a child process (studies/compile_measure.py).
"""

import ast
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
CLI = "diffsmooth.cli"
LOADERS = {"import_module", "run_module", "__import__"}


def _is_cli(name: str) -> bool:
    return name == CLI or name.startswith(CLI + ".")


def _package_of(path: Path, bench: Path) -> list[str]:
    """The package a bench/ module sits in (its installed name), for relative imports."""
    return ["diffsmooth", "bench", *path.parent.relative_to(bench).parts]


def cli_imports(path: Path, bench: Path = BENCH) -> list[str]:
    """'line: what' for each import of the command line in `path`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [f"{node.lineno}: import {a.name}" for a in node.names if _is_cli(a.name)]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = _package_of(path, bench)
                base = package[:len(package) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            names = [module] + [f"{module}.{a.name}" for a in node.names]
            if any(_is_cli(n) for n in names):
                found.append(f"{node.lineno}: from {'.' * node.level}{node.module or ''} import "
                             f"{', '.join(a.name for a in node.names)}")
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name in LOADERS and node.args and isinstance(node.args[0], ast.Constant) \
                    and isinstance(node.args[0].value, str) and _is_cli(node.args[0].value):
                found.append(f"{node.lineno}: {name}({node.args[0].value!r})")
    return found


def test_bench_scripts_never_import_the_command_line():
    scripts = sorted(BENCH.rglob("*.py"))
    assert any(p.name == "harness.py" for p in scripts), "bench/'s modules were not read"
    bad = {str(p.relative_to(BENCH.parent)): hits for p in scripts if (hits := cli_imports(p))}
    assert not bad, f"bench/ imports the command line (run it as a process instead): {bad}"


def test_the_check_sees_each_form(tmp_path):
    forms = ["import diffsmooth.cli", "from diffsmooth.cli import main", "from diffsmooth import cli",
             "from diffsmooth.cli.table import table", "from ... import cli", "from ...cli.group import main",
             "import importlib\nimportlib.import_module('diffsmooth.cli')",
             "import runpy\nrunpy.run_module('diffsmooth.cli', run_name='__main__')",
             "def f():\n    from diffsmooth.cli import main\n    return main"]
    (tmp_path / "results").mkdir()
    for i, form in enumerate(forms):
        script = tmp_path / "results" / f"s{i}.py"
        script.write_text(form + "\n")
        assert cli_imports(script, tmp_path), form
    fine = tmp_path / "results" / "fine.py"
    fine.write_text("import subprocess, sys\nfrom diffsmooth.engine.table.spec import demo_spec\nfrom .. import cli\n"
                    "CHILD = \"import runpy; runpy.run_module('diffsmooth.cli', run_name='__main__')\"\n"
                    "subprocess.run([sys.executable, '-c', CHILD])\n")
    assert cli_imports(fine, tmp_path) == []

"""A backend is one folder (engine/backends/NAME/: its class, a method's stages on it, its runner), registered in
one place (engine/backends/registry.py), and the product code never compares a backend's name with a string:
it asks the backend object (`runs_modules`, `accepts_torch_options`, `fast_path_defaults`) instead
(docs/extending.md, "A new backend")."""

import ast
from pathlib import Path

from diffsmooth.engine import choices
from diffsmooth.engine.backends.registry import STAGE_BACKENDS

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = [ROOT / "engine", ROOT / "export", ROOT / "bench", ROOT / "diffsmooth" / "cli", ROOT / "diffsmooth" / "__init__.py"]
ROOM = ROOT / "engine" / "backends"
HOUSE = [ROOM / name for name in choices.BACKENDS] + [ROOM / "registry.py"]


def _names_compared(tree: ast.AST) -> list:
    """(line, name) of every comparison of a backend name with a string literal: `x == "torch"`, `"tensorrt" != x`,
    `x in ("onnxruntime", "tensorrt")`, and a `case "torch":` of a match statement."""
    names = set(choices.BACKENDS)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.MatchValue):
            operands = [node.value]
        elif isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
        else:
            continue
        for operand in operands:
            literals = operand.elts if isinstance(operand, (ast.Tuple, ast.List, ast.Set)) else [operand]
            found += [(node.lineno, c.value) for c in literals
                      if isinstance(c, ast.Constant) and isinstance(c.value, str) and c.value in names]
    return found


def _product_files():
    for place in PRODUCT:
        for path in ([place] if place.is_file() else sorted(place.rglob("*.py"))):
            if "results" not in path.relative_to(ROOT).parts:
                yield path


def test_no_product_code_compares_a_backend_name_with_a_string():
    offenders = []
    for path in _product_files():
        if any(path == home or home in path.parents for home in HOUSE):
            continue
        offenders += [f"{path.relative_to(ROOT)}:{line} ({name!r})"
                      for line, name in _names_compared(ast.parse(path.read_text()))]
    assert not offenders, offenders


def test_the_check_sees_a_comparison():
    """The scan above finds each form of comparison it looks for (a scan that found nothing would pass too)."""
    source = ('a == "torch"\n"tensorrt" != b\nc in ("onnxruntime", "tensorrt")\nd not in ["torch"]\ne == "tvm"\n'
              'match f:\n    case "tensorrt":\n        pass\n')
    assert _names_compared(ast.parse(source)) == [(1, "torch"), (2, "tensorrt"), (3, "onnxruntime"), (3, "tensorrt"),
                                                  (4, "torch"), (7, "tensorrt")]


def test_each_backend_is_one_folder_registered_once():
    """The registry holds the command line's backends in its order, each the class of its own folder's backend.py,
    and each folder holds its class, a method's stages on it and its runner."""
    assert tuple(STAGE_BACKENDS) == choices.BACKENDS
    for name, backend in STAGE_BACKENDS.items():
        assert backend.name == name
        assert type(backend).__module__ == f"diffsmooth.engine.backends.{name}.backend"
        assert {"__init__.py", "backend.py", "stages.py", "runner.py"} <= {p.name for p in (ROOM / name).glob("*.py")}


def test_a_backend_answers_what_the_product_asks_of_it():
    """What the product code asks a backend instead of its name: whether it runs torch modules (its fast path then
    checked against eager fp32), whether it reads the torch fast path's options, its fast path's defaults."""
    for backend in STAGE_BACKENDS.values():
        assert isinstance(backend.runs_modules, bool) and isinstance(backend.accepts_torch_options, bool)
        assert isinstance(backend.fast_path_defaults(False, None, {}), dict)

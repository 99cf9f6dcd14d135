"""A method is a class (engine/base_classifier/methods/): registered in one place, one file each, and the product
code never compares a method's name with a string (docs/extending.md)."""

import ast
from pathlib import Path

import pytest

from diffsmooth.engine import choices
from diffsmooth.engine.base_classifier.methods import BUILT_IN, Method, MethodConfig, method_named, method_names, register
from diffsmooth.engine.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = [ROOT / "engine", ROOT / "export", ROOT / "bench", ROOT / "diffsmooth" / "cli"]
HOUSE = ROOT / "engine" / "base_classifier" / "methods"


def _names_compared(tree: ast.AST) -> list:
    """(line, name) of every comparison of a method name with a string literal: `x == "dds"`, `"rs" != x`,
    `x in ("dds", "diffsmooth")`."""
    names = set(choices.METHODS)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        for operand in [node.left, *node.comparators]:
            literals = operand.elts if isinstance(operand, (ast.Tuple, ast.List, ast.Set)) else [operand]
            found += [(node.lineno, c.value) for c in literals
                      if isinstance(c, ast.Constant) and isinstance(c.value, str) and c.value in names]
    return found


def test_no_product_code_compares_a_method_name_with_a_string():
    offenders = []
    for folder in PRODUCT:
        for path in folder.rglob("*.py"):
            if HOUSE in path.parents or "results" in path.relative_to(ROOT).parts:
                continue
            offenders += [f"{path.relative_to(ROOT)}:{line} ({name!r})"
                          for line, name in _names_compared(ast.parse(path.read_text()))]
    assert not offenders, offenders


def test_the_check_sees_a_comparison():
    """The scan above finds each form of comparison it looks for (a scan that found nothing would pass too)."""
    source = 'a == "dds"\n"rs" != b\nc in ("dds", "diffsmooth")\nd not in ["rs"]\ne == "other"\n'
    assert _names_compared(ast.parse(source)) == [(1, "dds"), (2, "rs"), (3, "dds"), (3, "diffsmooth"), (4, "rs")]


def test_the_built_in_methods_are_registered_once_each_in_their_own_file():
    assert method_names()[:len(choices.METHODS)] == choices.METHODS == tuple(cls.name for cls in BUILT_IN)
    for cls in BUILT_IN:
        assert Path(__import__(cls.__module__, fromlist=["_"]).__file__).name == f"{cls.name}.py"
        assert type(method_named(cls.name)) is cls
    with pytest.raises(ValueError, match="registered already"):
        register(type("Other", (Method,), {"name": "dds"}))
    assert type(method_named("dds")) is BUILT_IN[1]


def test_each_method_builds_on_the_house_alone():
    """A method's file imports, of its package, only base.py / config.py / registry.py, and those three import no
    method (what the `one-method-per-file` contract checks for the three it names, for every method file here)."""
    house = {"base", "config", "registry"}
    package = "diffsmooth.engine.base_classifier.methods"
    methods = sorted(p.stem for p in HOUSE.glob("*.py") if p.stem not in house | {"__init__"})
    assert set(choices.METHODS) <= set(methods)
    for path in HOUSE.glob("*.py"):
        if path.stem == "__init__":
            continue
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(package + "."):
                imported.add(node.module[len(package) + 1:].split(".")[0])
        allowed = house if path.stem in methods else house - {path.stem}
        assert imported <= allowed, (path.name, imported - allowed)
        if path.stem in house:
            assert not imported & set(methods), path.name


def test_each_method_reads_only_its_own_settings():
    """A method records only the settings it reads; DiffSmooth validates its own, the others ignore them."""
    assert MethodConfig("rs", 0.5, m=0).as_dict() == {"method": "rs", "sigma": 0.5}
    assert MethodConfig("dds", 0.25, local_noise="odd").as_dict() == {"method": "dds", "sigma": 0.25}
    assert set(MethodConfig("diffsmooth", 0.5).as_dict()) == {"method", "sigma", "m", "local_sigma", "local_noise",
                                                             "local_noise_seed"}
    for bad, message in [({"m": 0}, "m \\(local noises\\) must be >= 1"), ({"local_sigma": -1.0}, "local sigma"),
                         ({"local_noise": "odd"}, "local noise must be one of fixed, fresh")]:
        with pytest.raises(UserError, match=message):
            MethodConfig("diffsmooth", 0.5, **bad)
    with pytest.raises(UserError, match="sigma must be > 0"):
        MethodConfig("rs", 0.0)
    with pytest.raises(UserError, match="unknown method 42"):
        MethodConfig(42, 0.5)

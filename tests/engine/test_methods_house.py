"""A method is a class (engine/base_classifier/methods/): registered in one place, one file each, and the product
code never compares a method's name with a string (docs/extending.md)."""

import ast
import inspect
import sys
from pathlib import Path

import pytest

from diffsmooth.engine import choices
from diffsmooth.engine.base_classifier.methods import BUILT_IN, Method, MethodConfig, method_named, method_names, register
from diffsmooth.engine.base_classifier.methods.head import Head
from diffsmooth.engine.base_classifier.methods.purifier import Purifier
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


PARTS = {"purifier", "head"}                 # the part interfaces; each part's file builds on one of them


def _house_imports(path: Path) -> set:
    package = "diffsmooth.engine.base_classifier.methods"
    imported = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(package + "."):
            imported.add(node.module[len(package) + 1:].split(".")[0])
    return imported


def test_each_method_is_a_pairing_of_parts_in_their_own_files():
    """A method's file imports base.py and its parts; a part's file its interface (and the config); the interfaces,
    their configured base (part.py), base.py, the config and the registry import no method and no part."""
    house = {"base", "config", "registry", "part"} | PARTS
    files = {p.stem: p for p in HOUSE.glob("*.py") if p.stem != "__init__"}
    methods = {cls.__module__.rsplit(".", 1)[1] for cls in BUILT_IN}
    parts = set(files) - house - methods
    assert set(choices.METHODS) == methods and parts
    for stem, path in files.items():
        imported = _house_imports(path)
        if stem in methods:
            assert imported <= {"base"} | parts, (stem, imported)
        elif stem in parts:
            assert imported & PARTS and imported <= {"config"} | PARTS, (stem, imported)
        else:
            assert not imported & (methods | parts), (stem, imported)
    for cls in BUILT_IN:
        assert issubclass(cls.purifier, Purifier) and issubclass(cls.head, Head)
        assert Path(sys.modules[cls.purifier.__module__].__file__).stem in parts
        assert Path(sys.modules[cls.head.__module__].__file__).stem in parts


def _flags(cls: type) -> list:
    """The bool class attributes a method class or a part class defines (a switch another module would branch on)."""
    return [name for klass in cls.__mro__ if klass.__module__.startswith("diffsmooth") or klass is cls
            for name, value in vars(klass).items() if isinstance(value, bool)]


# The capabilities a part declares and the engine may ask (reviewed; each is a fact of the part, not a method's
# name in disguise): a purifier has a purify stage; its stage runs the UNet; it draws keyed noises of its own.
CAPABILITIES = {"purifies", "denoises", "draws_noise"}


def test_no_method_carries_a_flag_like_switch():
    """A method is its parts: no bool class attribute on a method (DiffSmooth's old `local_smoothing`), none on a
    part beyond the reviewed capabilities, and the interfaces' defaults belong to no method (they are abstract)."""
    for cls in BUILT_IN:
        assert not _flags(cls), (cls.name, _flags(cls))
        for part in (cls.purifier, cls.head):
            assert set(_flags(part)) <= CAPABILITIES, (part.__name__, set(_flags(part)) - CAPABILITIES)
    assert inspect.isabstract(Purifier) and inspect.isabstract(Head)
    assert not [name for name in vars(Method) if not name.startswith("_")
                and name not in {"name", "line_name", "flip_rates", "purifier", "head", "options", "score_head",
                                 "classifier_calls", "score_tolerance", "config_tag", "graph_tag", "graph_fields",
                                 "config_from_manifest", "demo_classifier"}]


def test_the_flag_check_sees_a_planted_switch():
    """Planted: DiffSmooth with its old flag back, and a head with a new one; the check names both."""
    planted = type("Planted", (BUILT_IN[2],), {"name": "planted", "local_smoothing": True})
    head = type("FlaggedHead", (BUILT_IN[2].head,), {"averages_softmax": True})
    assert _flags(planted) == ["local_smoothing"]
    assert "averages_softmax" in set(_flags(head)) - CAPABILITIES


def test_each_method_reads_only_its_own_settings():
    """A method records only its settings (its parts' options); the aliases (m, local_sigma, local_noise) set
    DiffSmooth's and are ignored by a method without them; each option checks its own values."""
    assert MethodConfig("rs", 0.5, m=0).as_dict() == {"method": "rs", "sigma": 0.5}
    assert MethodConfig("dds", 0.25, local_noise="odd").as_dict() == {"method": "dds", "sigma": 0.25}
    assert set(MethodConfig("diffsmooth", 0.5).as_dict()) == {"method", "sigma", "m", "local_sigma", "local_noise",
                                                             "local_noise_seed"}
    for bad, message in [({"m": 0}, "setting m must be 1..1024, got 0"),
                         ({"local_sigma": -1.0}, "setting local_sigma must be >= 0"),
                         ({"local_noise": "odd"}, "setting local_noise must be one of fixed, fresh")]:
        with pytest.raises(UserError, match=message):
            MethodConfig("diffsmooth", 0.5, **bad)
    with pytest.raises(UserError, match="sigma must be > 0"):
        MethodConfig("rs", 0.0)
    with pytest.raises(UserError, match="unknown method 42"):
        MethodConfig(42, 0.5)


def _methods_named(tree: ast.AST) -> list:
    """(line, name) of every call that names a built-in method with a literal: `method_named("diffsmooth")`,
    `MethodConfig("dds", ...)`."""
    return [(node.lineno, node.args[0].value) for node in ast.walk(tree)
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None))
            in ("method_named", "MethodConfig") and node.args and isinstance(node.args[0], ast.Constant)
            and node.args[0].value in choices.METHODS]


def test_no_engine_or_exporter_code_names_a_method():
    """The engine, the exporters and the command line ask the registry, never one method by name (the benchmarks
    name the cases they measure)."""
    offenders = []
    for folder in (ROOT / "engine", ROOT / "export", ROOT / "diffsmooth" / "cli"):
        for path in folder.rglob("*.py"):
            if HOUSE not in path.parents:
                offenders += [f"{path.relative_to(ROOT)}:{line} ({name!r})"
                              for line, name in _methods_named(ast.parse(path.read_text()))]
    assert not offenders, offenders
    assert _methods_named(ast.parse('method_named("diffsmooth")\nMethodConfig("dds", 0.5)\nf("rs")\n')) == \
        [(1, "diffsmooth"), (2, "dds")]


def test_diffsmooths_settings_are_its_heads_options_and_the_old_spellings_are_aliases():
    """m, sigma', the local noise and its seed are declared once, on DiffSmooth's head; the keywords and the command
    line's --m / --local-sigma / --local-noise set the same options as `--option NAME=VALUE`."""
    from diffsmooth.engine.runs.request import RunRequest
    head = method_named("diffsmooth").head
    assert [o.name for o in head.options] == ["local_sigma", "m", "local_noise", "local_noise_seed"]
    assert method_named("diffsmooth").options == head.options and not method_named("diffsmooth").purifier.options
    by_alias = MethodConfig("diffsmooth", 0.5, m=3, local_sigma=0.12, local_noise="fresh")
    assert by_alias == MethodConfig("diffsmooth", 0.5, options={"m": 3, "local_sigma": 0.12, "local_noise": "fresh"})
    assert by_alias.option("m") == 3 and by_alias.replace(m=1).option("m") == 1
    flags = RunRequest.parse("certify", out="r.tsv", method=("diffsmooth",), m=(3,), local_sigma=(0.12,),
                             local_noise="fresh")
    options = RunRequest.parse("certify", out="r.tsv", method=("diffsmooth",),
                               method_options=(("m", "3"), ("local_sigma", "0.12"), ("local_noise", "fresh")))
    assert flags.method_config() == options.method_config() == by_alias
    assert RunRequest.parse("certify", out="r.tsv", method=("rs",), m=(3,)).method_config() == MethodConfig("rs", 0.5)
    with pytest.raises(UserError, match="setting m must be 1..1024"):
        RunRequest.parse("certify", out="r.tsv", method=("diffsmooth",), m=(0,))

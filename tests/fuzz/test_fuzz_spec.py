"""`diffsmooth table SPEC` fuzzed: missing keys, wrong types, unknown keys, NaN / inf, huge numbers and
bad TOML. A bad spec is refused in one line before the table's folder is touched; a valid one reaches
TableBuilder.build (stubbed to raise Accepted)."""

import copy
import json
import math

import pytest
from fuzz_helpers import FUZZ, check
from hypothesis import example, given
from hypothesis import strategies as st

pytestmark = pytest.mark.usefixtures("stub_heavy_steps")

BASE = {"title": "fuzzed table", "sigmas": [0.25, 0.5], "radii": [0.25, 0.5], "n0": 20, "n_max": 200, "alpha": 0.001,
        "seed": 0, "data": {"dataset": "embedded", "skip": 83, "max": 500}, "run": {"threads": 1, "batch": 100},
        "line": [{"name": "RS", "method": "rs"},
                 {"name": "DiffSmooth", "method": "diffsmooth", "m": [1, 3], "local_sigma": 0.25}]}


# -- TOML out of Python values (tomllib only reads) -------------------------------------------------

def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(type(v))


def to_toml(doc: dict) -> str:
    tables = {k: v for k, v in doc.items() if isinstance(v, dict)}
    arrays = {k: v for k, v in doc.items() if isinstance(v, list) and v and all(isinstance(x, dict) for x in v)}
    text = [f"{json.dumps(k)} = {toml_value(v)}" for k, v in doc.items() if k not in tables and k not in arrays]
    for name, table in tables.items():
        text += [f"[{json.dumps(name)}]"] + [f"{json.dumps(str(k))} = {toml_value(v)}" for k, v in table.items()]
    for name, items in arrays.items():
        for item in items:
            text += [f"[[{json.dumps(name)}]]"] + [f"{json.dumps(str(k))} = {toml_value(v)}" for k, v in item.items()]
    return "\n".join(text) + "\n"


# -- what each key takes ------------------------------------------------------------------------------

def number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def integer(v, low, high=None):
    return isinstance(v, int) and not isinstance(v, bool) and v >= low and (high is None or v <= high)


def number_list(v, strict):
    return isinstance(v, list) and bool(v) and all(number(x) and (x > 0 if strict else x >= 0) for x in v) \
        and len(set(v)) == len(v)


def one_or_list(rule):
    def check_value(v):
        values = v if isinstance(v, list) else [v]
        return bool(values) and all(rule(x) for x in values) and len(set(map(repr, values))) == len(values)
    return check_value


RULES = {
    ("title",): lambda v: isinstance(v, str),
    ("sigmas",): lambda v: number_list(v, strict=True),
    ("radii",): lambda v: number_list(v, strict=False),
    ("n0",): lambda v: integer(v, 1, 2 ** 32 - 200),
    ("n_max",): lambda v: integer(v, 1, 2 ** 32 - 20),
    ("alpha",): lambda v: number(v) and 0 < v < 1,
    ("seed",): lambda v: integer(v, 0, 2 ** 63 - 1),
    ("data", "skip"): lambda v: integer(v, 1),
    ("data", "max"): lambda v: integer(v, 1),
    ("run", "threads"): lambda v: integer(v, 1, 1024),
    ("run", "batch"): lambda v: integer(v, 1, 2 ** 20),
    ("run", "window"): lambda v: integer(v, 1, 2 ** 20),
    ("run", "streams"): lambda v: integer(v, 1, 2),
    ("run", "compile"): lambda v: isinstance(v, bool),
    ("run", "fused_attention"): lambda v: isinstance(v, bool),
    ("models", "diffusion_steps"): lambda v: integer(v, 1, 100_000),
    ("line", 1, "m"): one_or_list(lambda x: integer(x, 1, 1024)),
    ("line", 1, "local_sigma"): one_or_list(lambda x: number(x) and x > 0),
    ("line", 0, "method"): lambda v: v in ("rs", "dds", "diffsmooth"),
    ("line", 0, "name"): lambda v: isinstance(v, str) and bool(v.strip()) and v != "DiffSmooth",
}

toml_text = st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=6)
values = st.one_of(
    st.sampled_from([0, 1, 2, -1, 3, 1024, 1025, 2 ** 20, 2 ** 32 - 200, 2 ** 32, 2 ** 63 - 1, 0.5, 0.0, -0.0, 1e-300,
                     float("nan"), float("inf"), float("-inf"), "", "1", "rs", True, False, [], [0.25, 0.25], [1, 3],
                     [0.5, float("nan")], {}]),
    st.integers(-2 ** 63, 2 ** 63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(), toml_text,
    st.lists(st.one_of(st.integers(-5, 2000), st.floats(allow_nan=True, allow_infinity=True)), max_size=4),
)


def _put(doc, path, value):
    target = doc
    for key in path[:-1]:
        target = target.setdefault(key, {}) if isinstance(key, str) else target[key]
    target[path[-1]] = value


def run_spec(tmp_path_factory, text: str, must, kind: str):
    folder = tmp_path_factory.mktemp("spec")
    spec = folder / "spec.toml"
    spec.write_text(text) if isinstance(text, str) else spec.write_bytes(text)
    check(kind, ["table", spec, "--out", folder / "table"], must, folder)


def test_the_base_spec_is_valid(tmp_path_factory):
    run_spec(tmp_path_factory, to_toml(BASE), True, "spec valid")


@FUZZ
@given(path=st.sampled_from(sorted(RULES, key=str)), value=values)
@example(path=("n0",), value=float("nan"))
@example(path=("sigmas",), value=[0.25, 0.25])
@example(path=("alpha",), value=1.0)
@example(path=("seed",), value=-1)
def test_a_key_set_to_a_hostile_value(tmp_path_factory, path, value):
    doc = copy.deepcopy(BASE)
    _put(doc, path, value)
    run_spec(tmp_path_factory, to_toml(doc), RULES[path](value), "spec value")


@FUZZ
@given(where=st.sampled_from([(), ("data",), ("run",), ("models",), ("line", 0)]),
       key=st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=10), value=values)
def test_an_unknown_key_is_refused(tmp_path_factory, where, key, value):
    known = {(): {"title", "sigmas", "radii", "n0", "n_max", "alpha", "seed", "data", "models", "run", "line"},
             ("data",): {"dataset", "data", "split", "skip", "max"},
             ("run",): {"device", "precision", "batch", "compile", "cuda_graphs", "streams", "fused_attention", "backend",
                        "onnx_dir", "threads", "window"},
             ("models",): {"denoiser", "preset", "unet_config", "schedule", "diffusion_steps", "arch", "normalization",
                           "stats"},
             ("line", 0): {"name", "method", "classifier", "local_sigma", "m", "local_noise"}}[where]
    if key in known:
        return
    doc = copy.deepcopy(BASE)
    _put(doc, (*where, key), value)
    run_spec(tmp_path_factory, to_toml(doc), False, "spec unknown key")


@pytest.mark.parametrize("path", [("line",), ("line", 0, "method"), ("sigmas",), ("radii",)])
def test_a_missing_or_emptied_key(tmp_path_factory, path):
    doc = copy.deepcopy(BASE)
    target = doc
    for key in path[:-1]:
        target = target[key]
    del target[path[-1]]
    must = path in (("sigmas",), ("radii",))            # these have defaults; a line needs its method
    run_spec(tmp_path_factory, to_toml(doc), must, "spec missing key")


@FUZZ
@given(cut=st.integers(0, len(to_toml(BASE)) - 1), junk=st.text(max_size=12))
@example(cut=10, junk="= = [")
def test_bad_or_truncated_toml(tmp_path_factory, cut, junk):
    """A spec cut short or with junk appended: refused in one line unless it still happens to be a
    valid spec (then accepted)."""
    run_spec(tmp_path_factory, to_toml(BASE)[:cut] + junk, None, "spec bad toml")


@pytest.mark.parametrize("content", [b"\xff\xfe\x00garbage", b"", b"title = 'x'\n",
                                     b"[[line]]\nmethod = 'rs'\n[[line]]\nmethod = 'rs'\n"])
def test_unreadable_or_empty_specs(tmp_path_factory, content):
    run_spec(tmp_path_factory, content, False, "spec unreadable")


def test_a_spec_that_is_not_a_file(tmp_path):
    check("spec not a file", ["table", tmp_path / "missing.toml", "--out", tmp_path / "t"], False, tmp_path)
    check("spec not a file", ["table", tmp_path, "--out", tmp_path / "t"], False, tmp_path)

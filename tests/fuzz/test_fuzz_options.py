"""Every numeric and list option of every command, fuzzed: NaN, +-inf, negative, zero, huge, not a
number, empty, duplicates. Each value is either refused (one `error:` line, exit 2, nothing written)
or accepted (the command reaches its heavy step, stubbed to raise `Accepted`); the oracle of each
option says which (None: either, refused properly)."""

import math

import pytest
from fuzz_helpers import (
    DEMO_CLASSIFIER,
    FUZZ,
    as_float,
    as_int,
    check,
    finite_in,
    int_in,
    invoke,
    radii_list,
    snapshot,
)
from hypothesis import example, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.usefixtures("stub_heavy_steps")

MAX_SEED, MAX_SAMPLES, MAX_BATCH = 2 ** 63 - 1, 2 ** 32, 2 ** 20

# Texts a user (or a script with a bug) may type where a number belongs.
CANONICAL = ["nan", "-nan", "NaN", "inf", "-inf", "Infinity", "1e400", "-1e400", "-1", "0", "-0", "-0.0", "1", "2",
             "0.5", "1e-320", "99999999999999999999999", str(2 ** 63), str(2 ** 64), "abc", "", " ", "1.5", "0x10",
             "1_000", "1e3", "\u0663", "5 ", "--"]

number_texts = st.one_of(
    st.sampled_from(CANONICAL),
    st.integers(-2 ** 70, 2 ** 70).map(str),
    st.integers(-3, 3000).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.floats(min_value=0, max_value=4).map(repr),
    st.text(alphabet="0123456789.-+eEinfa_ x,", max_size=8),
)


def f(low=None, high=None, low_open=False, high_open=False):
    return lambda text: finite_in(text, low, high, low_open, high_open)


def i(low=None, high=None):
    return lambda text: int_in(text, low, high)


def certify_n0(text):                   # n0 + n (10000) samples per image fit 32 bits
    return int_in(text, 1, MAX_SAMPLES - 10000)


def certify_n(text):                    # n0 (100) + n
    return int_in(text, 1, MAX_SAMPLES - 100)


def futility(text):
    spec = text.strip().lower()
    if spec in ("off", "none", "no", "pace", "projection"):
        return True
    rule, _, value = spec.rpartition(":")
    margin = as_float(value)
    return (rule or "pace") in ("pace", "projection") and margin is not None and math.isfinite(margin) and margin >= 0


def rows(text):
    names = [r.strip() for r in text.split(",") if r.strip()]
    return bool(names) and len(set(names)) == len(names) and set(names) <= {"rs", "dds", "diffsmooth"}


def image_shape(text):
    if not text:
        return True                     # not given: the preset's shape
    parts = text.replace("x", ",").split(",")
    values = [as_int(p) for p in parts]
    return len(values) == 3 and all(v is not None and v >= 1 for v in values)


def number_list(kind_high):
    def rule(text):
        items = [t.strip() for t in text.split(",") if t.strip()]
        values = [as_int(t) for t in items]
        return all(v is not None and 1 <= v <= kind_high for v in values) and len(set(values)) == len(values)
    return rule


OUT = "OUT"                             # replaced by the test's folder
CERTIFY = ["certify", "--method", "rs", "--classifier", DEMO_CLASSIFIER, "--stats", "fashion-mnist", "--out", f"{OUT}/r.tsv"]
COMMON_RUN = {"--sigma": f(0, low_open=True), "--local-sigma": f(0), "--m": i(1, 1024), "--diffusion-steps": i(1, 100_000),
              "--alpha": f(0, 1, True, True), "--seed": i(0, MAX_SEED)}
CASES = {
    "certify": (CERTIFY, dict(COMMON_RUN, **{
        "--n0": certify_n0, "--n": certify_n, "--batch": i(1, MAX_BATCH), "--skip": i(1), "--max": i(1),
        "--streams": i(1, 2), "--validate-samples": i(0, MAX_SAMPLES), "--validate-images": i(1),
        "--expected-flip-rate": f(0, 1, low_open=True), "--window": i(1, MAX_BATCH), "--threads": i(1, 1024)})),
    "certify-sequential": (CERTIFY + ["--sequential", "--radii", "0.25"], {
        "--radii": radii_list, "--n-max": i(1, MAX_SAMPLES - 100), "--futility": futility}),
    "predict": (["predict", "--method", "rs", "--classifier", DEMO_CLASSIFIER, "--stats", "fashion-mnist",
                 "--out", f"{OUT}/p.tsv"], {"--n": i(1, MAX_SAMPLES), "--sigma": f(0, low_open=True),
                                            "--alpha": f(0, 1, True, True)}),
    "demo": (["demo", "--out", f"{OUT}/demo"], dict(COMMON_RUN, **{
        "--images": i(1), "--n": i(1, MAX_SAMPLES - 100), "--n0": i(1, MAX_SAMPLES - 500), "--batch": i(1, MAX_BATCH),
        "--threads": i(1, 1024)}, **{"--diffusion-steps": None})),
    "purify": (["purify", "--out", f"{OUT}/p.png"], {
        "--sigma": f(0, low_open=True), "--local-sigma": f(0), "--m": i(0, 64), "--images": i(1, 4096),
        "--seed": i(0, MAX_SEED), "--diffusion-steps": i(1, 100_000)}),
    "export": (["export", "--method", "rs", "--classifier", DEMO_CLASSIFIER, "--stats", "fashion-mnist",
                "--out", f"{OUT}/onnx"], {
        "--sigma": f(0, low_open=True), "--local-sigma": f(0), "--m": i(1, 1024), "--image-shape": image_shape,
        "--samples": i(1, MAX_SAMPLES), "--seed": i(0, MAX_SEED), "--trt-batch": i(1, MAX_BATCH),
        "--trt-max-batch": i(1000, MAX_BATCH), "--diffusion-steps": i(1, 100_000)}),
    "validate": (["validate", "--onnx-dir", f"{OUT}/onnx"], {"--samples": i(1, MAX_SAMPLES), "--seed": i(0, MAX_SEED)}),
    "build-engine": (["build-engine", "--onnx-dir", f"{OUT}/onnx"], {
        "--batch": i(1, MAX_BATCH), "--max-batch": i(1000, MAX_BATCH), "--workspace-gb": f(0, 2 ** 20, low_open=True),
        "--samples": i(1, MAX_SAMPLES), "--seed": i(0, MAX_SEED)}),
    "bench": (["bench"], {
        "--sigma": f(0, low_open=True), "--n0": i(1, MAX_SAMPLES), "--n": i(1, MAX_SAMPLES), "--m": i(1, 1024),
        "--local-sigma": f(0), "--batch": i(1, MAX_BATCH), "--measure-n": i(1, MAX_SAMPLES), "--images": i(1, 4096),
        "--reference-batch": i(1, MAX_BATCH), "--peak-tflops": f(0, 1e9, low_open=True),
        "--sweep-batches": number_list(MAX_BATCH), "--sweep-m": number_list(1024), "--sweep-n": i(1, MAX_SAMPLES),
        "--seed": i(0, MAX_SEED), "--threads": i(1, 1024)}),
    "train-demo": (["train-demo", "--out", f"{OUT}/models"], {
        "--seed": i(0, 2 ** 32 - 1), "--unet-steps": i(1, 2 ** 31 - 1), "--unet-batch-size": i(1, MAX_BATCH),
        "--classifier-epochs": f(0.001, 1e6), "--clean-classifier-epochs": f(0.001, 1e6),
        "--classifier-steps": i(1, 2 ** 31 - 1), "--classifier-batch-size": i(1, MAX_BATCH), "--train-limit": i(1),
        "--test-limit": i(1), "--workers": i(1, 1024), "--threads": i(1, 1024)}),
    "env": (["env"], {"--compile-timeout": f(0, 7 * 86400, low_open=True)}),
    "serve": (["serve", "--demo"], {
        "--port": i(0, 65535), "--seed": i(0, MAX_SEED), "--threads": i(1, 1024), "--batch": i(1, MAX_BATCH),
        "--max-images": i(1, 2 ** 20), "--max-samples": i(1, 2 ** 32 - 1), "--max-queue": i(1, 2 ** 20),
        "--max-body-mb": f(0, 2 ** 14, low_open=True), "--deadline": f(0, 86400, low_open=True)}),
    "table": (["table", "--demo", "--out", f"{OUT}/table"], {
        "--pilot": i(1), "--margin": f(0, 1), "--reach": f(0, low_open=True), "--images": i(1, 500),
        "--n-max": i(1, MAX_SAMPLES - 100), "--threads": i(1, 1024), "--batch": i(1, MAX_BATCH), "--rows": rows}),
}
OPTIONS = [(command, option) for command, (_, rules) in CASES.items() for option, rule in rules.items() if rule]


def _args(command, option, text, folder):
    base = [str(a).replace(OUT, str(folder)) for a in CASES[command][0]]
    return base + [f"{option}={text}"]


@pytest.mark.parametrize("command,option", OPTIONS, ids=[f"{c}{o}" for c, o in OPTIONS])
@settings(FUZZ, max_examples=15)
@given(text=number_texts)
def test_every_number_option(tmp_path_factory, command, option, text):
    folder = tmp_path_factory.mktemp("out")
    (folder / "keep.txt").write_text("a file the command must leave alone\n")
    check(f"option {command} {option}", _args(command, option, text, folder), CASES[command][1][option](text), folder)


@pytest.mark.parametrize("command,option", OPTIONS, ids=[f"{c}{o}" for c, o in OPTIONS])
def test_canonical_hostile_values(tmp_path, command, option):
    """The named hostile values of the issue, every option: NaN, +-inf, negative, zero, huge, not a number, empty."""
    rule = CASES[command][1][option]
    for text in ("nan", "inf", "-inf", "-1", "0", "1e400", "99999999999999999999999", "abc", ""):
        check(f"option {command} {option}", _args(command, option, text, tmp_path), rule(text), tmp_path)


@pytest.mark.parametrize("args", [
    ["certify", "--seed", "0", "--n", "1", "--n0", "1", "--alpha", "0.999999", "--max", "1", "--skip", "500"],
    ["certify", "--seed", str(MAX_SEED), "--batch", str(MAX_BATCH), "--window", str(MAX_BATCH), "--threads", "1"],
    ["certify", "--n0", "1", "--n", str(MAX_SAMPLES - 1), "--alpha", "1e-300", "--validate-samples", "0"],
    ["certify", "--sequential", "--radii", "0", "--n-max", "1", "--futility", "off"],
    ["certify", "--method", "diffsmooth", "--m", "1", "--m", "3", "--local-sigma", "0", "--local-sigma", "0.25"],
    ["predict", "--n", str(MAX_SAMPLES), "--seed", "0"],
], ids=["smallest", "largest-ints", "most-samples", "sequential-edge", "sweep-edge", "predict-most-samples"])
def test_valid_extremes_are_accepted(tmp_path, args):
    check(f"valid extreme {args[0]}", [*args, "--out", tmp_path / "r"], True, tmp_path)


# -- repeated options and lists --------------------------------------------------------------------

REPEATABLE = {"--m": st.sampled_from(["1", "3", "5", "5"]), "--local-sigma": st.sampled_from(["0.25", "0.5", "0.25", "0"]),
              "--method": st.sampled_from(["rs", "dds", "diffsmooth", "rs"]),
              "--classifier": st.sampled_from([str(DEMO_CLASSIFIER), str(DEMO_CLASSIFIER)])}


@FUZZ
@given(option=st.sampled_from(sorted(REPEATABLE)), data=st.data())
def test_repeated_options(tmp_path_factory, option, data):
    """`--m 5 --m 5`: a value given twice is refused; distinct values make a sweep."""
    values = data.draw(st.lists(REPEATABLE[option], min_size=2, max_size=4))
    folder = tmp_path_factory.mktemp("out")
    args = ["certify", "--out", folder / "sweep"] + [a for v in values for a in (option, v)]
    if option != "--method":
        args += ["--method", "diffsmooth"]
    duplicated = len(set(values)) != len(values)
    check(f"repeated {option}", args, False if duplicated else None, folder)


@FUZZ
@given(radii=st.lists(st.one_of(st.sampled_from(["0.25", "0.25", "0", "-0.0", "nan", "inf", "-1", "", " ", "x"]),
                                st.floats(allow_nan=True, allow_infinity=True).map(repr)), max_size=5),
       sep=st.sampled_from([",", ", ", ",,"]))
@example(radii=["0.25", "0.25"], sep=",")
def test_radius_lists(tmp_path_factory, radii, sep):
    """--radii of analyze and of a sequential certify: finite, >= 0, each once (`0.25,0.25` is refused)."""
    text = sep.join(radii)
    folder = tmp_path_factory.mktemp("out")
    result_file = folder / "r.tsv"
    result_file.write_text("idx\tlabel\tpredict\tradius\tcorrect\ttime\n0\t1\t1\t0.5\t1\t0:00:01\n"
                           "1\t2\t-1\t0.0\t0\t0:00:01\n")
    check("list analyze --radii", ["analyze", result_file, f"--radii={text}"], radii_list(text), folder)
    check("list certify --radii", CERTIFY[:-1] + [folder / "s.tsv", "--sequential", f"--radii={text}"],
          radii_list(text), folder)


# -- the command line itself -------------------------------------------------------------------------

@pytest.mark.parametrize("args", [["bogus"], ["--bogus"], ["certify"], ["certify", "--out", "X", "--bogus", "1"],
                                  ["certify", "--out", "X", "--method", "nope"], ["certify", "--out"],
                                  ["analyze"], ["merge", "X"], ["table", "--out", "X"],
                                  ["certify", "--out", "X", "--sequential"],
                                  ["certify", "--out", "X", "--radii", "0.5"],
                                  ["predict", "--out", "X", "--sequential"]])
def test_usage_errors_are_one_line(tmp_path, args):
    """click's own usage errors (unknown command or option, missing value or option, bad choice) end in
    one `error:` line too, not click's usage block."""
    check("usage " + " ".join(args[:2]), [tmp_path / "x" if a == "X" else a for a in args], False, tmp_path)


def test_help_is_not_an_error(tmp_path):
    for args in (["--help"], ["certify", "--help"], ["table", "--help"]):
        result = invoke(args)
        assert result.exit_code == 0 and "Usage" in result.output
    bare = invoke([])                           # `diffsmooth` alone: the help (exit code per click's version)
    assert "Usage" in bare.output and "Commands" in bare.output and "error:" not in bare.output
    assert snapshot(tmp_path) == {}


# -- text options holding numbers: --shard I/K, --unet-config JSON, bench's comma lists ---------------

def shard(text):
    if not text:
        return True                     # not given
    parts = text.split("/")
    values = [as_int(p) for p in parts]
    return len(values) == 2 and None not in values and values[1] >= 1 and 0 <= values[0] < values[1]


@FUZZ
@given(text=st.one_of(st.sampled_from(["0/4", "3/4", "4/4", "-1/4", "0/0", "1/1", "0/nan", "nan/2", "1/2/3", "",
                                       "0/99999999999999999999999", "0.5/2", "a/b", "/"]),
                      st.tuples(st.integers(-3, 10), st.integers(-3, 10)).map(lambda t: f"{t[0]}/{t[1]}"),
                      st.text(alphabet="0123456789/-. ", max_size=6)))
def test_shard(tmp_path_factory, text):
    folder = tmp_path_factory.mktemp("out")
    check("option certify --shard", _args("certify", "--shard", text, folder), shard(text), folder)


UNET_FIELDS = ["image_size", "model_channels", "num_res_blocks", "dropout", "num_heads", "channel_mult",
               "attention_resolutions", "learn_sigma", "bogus_field"]


@FUZZ
@given(field=st.sampled_from(UNET_FIELDS),
       value=st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "-1", "0", "0.5", "32", "\"32\"", "[]", "[1, 2]",
                              "null", "true", "{}", "99999999999999999999"]),
       broken=st.sampled_from([None, "cut", "list", "nan-literal"]))
def test_unet_config_json(tmp_path_factory, field, value, broken):
    """--unet-config: strict JSON (NaN / Infinity / 1e400 refused), an object of known UNet fields whose
    values the UNet takes; checked when the run plans, before a model loads."""
    text = f'{{"{field}": {value}}}'
    must = None
    if broken == "cut":
        text, must = text[:-1], False
    elif broken == "list":
        text, must = f"[{text}]", False
    elif broken == "nan-literal" or value in ("NaN", "Infinity", "-Infinity", "1e400") or field == "bogus_field":
        text, must = (text.replace(value, "NaN") if broken == "nan-literal" else text), False
    folder = tmp_path_factory.mktemp("out")
    args = ["certify", "--method", "dds", "--out", folder / "r.tsv", f"--unet-config={text}"]
    check("option certify --unet-config", args, must, folder)


@FUZZ
@given(option=st.sampled_from(["--backend", "--precision"]),
       names=st.lists(st.sampled_from(["torch", "onnxruntime", "fp32", "fp16", "bf16", "torch", "fp32", "x", ""]),
                      max_size=4))
def test_bench_name_lists(tmp_path_factory, option, names):
    allowed = {"--backend": {"torch", "onnxruntime", "tensorrt"}, "--precision": {"fp32", "fp16", "bf16"}}[option]
    given_names = [n for n in names if n]
    must = set(given_names) <= allowed and len(set(given_names)) == len(given_names)
    folder = tmp_path_factory.mktemp("out")
    check(f"list bench {option}", ["bench", f"{option}={','.join(names)}"], must, folder)

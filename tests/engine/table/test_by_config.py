"""The per-configuration layout (the paper's sigma x sigma' tables): rows, bold per sigma (ties,
groups, none where nothing certified), ACR only with fixed-n rows, Markdown and LaTeX escaping; and
the outputs a table writes on the demo models, with --plan fixed and with a sequential plan."""

import json

import pytest
from cli_helpers import invoke_ok
from table_fixtures import small_table_spec

from diffsmooth.engine.demo import shipped as demo_assets
from diffsmooth.engine.runs.analyze import average_certified_radius
from diffsmooth.engine.runs.results import read_rows
from diffsmooth.engine.table.by_config import (
    by_config_caption,
    by_config_latex,
    by_config_markdown,
    config_rows,
    markdown_text,
    parse_config,
)
from diffsmooth.engine.table.plans import table_plan
from diffsmooth.engine.table.report import tex_text
from diffsmooth.engine.table.spec import parse_spec

needs_demo = pytest.mark.skipif(not demo_assets.DEMO_UNET.exists(), reason="embedded demo models not shipped")
RADII = (0.0, 0.25, 0.5)


def _rows(radii, wrong=0):
    """Rows certified correct at each radius of `radii`, then `wrong` rows certified wrong (never counted)."""
    return [{"correct": 1, "radius": f"{r}"} for r in radii] + [{"correct": 0, "radius": "0.9"}] * wrong


# Six images per configuration; counts at r = 0 / 0.25 / 0.5 in the comments
BY_LINE = {
    "RS": {0.25: {"rs__noise_0.25": _rows([0.3, 0.3, 0.3, 0.1, 0.6], wrong=1)},          # 5 / 4 / 1
           0.5: {"rs__noise_0.50": _rows([0.9, 0.9, 0.4, 0.2], wrong=2)}},               # 4 / 3 / 2
    "DS a|b": {0.25: {"diffsmooth__noise_0.25__ls0.15__m21": _rows([0.3, 0.3, 0.3, 0.3, 0.2, 0.1]),   # 6 / 4 / 0
                      "diffsmooth__noise_0.25__ls0.28__m21": _rows([0.6, 0.6, 0.3, 0.1], wrong=2)},  # 4 / 3 / 2
               0.5: {"diffsmooth__my__net__ls0.53__m5": _rows([0.7, 0.7, 0.7, 0.35], wrong=2)}},              # 4 / 4 / 3
}
LINES = [("RS", None), ("DS a|b", None)]


def _table(rows):
    return [(r.line, r.sigma, r.config, r.counts, r.best) for r in rows]


def test_configuration_names_give_classifier_sigma_prime_and_m():
    assert parse_config("rs__noise_0.25") == ("rs", "noise_0.25", None, None)
    assert parse_config("dds__checkpoint.pth") == ("dds", "checkpoint.pth", None, None)
    assert parse_config("diffsmooth__my__net__ls0.53__m5") == ("diffsmooth", "my__net", 0.53, 5)


def test_a_row_per_sigma_and_configuration_and_the_best_per_sigma_in_bold_ties_included():
    rows = config_rows(LINES, BY_LINE, RADII, 6, lambda s, r: True, with_acr=True)
    assert _table(rows) == [
        ("RS", 0.25, "rs__noise_0.25", [5, 4, 1], [False, True, False]),
        ("DS a|b", 0.25, "diffsmooth__noise_0.25__ls0.15__m21", [6, 4, 0], [True, True, False]),     # tie at 0.25
        ("DS a|b", 0.25, "diffsmooth__noise_0.25__ls0.28__m21", [4, 3, 2], [False, False, True]),
        ("RS", 0.5, "rs__noise_0.50", [4, 3, 2], [True, False, False]),                             # tie at 0
        ("DS a|b", 0.5, "diffsmooth__my__net__ls0.53__m5", [4, 4, 3], [True, True, True]),
    ]
    # the counts spread over several values, so a row's counts cannot come from another row
    assert len({c for row in rows for c in row.counts}) == 7
    acr = {row.config: row.acr for row in rows}
    assert acr["rs__noise_0.25"] == pytest.approx((0.3 * 3 + 0.1 + 0.6) / 6)
    assert acr["diffsmooth__noise_0.25__ls0.28__m21"] == pytest.approx(1.6 / 6)
    assert acr["diffsmooth__noise_0.25__ls0.15__m21"] == pytest.approx(1.5 / 6)
    assert acr["rs__noise_0.50"] == pytest.approx(2.4 / 6) and acr["diffsmooth__my__net__ls0.53__m5"] == pytest.approx(2.45 / 6)
    assert [row.best_acr for row in rows] == [True, False, True, False, True]       # a tie at sigma 0.25: both


def test_acr_ties_are_bold_as_printed_and_a_column_nobody_certified_has_no_bold():
    by_line = {"A": {1.0: {"rs__a": _rows([0.5, 0.5, 0.5]) + _rows([], wrong=1)}},
               "B": {1.0: {"rs__b": _rows([0.5, 0.5, 0.5004]) + _rows([], wrong=1)}}}
    rows = config_rows([("A", None), ("B", None)], by_line, (0.0, 0.5, 2.0), 4, lambda s, r: True, with_acr=True)
    assert [row.counts for row in rows] == [[3, 3, 0], [3, 3, 0]]
    assert [row.best for row in rows] == [[True, True, False]] * 2
    assert rows[0].acr < rows[1].acr and [row.best_acr for row in rows] == [True, True]   # 0.375 both, printed
    nothing = {"A": {1.0: {"rs__a": _rows([], wrong=2)}}, "B": {1.0: {"rs__b": _rows([0.0004]) + _rows([], wrong=1)}}}
    rows = config_rows([("A", None), ("B", None)], nothing, (0.0, 0.5), 2, lambda s, r: True, with_acr=True)
    assert [row.counts for row in rows] == [[0, 0], [1, 0]] and [row.best for row in rows] == [[False, False], [True, False]]
    assert [round(row.acr, 3) for row in rows] == [0.0, 0.0] and not any(row.best_acr for row in rows)


def test_groups_each_have_their_own_best_per_sigma():
    """The paper bolds within each method family: lines of one group compete, other groups do not."""
    lines = [("RS", "baseline"), ("DS a|b", "DiffSmooth")]
    rows = config_rows(lines, BY_LINE, RADII, 6, lambda s, r: True, with_acr=False)
    assert [(row.group, row.sigma) for row in rows] == [("baseline", 0.25), ("baseline", 0.5), ("DiffSmooth", 0.25),
                                                        ("DiffSmooth", 0.25), ("DiffSmooth", 0.5)]
    assert rows[0].best == [True, True, True] and rows[1].best == [True, True, True]      # alone in its block
    assert rows[2].best == [True, True, False] and rows[3].best == [False, False, True]
    assert all(row.acr is None and not row.best_acr for row in rows)
    assert "per group and sigma" in caption_of("fixed", grouped=True)


def test_a_radius_a_run_did_not_settle_is_left_blank_and_never_bold():
    """--plan auto: a sigma's main run settles only the radii the pilot gave it."""
    rows = config_rows(LINES, BY_LINE, RADII, 6, lambda s, r: not (s == 0.25 and r == 0.5), with_acr=False)
    assert rows[2].counts == [4, 3, None] and rows[0].best == [False, True, False] and not any(
        row.best[2] for row in rows[:3])
    text = by_config_markdown(rows, RADII, "c")
    assert "| DS a\\|b | 0.25 | 0.28 | 21 | 66.7 | 50.0 | - |" in text


def test_markdown_layout_bold_and_escaping():
    rows = config_rows(LINES, BY_LINE, RADII, 6, lambda s, r: True, with_acr=True)
    text = by_config_markdown(rows, RADII, caption_of("fixed", n_max=100000))
    lines = text.splitlines()
    assert lines[2] == "| line | sigma | sigma' | m | ACR | r = 0 | r = 0.25 | r = 0.5 |"
    assert lines[4] == "| RS | 0.25 | - | - | **0.267** | 83.3 | **66.7** | 16.7 |"
    assert lines[5] == "| DS a\\|b | 0.25 | 0.15 | 21 | 0.250 | **100.0** | **66.7** | 0.0 |"
    assert lines[8] == "| DS a\\|b | 0.5 | 0.53 | 5 | **0.408** | **66.7** | **66.7** | **50.0** |"
    assert len(lines) == 9 and "fixed-n CERTIFY at n = 100,000" in lines[0] and "ACR: the average" in lines[0]
    assert markdown_text("a|b*c_d`e\\f<g>[h]") == "a\\|b\\*c\\_d\\`e\\\\f\\<g\\>\\[h\\]"


def test_a_classifier_column_only_where_a_line_sweeps_classifiers():
    swept = {"S": {0.5: {"rs__a_net": _rows([0.3]), "rs__b_net": _rows([0.6])}}}
    rows = config_rows([("S", None)], swept, RADII, 2, lambda s, r: True, with_acr=False)
    text = by_config_markdown(rows, RADII, "c")
    assert "| line | sigma | classifier | r = 0 |" in text and "| S | 0.5 | a\\_net | **50.0** | **50.0** | 0.0 |" in text


def test_latex_layout_bold_blocks_and_escaping():
    lines = [("RS & 50% #1", "g_1 {x}"), ("DS a|b", "g_1 {x}")]
    rows = config_rows(lines, {"RS & 50% #1": BY_LINE["RS"], "DS a|b": BY_LINE["DS a|b"]}, RADII, 6,
                       lambda s, r: True, with_acr=True)
    tex = by_config_latex(rows, RADII, "sigma' ~ $5 ^ \\x")
    body = tex.splitlines()
    assert "\\caption{$\\sigma'$ \\textasciitilde{} \\$5 \\textasciicircum{} \\textbackslash{}x}" in body
    assert "\\begin{tabular}{lllcccccc}" in body
    assert "Group & Line & $\\sigma$ & $\\sigma'$ & $m$ & ACR & 0 & 0.25 & 0.5 \\\\" in body
    first = body.index("g\\_1 \\{x\\} & RS \\& 50\\% \\#1 & 0.25 & - & - & \\textbf{0.267} & 83.3 & \\textbf{66.7} & 16.7 \\\\")
    assert body[first - 1] == "\\midrule"
    # the block's group and sigma on its first row only; a rule before the next sigma
    assert body[first + 1] == " & DS a\\textbar{}b &  & 0.15 & 21 & 0.250 & \\textbf{100.0} & \\textbf{66.7} & 0.0 \\\\"
    assert body[first + 3] == "\\midrule" and body[first + 4].startswith(" & RS \\& 50\\% \\#1 & 0.5 & ")
    assert tex.count("\\midrule") == 2 and tex.count("\\textbf") == 11
    assert tex_text("a_b & c") == "a\\_b \\& c"


def test_without_fixed_n_rows_there_is_no_acr_and_the_layout_says_why():
    rows = config_rows(LINES, BY_LINE, RADII, 6, lambda s, r: True, with_acr=False)
    for plan in ("all", "auto", "race"):
        caption = caption_of(plan)
        assert _plan(plan).no_acr() in caption and "--plan fixed" in caption
        text = by_config_markdown(rows, RADII, caption)
        assert "ACR |" not in text and "| line | sigma | sigma' | m | r = 0 |" in text
        assert "ACR" not in by_config_latex(rows, RADII, "c")
    assert _plan("fixed").no_acr() is None and "ACR: the average certified radius" in caption_of("fixed")
    assert "lower bound on --plan all's" in caption_of("race")


def _plan(name):
    return table_plan(name, pilot=2, margin=0.05, reach=2.5, tolerance=0.5)


def caption_of(plan: str, grouped: bool = False, n_max: int = 1000) -> str:
    """table_by_config.md's caption for a table of 6 images under `plan`."""
    p = _plan(plan)
    return by_config_caption("T", 6, p.how_by_config(n_max), grouped, p.no_acr())


def test_group_is_a_line_key_that_keeps_older_specs_fingerprints():
    plain = parse_spec({"line": [{"method": "rs"}]})
    grouped = parse_spec({"line": [{"method": "rs", "group": "baselines"}]})
    assert grouped.lines[0].group == "baselines" and plain.lines[0].group is None
    assert "group" not in plain.as_dict()["lines"][0] and plain.fingerprint() != grouped.fingerprint()
    with pytest.raises(Exception, match="group must be a non-empty string"):
        parse_spec({"line": [{"method": "rs", "group": ""}]})


# -- the outputs of a table on the demo models ------------------------------------------------------

# seven images (skip 72) at n = n-max = 50: the counts still spread over several values
SPEC = small_table_spec(title="layout | test", n_max=50, skip=72) + """[[line]]
name = "DiffSmooth_sweep"
method = "diffsmooth"
local_sigma = { "0.25" = 0.25, "0.5" = [0.25, 0.5] }
m = [1, 3]
"""


def _run(tmp_path, plan, spec=SPEC):
    (tmp_path / "spec.toml").write_text(spec)
    # --no-preflight: the layout is what these tests read (a table's preflight writes nothing there; the demo
    # table's tests run it)
    invoke_ok(["table", str(tmp_path / "spec.toml"), "--out", str(tmp_path / "t"), "--plan", plan, "--quiet",
               "--no-preflight"])
    return tmp_path / "t"


@needs_demo
@pytest.mark.slow
def test_fixed_table_writes_a_row_per_sigma_and_configuration_with_acr(tmp_path):
    out = _run(tmp_path, "fixed")
    summary = json.loads((out / "summary.json").read_text())
    layout = summary["by_config"]
    assert layout["no_acr"] is None
    got = [(r["line"], r["sigma"], r["local_sigma"], r["m"]) for r in layout["rows"]]
    assert got == [("RS", 0.25, None, None), ("DiffSmooth_sweep", 0.25, 0.25, 1), ("DiffSmooth_sweep", 0.25, 0.25, 3),
                   ("RS", 0.5, None, None), ("DiffSmooth_sweep", 0.5, 0.25, 1), ("DiffSmooth_sweep", 0.5, 0.25, 3),
                   ("DiffSmooth_sweep", 0.5, 0.5, 1), ("DiffSmooth_sweep", 0.5, 0.5, 3)]
    # each row's counts and ACR are its own result file's (a sweep: one file per configuration)
    runs = out / "runs"
    for row in layout["rows"]:
        sweep = runs / f"diffsmooth-sweep_s{row['sigma']:g}"
        path = sweep / f"{row['config']}.tsv" if row["method"] == "diffsmooth" else runs / f"rs_s{row['sigma']:g}.tsv"
        file_rows = read_rows(path)
        assert len(file_rows) == 7 and row["acr"] == pytest.approx(average_certified_radius(file_rows))
        for cell in row["cells"]:
            assert cell["certified"] == sum(int(r["correct"]) == 1 and float(r["radius"]) >= cell["radius"]
                                            for r in file_rows)
    counts = [c["certified"] for r in layout["rows"] for c in r["cells"]]
    assert len(set(counts)) >= 4, counts                  # the counts spread: rows cannot be swapped unnoticed
    for sigma in (0.25, 0.5):                              # bold: the best per sigma, every row of a tie
        block = [r for r in layout["rows"] if r["sigma"] == sigma]
        for k in range(4):
            top = max(r["cells"][k]["certified"] for r in block)
            assert [r["cells"][k]["best"] for r in block] == [bool(top) and r["cells"][k]["certified"] == top
                                                              for r in block]
    # the Markdown and LaTeX files hold the same rows, the caption escaped
    md = (out / "table_by_config.md").read_text().splitlines()
    assert md[0].startswith("layout | test:")
    assert md[2] == "| line | sigma | sigma' | m | classifier | ACR | r = 0 | r = 0.25 | r = 0.5 | r = 0.75 |"
    assert len(md) == 4 + 8 and all(line.startswith("| RS |") or line.startswith("| DiffSmooth\\_sweep |")
                                    for line in md[4:])
    tex = (out / "table_by_config.tex").read_text()
    assert "\\caption{layout \\textbar{} test:" in tex and tex.count("DiffSmooth\\_sweep") == 6
    assert tex.count("\\textbf") == sum(c["best"] for r in layout["rows"] for c in r["cells"]) + sum(
        r["best_acr"] for r in layout["rows"])
    assert (out / "table.md").is_file() and summary["rows"][0]["name"] == "RS"      # the best-over-sigma layout too
    # fixed-n CERTIFY (the paper's way): n0 + n-max samples for every image of every run (a sweep: one run per
    # sigma), an ACR column in table.md too, and result files in the reference layout (no samples column)
    assert summary["samples"]["total"] == summary["samples"]["fixed_n"] == 7 * (20 + 50) * 4
    assert summary["rows"][0]["acr"] is not None and "ACR" in (out / "table.md").read_text()
    assert "samples" not in read_rows(runs / "rs_s0.25.tsv")[0]


@needs_demo
@pytest.mark.slow
def test_a_sequential_table_has_no_acr_and_says_why(tmp_path):
    spec = SPEC.split("[[line]]")[0] + '[[line]]\nname = "RS"\nmethod = "rs"\n[[line]]\nname = "DDS"\nmethod = "dds"\n'
    out = _run(tmp_path, "all", spec)
    layout = json.loads((out / "summary.json").read_text())["by_config"]
    assert "--plan fixed" in layout["no_acr"] and all(r["acr"] is None for r in layout["rows"])
    assert [(r["line"], r["sigma"]) for r in layout["rows"]] == [("RS", 0.25), ("DDS", 0.25), ("RS", 0.5), ("DDS", 0.5)]
    md = (out / "table_by_config.md").read_text()
    assert layout["no_acr"] in md and "| ACR |" not in md and "| line | sigma | r = 0 |" in md
    assert "ACR &" not in (out / "table_by_config.tex").read_text()
    counts = [c["certified"] for r in layout["rows"] for c in r["cells"]]
    assert len(set(counts)) >= 3, counts


"""The paper's cells in the specs ([[published]]) beside a finished table's: the comparison (the best of a row's
lines, the run's 95% Clopper-Pearson interval over the images, a paper value outside it marked and counted), the
spec reader's refusals, every shipped paper spec's rows (every cell against the paper's LaTeX where it is at hand:
DIFFSMOOTH_PAPER_TEX, else ../shared/seed/diffsmooth-paper.tex beside the checkout), a demo-shaped table end to end
with a planted disagreement, and `table SPEC --check`'s preflight putting the paper's r = 0 cell beside the measured
bound."""

import json
import os
import re
from pathlib import Path
from statistics import NormalDist

import pytest
from click.testing import CliRunner
from table_fixtures import small_table_spec

from diffsmooth.cli import main
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.models import shipped
from diffsmooth.engine.table import published as paper
from diffsmooth.engine.table.report import Cell
from diffsmooth.engine.table.spec import load_spec, parse_spec

ROOT = Path(__file__).resolve().parents[3]
PAPER = ROOT / "specs" / "paper"
needs_demo = pytest.mark.skipif(not shipped.DEMO_UNET.exists(), reason="embedded demo models not shipped")


def _spec(published):
    return parse_spec({"radii": [0.5, 1.0], "data": {"dataset": "embedded"},
                       "line": [{"name": "A", "method": "rs"}, {"name": "B", "method": "rs"}], "published": published})


def test_a_row_is_the_best_of_its_lines_and_a_value_outside_the_interval_is_marked_and_counted():
    spec = _spec([{"name": "A or B", "lines": ["A", "B"], "cells": {"0": 80.0, "0.5": 10.0}, "acr": 0.4},
                  {"name": "A", "cells": {"1": 45.0}}])
    table = {"A": [Cell(0.0, 70, 100, 0.25, None), Cell(0.5, 40, 100, 0.25, None), Cell(1.0, 20, 100, 0.5, None)],
             "B": [Cell(0.0, 82, 100, 0.25, None), Cell(0.5, 30, 100, 0.5, None), Cell(1.0, 25, 100, 0.5, None)]}
    compared = paper.compare(spec.published, table, spec.radii)
    r0, r05 = compared["A or B"]
    assert (r0.certified, r0.measured, r0.outside) == (82, 82.0, False)       # B's 82 of 100: [73.1, 89.0] holds 80
    assert (r05.certified, r05.outside) == (40, True)                        # A's 40 of 100: [30.3, 50.3], not 10
    assert compared["A"][0].outside                                          # 20 of 100: [12.7, 29.2], not 45
    md = paper.markdown(spec.published, compared, {"A": 0.31, "B": 0.35}, spec.radii, sequential=False)
    assert "| A or B (A; B) | 82.0 [73.1, 89.0] / 80.0 | **40.0 [30.3, 50.3] / 10.0 (out)** |  | 0.350 / 0.400 |" in md
    assert "(2 of 3 cells)" in md
    tex = paper.latex(spec.published, compared, spec.radii)
    assert "40.0 / \\textbf{10.0}$^\\dagger$" in tex and "82.0 / 80.0" in tex
    summary = paper.summary(spec.published, compared, {"A": None, "B": None})
    assert (summary["compared"], summary["outside"]) == (3, 2)
    assert summary["rows"][0]["cells"][1] == {"radius": 0.5, "paper": 10.0, "measured": 40.0,
                                              "ci95": pytest.approx([30.33, 50.28], abs=0.01), "outside": True}


@pytest.mark.parametrize("published,message", [
    ([{"name": "X", "cells": {"0": 1.0}}], "published 1.lines: no line named 'X'"),
    ([{"name": "A", "cells": {"0.75": 1.0}}], "radius 0.75 is not in the spec's radii"),
    ([{"name": "A", "cells": {"0": 101.0}}], "is a percentage (0 to 100)"),
    ([{"name": "A", "cells": {"0": 1.0}, "table": 1}], "published 1: unknown key table"),
    ([{"name": "A", "cells": {}}], "cells must be a table of radius = percent"),
])
def test_published_rows_are_checked_in_one_line(published, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        _spec(published)


def test_published_cells_change_no_fingerprint():
    with_cells = _spec([{"name": "A", "cells": {"0": 50.0}}])
    assert with_cells.fingerprint() == _spec([]).fingerprint() and "published" not in with_cells.as_dict()


PAPER_SPECS = sorted(p for p in PAPER.rglob("*.toml") if "densepure" not in p.name and "ablation" not in p.name)


def _reach(spec) -> float:
    """The largest radius any certificate of the spec can reach: every one of N samples right gives the lower
    bound alpha^(1/N), at the spec's largest sigma."""
    return max(spec.sigmas) * NormalDist().inv_cdf(spec.alpha ** (1 / spec.n_max))


@pytest.mark.parametrize("path", PAPER_SPECS, ids=lambda p: str(p.relative_to(PAPER)))
def test_every_shipped_paper_table_carries_the_papers_cells_for_every_line(path):
    """Every line is some row's; a row has a cell at every radius the spec's N can reach. Past that reach the paper
    prints 0.0 or "-" (the same-N tables at N = 1,000 and 500, r = 2.5): a row holds 0.0 there or leaves it out."""
    spec = load_spec(path, {"models": "/m", "data": "/d"})
    covered = {name for row in spec.published for name in row.lines}
    assert covered == {line.name for line in spec.lines}
    reach = _reach(spec)
    for row in spec.published:
        cells = dict(row.cells)
        assert {r for r in spec.radii if r <= reach} <= cells.keys() <= set(spec.radii), row.name
        assert all(value == 0.0 for r, value in cells.items() if r > reach), row.name


def test_table_1s_and_the_sigma_prime_tables_cells_are_the_papers():
    """Spot checks against the paper's LaTeX (tab:cifar, tab:cifar_all, tab:imagenet_all)."""
    rows = load_spec(PAPER / "cifar10-table1.toml", {"models": "m", "data": "d"}).published
    table1 = {row.name: dict(row.cells) for row in rows}
    assert table1["DiffSmooth (SmoothAdv, extra data)"][0.0] == 85.4 and table1["DDS (Smoothed)"][0.25] == 69.9
    assert table1["Gaussian (Cohen et al.)"][2.25] == 7.6
    block = load_spec(PAPER / "cifar10-sigma-prime" / "sigma-1.00.toml", {"models": "m", "data": "d"}).published
    last = block[-1]
    assert last.name == "DiffSmooth (SmoothAdv, extra data), sigma' = 1.00" and last.acr == 0.914
    assert dict(last.cells)[2.25] == 20.0
    beit = load_spec(PAPER / "imagenet-sigma-prime" / "beit-sigma-0.50.toml", {"models": "m", "data": "d"}).published
    assert [(row.acr, dict(row.cells)[1.0]) for row in beit] == [(1.044, 61.8), (1.061, 63.2), (1.023, 62.0)]


def _rows(relative):
    spec = load_spec(PAPER / relative, {"models": "m", "data": "d"})
    return spec, {row.name: row for row in spec.published}


def test_the_no_shift_and_same_n_tables_cells_are_the_papers():
    """Spot checks against the paper's LaTeX (tab:imagenet_all_noshift, tab:cifar_sameN, tab:imagenet_sameN)."""
    spec, rows = _rows("imagenet-sigma-prime-noshift/resnet50-sigma-1.00.toml")
    assert [line.local_sigma[1.0] for line in spec.lines] == [(0.25,), (0.5,), (1.0,)] * 2      # not shifted
    last = rows["DiffSmooth (SmoothAdv), sigma' = 1.00"]
    assert (last.acr, dict(last.cells)[0.0], dict(last.cells)[3.0]) == (0.931, 37.0, 21.0)
    spec, rows = _rows("cifar10-same-n/n-5000-m-20.toml")
    assert (spec.n_max, {line.m[0.5] for line in spec.lines}) == (5000, {(20,)}) and 2.25 not in spec.radii
    assert dict(rows["DiffSmooth (SmoothAdv, extra data)"].cells) == dict(zip(
        spec.radii, (85.2, 76.0, 64.8, 49.2, 41.4, 34.4, 26.6, 23.0, 20.6)))
    spec, rows = _rows("imagenet-same-n/resnet50-n-1000-m-10.toml")
    assert spec.n_max == 1000 and _reach(spec) < 2.5 and 2.5 not in dict(rows["DiffSmooth (Gaussian)"].cells)
    assert dict(rows["DiffSmooth (SmoothAdv)"].cells) == {0.0: 64.6, 0.5: 57.2, 1.0: 46.0, 1.5: 32.8, 2.0: 27.8}
    spec, rows = _rows("imagenet-same-n/beit-n-2000-m-5.toml")
    assert dict(rows["DiffSmooth (Gaussian)"].cells)[1.5] == 40.1 and dict(rows["DiffSmooth (Gaussian)"].cells)[2.5] == 25.7
    # the row the paper labels "$N=20,000, m=5$": at N = 2,000 beside the Gaussian row, and at 20,000 to the letter
    _, at_2000 = _rows("imagenet-same-n/resnet50-n-2000-m-5.toml")
    spec, literal = _rows("imagenet-same-n/resnet50-smoothadv-n-20000-m-5.toml")
    assert spec.n_max == 20000 and literal["DiffSmooth (SmoothAdv)"].cells == at_2000["DiffSmooth (SmoothAdv)"].cells
    assert dict(literal["DiffSmooth (SmoothAdv)"].cells)[0.5] == 57.6


def test_the_same_n_tables_dds_rows_are_table_1s_and_table_2s():
    """tab:cifar_sameN's and tab:imagenet_sameN's DDS rows (N = 100,000 / 10,000) are the main tables' rows up to the
    same-N tables' largest radius, so the main tables' specs carry them (typed here from the same-N tables)."""
    same_n = {("cifar10-table1.toml", "DDS (Standard)"): (79.0, 62.0, 45.8, 32.6, 25.0, 17.6, 11.0, 6.2, 4.2),
              ("cifar10-table1.toml", "DDS (Smoothed)"): (79.8, 69.9, 55.0, 47.6, 37.4, 32.4, 28.6, 24.8, 15.4),
              ("imagenet-table2-resnet50.toml", "DDS (Standard)"): (67.4, 49.0, 33.0, 22.2, 17.4, 12.8),
              ("imagenet-table2-resnet50.toml", "DDS (Smoothed)"): (48.0, 40.6, 29.6, 23.8, 18.6, 16.0),
              ("imagenet-table2-beit.toml", "DDS (Smoothed, BEiT)"): (76.2, 60.2, 43.8, 31.8, 22.0, 17.8)}
    for (relative, name), cells in same_n.items():
        assert tuple(value for _, value in _rows(relative)[1][name].cells)[:len(cells)] == cells, name


def test_table_1s_dds_smoothed_row_is_the_best_of_dds_on_the_models_it_ticks():
    """Table 1 ticks "Extra data" for DDS (Smoothed): its SmoothAdv line is the extra-data (self-training) model's."""
    spec, rows = _rows("cifar10-table1.toml")
    assert rows["DDS (Smoothed)"].lines == ("DDS (Gaussian)", "DDS (SmoothAdv, extra data)")
    line = next(line for line in spec.lines if line.name == "DDS (SmoothAdv, extra data)")
    assert all("/self_training/" in line.classifier[sigma][0] for sigma in spec.sigmas)


def test_imagenet_smoothadv_at_sigma_025_carries_both_of_the_papers_readings():
    """tab:selected_smoothadv's eps-512 model and the appendix's eps-64 one at sigma = 0.25, each with the same cells."""
    for relative in ("imagenet-sigma-prime/resnet50-sigma-0.25.toml", "imagenet-sigma-prime-noshift/resnet50-sigma-0.25.toml"):
        spec, rows = _rows(relative)
        files = {line.name: line.classifier[0.25][0] for line in spec.lines}
        table, appendix = "DiffSmooth (SmoothAdv), sigma' = 0.25", "DiffSmooth (SmoothAdv), sigma' = 0.25, eps 64"
        assert "/DDN_2steps/eps_512/" in files[table] and files[appendix] == files[table].replace("eps_512", "eps_64")
        assert (rows[table].cells, rows[table].acr) == (rows[appendix].cells, rows[appendix].acr)
    main, main_rows = _rows("imagenet-table2-resnet50.toml")
    alternative, _ = _rows("imagenet-table2-resnet50-eps64.toml")
    before = {line.name: line for line in main.lines}
    for line in alternative.lines:
        for sigma in alternative.sigmas:
            path, = line.classifier[sigma]
            expected, = before[line.name].classifier[sigma]
            if sigma == 0.25 and line.source == "smoothadv":
                expected = expected.replace("/eps_512/", "/eps_64/")
            assert path == expected, (line.name, sigma)
    assert all(row == main_rows[row.name] for row in alternative.published)       # the paper's one set of cells


def _paper_tex():
    path = Path(os.environ.get("DIFFSMOOTH_PAPER_TEX") or ROOT.parent / "shared" / "seed" / "diffsmooth-paper.tex")
    return path.read_text() if path.is_file() else None


def _latex_table(tex, label):
    """A table of the paper's LaTeX as (radii, has ACR, rows): each row (its text, ACR or None, the cells: a number or
    None for "-"), in the order the paper prints them. The radius header is the first row of numbers only."""
    body = next(t for t in re.findall(r"\\begin\{table\*?\}(.*?)\\end\{table\*?\}", tex, re.S) if f"\\label{{{label}}}" in t)
    tabular = re.search(r"\\begin\{tabular\}(.*?)\\end\{tabular\}", body, re.S).group(1)
    clean = lambda cell: re.sub(r"\\[a-zA-Z]+|[{}\s$]", "", cell)
    number = lambda text: re.fullmatch(r"\d+\.\d+|-", text) is not None
    radii, rows = None, []
    for raw in tabular.split("\\\\"):        # LaTeX's row ends (a \\makecell's line break splits a label only)
        cells = [clean(cell) for cell in raw.split("&")]
        if radii is None:
            if cells and all(number(c) for c in cells if c) and any(cells):
                radii = [float(c) for c in cells if c]
            continue
        if len(cells) > len(radii) and all(number(c) for c in cells[-len(radii):]):
            values = [None if c == "-" else float(c) for c in cells[-len(radii):]]
            acr = float(cells[-len(radii) - 1]) if "ACR" in tabular else None
            rows.append((raw, acr, values))
    return radii, "ACR" in tabular, rows


# Each shipped paper spec's [[published]] rows, in order: the paper's table and each row's place among its rows
# (0: the first row under the radius header). A row two spec lines share (both readings of one model) repeats.
PAPER_ROWS = {
    "cifar10-table1.toml": ("tab:cifar", [0, 1, 2, 7, 8, 9, 10, 11]),
    "cifar10-sigma-prime/sigma-0.25.toml": ("tab:cifar_all", [0, 1, 9, 10, 18, 19]),
    "cifar10-sigma-prime/sigma-0.50.toml": ("tab:cifar_all", [2, 3, 4, 11, 12, 13, 20, 21, 22]),
    "cifar10-sigma-prime/sigma-1.00.toml": ("tab:cifar_all", [5, 6, 7, 8, 14, 15, 16, 17, 23, 24, 25, 26]),
    "cifar10-same-n/n-20000-m-5.toml": ("tab:cifar_sameN", [2, 5, 8]),
    "cifar10-same-n/n-10000-m-10.toml": ("tab:cifar_sameN", [3, 6, 9]),
    "cifar10-same-n/n-5000-m-20.toml": ("tab:cifar_sameN", [4, 7, 10]),
    "imagenet-table2-resnet50.toml": ("tab:imagenet", [0, 1, 6, 7, 8, 9]),
    "imagenet-table2-resnet50-eps64.toml": ("tab:imagenet", [1, 7, 9]),
    "imagenet-table2-beit.toml": ("tab:imagenet", [10, 12, 13]),
    "imagenet-sigma-prime/resnet50-sigma-0.25.toml": ("tab:imagenet_all", [0, 6, 6]),
    "imagenet-sigma-prime/resnet50-sigma-0.50.toml": ("tab:imagenet_all", [1, 2, 7, 8]),
    "imagenet-sigma-prime/resnet50-sigma-1.00.toml": ("tab:imagenet_all", [3, 4, 5, 9, 10, 11]),
    "imagenet-sigma-prime/beit-sigma-0.25.toml": ("tab:imagenet_all", [12, 13]),
    "imagenet-sigma-prime/beit-sigma-0.50.toml": ("tab:imagenet_all", [14, 15, 16]),
    "imagenet-sigma-prime/beit-sigma-1.00.toml": ("tab:imagenet_all", [17, 18, 19, 20]),
    "imagenet-sigma-prime-noshift/resnet50-sigma-0.25.toml": ("tab:imagenet_all_noshift", [0, 6, 6]),
    "imagenet-sigma-prime-noshift/resnet50-sigma-0.50.toml": ("tab:imagenet_all_noshift", [1, 2, 7, 8]),
    "imagenet-sigma-prime-noshift/resnet50-sigma-1.00.toml": ("tab:imagenet_all_noshift", [3, 4, 5, 9, 10, 11]),
    "imagenet-same-n/resnet50-n-2000-m-5.toml": ("tab:imagenet_sameN", [2, 5]),
    "imagenet-same-n/resnet50-n-1000-m-10.toml": ("tab:imagenet_sameN", [3, 6]),
    "imagenet-same-n/resnet50-n-500-m-20.toml": ("tab:imagenet_sameN", [4, 7]),
    "imagenet-same-n/resnet50-smoothadv-n-20000-m-5.toml": ("tab:imagenet_sameN", [5]),
    "imagenet-same-n/beit-n-2000-m-5.toml": ("tab:imagenet_sameN", [10]),
    "imagenet-same-n/beit-n-1000-m-10.toml": ("tab:imagenet_sameN", [11]),
    "imagenet-same-n/beit-n-500-m-20.toml": ("tab:imagenet_sameN", [12]),
}
# the same-N tables' DDS rows: the main tables' specs carry them
SAME_N_DDS = {("tab:cifar_sameN", 0): ("cifar10-table1.toml", "DDS (Standard)"),
              ("tab:cifar_sameN", 1): ("cifar10-table1.toml", "DDS (Smoothed)"),
              ("tab:imagenet_sameN", 0): ("imagenet-table2-resnet50.toml", "DDS (Standard)"),
              ("tab:imagenet_sameN", 1): ("imagenet-table2-resnet50.toml", "DDS (Smoothed)"),
              ("tab:imagenet_sameN", 9): ("imagenet-table2-beit.toml", "DDS (Smoothed, BEiT)")}


def test_every_shipped_paper_spec_has_its_place_in_the_papers_tables():
    assert set(PAPER_ROWS) == {str(p.relative_to(PAPER)) for p in PAPER_SPECS}
    for relative, (_, places) in PAPER_ROWS.items():
        assert len(places) == len(load_spec(PAPER / relative, {"models": "m", "data": "d"}).published), relative


@pytest.mark.parametrize("relative", sorted(PAPER_ROWS), ids=str)
def test_every_typed_cell_is_the_papers_latex(relative):
    """Each [[published]] row against its row of the paper's LaTeX: the table's radii, every cell ("-": no cell),
    the ACR where the table has a column for it, and the row's sigma' (a sigma x sigma' table) or m (a same-N one)."""
    tex = _paper_tex()
    if tex is None:
        pytest.skip("the paper's LaTeX is not at hand (DIFFSMOOTH_PAPER_TEX)")
    label, places = PAPER_ROWS[relative]
    radii, with_acr, rows = _latex_table(tex, label)
    spec = load_spec(PAPER / relative, {"models": "m", "data": "d"})
    assert list(spec.radii) == radii
    lines = {line.name: line for line in spec.lines}
    for row, place in zip(spec.published, places):
        raw, acr, values = rows[place]
        assert dict(row.cells) == {r: v for r, v in zip(radii, values) if v is not None}, (row.name, raw)
        assert row.acr == (acr if with_acr else None), row.name
        prime = re.search(r"sigma' = (\d\.\d\d)", row.name)
        if prime:
            assert f"{{{prime.group(1)}}}" in raw, (row.name, raw)
        if "sameN" in label:
            m, = {m for name in row.lines for m in lines[name].m[spec.sigmas[0]]}
            assert f"m={m}$" in raw, (row.name, raw)
    for (label, place), (relative, name) in SAME_N_DDS.items():
        radii, _, rows = _latex_table(tex, label)
        cells = dict(next(r for r in load_spec(PAPER / relative, {"models": "m", "data": "d"}).published
                          if r.name == name).cells)
        assert [cells[r] for r in radii] == rows[place][2], (label, place)


PUBLISHED = """
[[published]]
name = "RS as the paper"
lines = ["RS"]
cells = {{ "0" = {r0}, "2" = 0.0 }}
acr = 0.3

[[published]]
name = "RS, a planted disagreement"
lines = ["RS"]
cells = {{ "0" = 0.0, "2" = 50.0 }}
"""


@needs_demo
def test_a_finished_table_shows_the_papers_cells_beside_its_own_and_marks_a_disagreement(tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text(small_table_spec(radii=(0.25, 0.5, 2.0), n_max=30) + PUBLISHED.format(r0=50.0))
    out = tmp_path / "t"
    result = CliRunner().invoke(main, ["table", str(spec), "--out", str(out), "--plan", "fixed", "--quiet"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    asked = [k for k, line in enumerate(lines) if line.startswith("preflight: ")]
    wrote = [k for k, line in enumerate(lines) if line.startswith("wrote ")]
    assert asked and wrote and max(asked) < min(wrote), result.output     # the table asked before its first sample
    again = CliRunner().invoke(main, ["table", str(spec), "--out", str(out), "--plan", "fixed", "--quiet"])
    assert again.exit_code == 0 and "preflight: " not in again.output    # resumed in its folder: asked at the start
    summary = json.loads((out / "summary.json").read_text())
    pub = summary["published"]
    assert (pub["compared"], pub["outside"], pub["beyond_reach"], pub["agreeing"]) == (4, 1, 2, 1)
    agree, planted = pub["rows"]
    # n-max 30 reaches 0.82 sigma: r = 2 is beyond every run, labelled and counted neither way
    assert agree["cells"][1] == {"radius": 2.0, "paper": 0.0, "measured": 0.0, "ci95": [0.0, pytest.approx(40.96, abs=0.01)],
                                 "outside": False, "rerun95": [0.0, 0.0], "reach": False, "best_of_bias": 0.0}
    assert planted["cells"][0]["outside"] and planted["cells"][0]["paper"] == 0.0 and planted["cells"][0]["reach"]
    assert not planted["cells"][1]["outside"] and not planted["cells"][1]["reach"]
    assert any("50.0% at r = 2" in line and "reach further" in line for line in pub["findings"])
    assert agree["acr"]["paper"] == 0.3 and agree["acr"]["measured"] == summary["rows"][0]["acr"]
    r0 = summary["rows"][0]["cells"][0]
    assert agree["cells"][0]["measured"] == pytest.approx(100 * r0["certified_accuracy"])
    assert agree["cells"][0]["ci95"] == pytest.approx([100 * v for v in r0["ci95"]])
    low, high = agree["cells"][0]["rerun95"]
    assert low <= agree["cells"][0]["measured"] <= high and agree["shift"]["cells"] == 1
    md = (out / "table.md").read_text()
    assert "The paper's cells beside this table's, on the same images" in md and "(1 of 2 reachable cells" in md
    assert re.search(r"\*\*\d+\.\d / 0\.0 \[\d+\.\d, \d+\.\d\].* \(out\)\*\*", md), md
    assert "0.0 / 50.0 (beyond reach)" in md and "| RS as the paper (RS) |" in md
    tex = (out / "table.tex").read_text()
    assert "$^\\dagger$" in tex and "(n/r)" in tex
    assert "published" not in json.loads((out / "table.json").read_text())["spec"]


CHECKED = """
title = "check"
sigmas = [0.5]
radii = [0.5]
[data]
dataset = "embedded"
skip = 10
[[line]]
name = "RS"
method = "rs"{layer}
[[published]]
name = "RS"
cells = {{ "0" = {r0} }}
"""


@needs_demo
def test_the_check_puts_the_papers_r0_cell_beside_the_measured_bound_and_strict_fails_on_a_gap(tmp_path):
    spec = tmp_path / "spec.toml"
    args = ["table", str(spec), "--check", "--preflight-images", "50", "--preflight-samples", "1", "--strict"]
    spec.write_text(CHECKED.format(layer="", r0=50.0))
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "preflight: RS, sigma 0.5: clean" in result.output and "warning:" not in result.output
    assert "published: RS: the paper's r = 0 cell 50.0% beside at most 100.0% here" in result.output   # 1 sample: no bound
    spec.write_text(CHECKED.format(layer='\nnormalization = "none"', r0=90.0))      # a wrong layer: a gap
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 3, result.output            # the set-up is wrong (2: a bad invocation)
    warnings = [line for line in result.output.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 2 and "fix: --normalization normalize" in warnings[0], result.output
    assert "RS: the paper's r = 0 cell 90.0%" in warnings[1] and "cannot reproduce it" in warnings[1]
    assert "check passed with 2 preflight warning(s)" in result.output
    document = json.loads(CliRunner().invoke(main, [*args, "--json"]).stdout)
    assert not document["passed"] and document["warnings"] == [w.removeprefix("warning: ") for w in warnings]
    assert [(r["line"], r["sigma"]) for r in document["preflight"]] == [("RS", 0.5)]
    assert [f["check"] for f in document["preflight"][0]["findings"] if f["warning"]] == ["normalization"]
    # a table asks first: under --strict the same finding stops it before any sample, exit 3, nothing written
    run = CliRunner().invoke(main, ["table", str(spec), "--out", str(tmp_path / "x"), "--strict", "--preflight-images",
                                    "50", "--preflight-samples", "1"])
    assert run.exit_code == 3 and "stopped before any sample" in run.output, run.output
    assert not (tmp_path / "x").exists()

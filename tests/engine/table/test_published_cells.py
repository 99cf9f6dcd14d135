"""The paper's cells in the specs ([[published]]) beside a finished table's: the comparison (the best of a row's
lines, the run's 95% Clopper-Pearson interval over the images, a paper value outside it marked and counted), the
spec reader's refusals, every shipped paper spec's rows, a demo-shaped table end to end with a planted disagreement,
and `table SPEC --check`'s preflight putting the paper's r = 0 cell beside the measured bound."""

import json
from pathlib import Path

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


@pytest.mark.parametrize("path", sorted(p for p in PAPER.rglob("*.toml") if "densepure" not in p.name
                                        and "ablation" not in p.name), ids=lambda p: p.name)
def test_every_shipped_paper_table_carries_the_papers_cells_for_every_line(path):
    spec = load_spec(path, {"models": "/m", "data": "/d"})
    covered = {name for row in spec.published for name in row.lines}
    assert covered == {line.name for line in spec.lines}
    assert all(dict(row.cells).keys() == set(spec.radii) for row in spec.published)


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


PUBLISHED = """
[[published]]
name = "RS as the paper"
lines = ["RS"]
cells = {{ "0" = {r0}, "2" = 0.0 }}
acr = 0.3

[[published]]
name = "RS, a planted disagreement"
lines = ["RS"]
cells = {{ "2" = 50.0 }}
"""


@needs_demo
def test_a_finished_table_shows_the_papers_cells_beside_its_own_and_marks_a_disagreement(tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text(small_table_spec(radii=(0.25, 0.5, 2.0), n_max=30) + PUBLISHED.format(r0=50.0))
    out = tmp_path / "t"
    result = CliRunner().invoke(main, ["table", str(spec), "--out", str(out), "--plan", "fixed", "--quiet"])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    pub = summary["published"]
    assert (pub["compared"], pub["outside"]) == (3, 1)
    agree, planted = pub["rows"]
    assert agree["cells"][1] == {"radius": 2.0, "paper": 0.0, "measured": 0.0, "ci95": [0.0, pytest.approx(40.96, abs=0.01)],
                                 "outside": False}
    assert planted["cells"][0]["outside"] and planted["cells"][0]["paper"] == 50.0
    assert agree["acr"]["paper"] == 0.3 and agree["acr"]["measured"] == summary["rows"][0]["acr"]
    r0 = summary["rows"][0]["cells"][0]
    assert agree["cells"][0]["measured"] == pytest.approx(100 * r0["certified_accuracy"])
    assert agree["cells"][0]["ci95"] == pytest.approx([100 * v for v in r0["ci95"]])
    md = (out / "table.md").read_text()
    assert "The paper's cells beside this table's" in md and "(1 of 3 cells)" in md
    assert "**0.0 [0.0, 41.0] / 50.0 (out)**" in md and "| RS as the paper (RS) |" in md
    assert "$^\\dagger$" in (out / "table.tex").read_text()
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
    assert "published: RS: the paper's r = 0 cell 50.0% beside at most about" in result.output
    spec.write_text(CHECKED.format(layer='\nnormalization = "none"', r0=90.0))      # a wrong layer: a gap
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    warnings = [line for line in result.output.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 2 and "fix: --normalization normalize" in warnings[0], result.output
    assert "RS: the paper's r = 0 cell 90.0%" in warnings[1] and "cannot reproduce it" in warnings[1]
    assert "check passed with 2 preflight warning(s)" in result.output
    assert CliRunner().invoke(main, ["table", str(spec), "--out", str(tmp_path / "x"), "--strict"]).exit_code == 2

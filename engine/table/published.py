"""The paper's cells beside a finished table's (a spec's [[published]] rows, engine/table/spec.py): per row and
radius, the table's cell (the best of the row's lines, each already the best over sigma), its 95% Clopper-Pearson
interval over the images, the paper's value, and whether the paper's value lies outside the interval; the section
table.md and table.tex add and summary.json's `published`. How to read a difference: docs/paper-tables.md."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from diffsmooth.engine.runs.analyze import clopper_pearson
from diffsmooth.engine.table.report import Cell, tex_text
from diffsmooth.engine.table.spec import PublishedRow

MARK = "out"                # table.md's mark of a paper value outside the run's interval


@dataclass(frozen=True)
class Comparison:
    """One published cell beside the table's: `paper` in percent, the table's certified images of `images`."""

    row: str
    radius: float
    paper: float
    certified: int
    images: int

    @property
    def measured(self) -> float:
        return 100.0 * self.certified / self.images if self.images else float("nan")

    @property
    def ci95(self) -> Tuple[float, float]:
        """The run's 95% Clopper-Pearson interval over the images, in percent."""
        low, high = clopper_pearson(self.certified, self.images)
        return 100.0 * low, 100.0 * high

    @property
    def outside(self) -> bool:
        """The paper's value (printed to 0.1 point) lies outside the interval, beyond its rounding."""
        low, high = self.ci95
        return self.paper < low - 0.05 or self.paper > high + 0.05

    def as_dict(self) -> dict:
        return {"radius": self.radius, "paper": self.paper, "measured": self.measured, "ci95": list(self.ci95),
                "outside": self.outside}


def compare(published: Sequence[PublishedRow], table: Dict[str, List[Cell]],
            radii: Sequence[float]) -> Dict[str, List[Comparison]]:
    """{row name: its comparisons, in radius order}; a row whose lines did not run (none in `table`) is left out."""
    out: Dict[str, List[Comparison]] = {}
    for row in published:
        lines = [table[name] for name in row.lines if name in table]
        if not lines:
            continue
        cells = []
        for radius, paper in row.cells:
            k = list(radii).index(radius)
            best = max(line[k].certified for line in lines)
            cells.append(Comparison(row.name, radius, paper, best, lines[0][k].images))
        out[row.name] = cells
    return out


def measured_acr(row: PublishedRow, acr: Dict[str, Optional[float]]) -> Optional[float]:
    """The best ACR of the row's lines (None: the plan reports none)."""
    values = [acr[name] for name in row.lines if acr.get(name) is not None]
    return max(values) if values else None


def _cell_md(c: Comparison) -> str:
    low, high = c.ci95
    text = f"{c.measured:.1f} [{low:.1f}, {high:.1f}] / {c.paper:.1f}"
    return f"**{text} ({MARK})**" if c.outside else text


def markdown(published: Sequence[PublishedRow], compared: Dict[str, List[Comparison]], acr: Dict[str, Optional[float]],
             radii: Sequence[float], sequential: bool) -> str:
    """table.md's section: a row per published row, each cell `measured [95% CI] / paper`, bold and marked `(out)`
    where the paper's value lies outside the interval."""
    if not compared:
        return ""
    rows = [row for row in published if row.name in compared]
    shown = [r for r in radii if any(c.radius == r for row in rows for c in compared[row.name])]
    with_acr = any(row.acr is not None for row in rows)
    outside = sum(c.outside for cells in compared.values() for c in cells)
    total = sum(len(cells) for cells in compared.values())
    lines = ["", f"The paper's cells beside this table's: measured [95% Clopper-Pearson interval over the images] / "
                 f"the paper's (%); **({MARK})**: the paper's value lies outside the interval ({outside} of {total} "
                 f"cells)." + (" Under a sequential plan a cell is a lower bound at the stopping look: compare with "
                               "`--plan fixed`." if sequential else "") + " How to read a difference: "
                 "docs/paper-tables.md.", "",
             "| paper's row (lines) | " + " | ".join(f"r = {r:g}" for r in shown) + (" | ACR (measured / paper)"
                                                                                      if with_acr else "") + " |",
             "|" + "---|" * (len(shown) + 1 + with_acr)]
    for row in rows:
        by_radius = {c.radius: c for c in compared[row.name]}
        name = row.name if list(row.lines) == [row.name] else f"{row.name} ({'; '.join(row.lines)})"
        cells = [_cell_md(by_radius[r]) if r in by_radius else "" for r in shown]
        if with_acr:
            mine = measured_acr(row, acr)
            cells.append(f"{'-' if mine is None else f'{mine:.3f}'} / {'-' if row.acr is None else f'{row.acr:.3f}'}")
        lines.append("| " + " | ".join([name] + cells) + " |")
    return "\n".join(lines) + "\n"


def latex(published: Sequence[PublishedRow], compared: Dict[str, List[Comparison]], radii: Sequence[float]) -> str:
    """table.tex's second table: per published row, `measured / paper` per radius, the paper's value in bold with a
    dagger where it lies outside the run's interval."""
    if not compared:
        return ""
    rows = [row for row in published if row.name in compared]
    shown = [r for r in radii if any(c.radius == r for row in rows for c in compared[row.name])]
    out = ["\\begin{table}[t]", "\\centering",
           "\\caption{The paper's cells beside this table's: measured / paper (\\%); $^\\dagger$: the paper's value lies "
           "outside the run's 95\\% Clopper-Pearson interval over the images.}",
           f"\\begin{{tabular}}{{l{'c' * len(shown)}}}", "\\toprule",
           " & ".join(["Paper's row"] + [f"{r:g}" for r in shown]) + " \\\\", "\\midrule"]
    for row in rows:
        by_radius = {c.radius: c for c in compared[row.name]}
        cells = []
        for r in shown:
            c = by_radius.get(r)
            if c is None:
                cells.append("")
            elif c.outside:
                cells.append(f"{c.measured:.1f} / \\textbf{{{c.paper:.1f}}}$^\\dagger$")
            else:
                cells.append(f"{c.measured:.1f} / {c.paper:.1f}")
        out.append(" & ".join([tex_text(row.name)] + cells) + " \\\\")
    out += ["\\bottomrule", "\\end{tabular}", "\\end{table}"]
    return "\n".join(out) + "\n"


def summary(published: Sequence[PublishedRow], compared: Dict[str, List[Comparison]],
            acr: Dict[str, Optional[float]]) -> dict:
    """summary.json's `published`: each row's cells beside the paper's, and how many lie outside."""
    rows = [{"name": row.name, "lines": list(row.lines), "cells": [c.as_dict() for c in compared[row.name]],
             "acr": {"paper": row.acr, "measured": measured_acr(row, acr)}}
            for row in published if row.name in compared]
    cells = [c for row in compared.values() for c in row]
    return {"rows": rows, "compared": len(cells), "outside": sum(c.outside for c in cells)}

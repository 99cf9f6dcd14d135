"""The paper's cells beside a finished table's (a spec's [[published]] rows, engine/table/spec.py): per row and
radius, the table's cell (the best of the row's lines, each already the best over sigma) and the paper's. The specs
certify the paper's own images, so what moves a cell between the paper's run and ours is Monte Carlo noise on those
images: each paper cell is compared with the interval that noise alone gives another run of the set-up
(engine/table/rerun_cells.py), cells no run can reach are labelled and left out, and a shift in one direction across a
row's (or the table's) cells is tested with the same draws. The section table.md and table.tex add and summary.json's
`published`. How to read a difference: docs/paper-tables.md."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from diffsmooth.engine.runs.analyze import clopper_pearson
from diffsmooth.engine.table.report import Cell, md_table, tex_text
from diffsmooth.engine.table.rerun_cells import (
    DRAWS,
    LEVEL,
    SHIFT_LEVEL,
    CellSpread,
    RowDraws,
    Shift,
    TableRuns,
    contenders,
    draw_lines,
    shift,
)
from diffsmooth.engine.table.spec import PublishedRow

MARK = "out"                # table.md's mark of a paper value outside the interval
BEYOND = "beyond reach"     # table.md's label of a cell no run of the row can certify
SHIFT_MARK = "shift"        # table.md's mark of a row whose cells are shifted in one direction
CAUSES_BELOW = ("another checkpoint than the paper's (retrained or fine-tuned files pass --check), the classifier's "
                "normalisation, sigma' or the local noise (DiffSmooth), the noise's scale (pixels in [0, 1] or "
                "[-1, 1]), the label order, another data selection or copy (other images, resized elsewhere), fp16 / "
                "bf16, or a smaller N or alpha than the paper's")
CAUSES_ABOVE = ("another (better) checkpoint, a larger N or alpha than the paper's, other images, or the paper's own "
                "cell (a misprint, or the appendix's other run: compare with both)")


@dataclass(frozen=True)
class Comparison:
    """One published cell beside the table's: `paper` in percent, the table's certified images of `images`, and
    (where the table's rows were at hand) the cell's spread under Monte Carlo noise on these images."""

    row: str
    radius: float
    paper: float
    certified: int
    images: int
    spread: Optional[CellSpread] = None

    @property
    def measured(self) -> float:
        return 100.0 * self.certified / self.images if self.images else float("nan")

    @property
    def ci95(self) -> Tuple[float, float]:
        """The run's 95% Clopper-Pearson interval over the images, in percent (another sample of the test set)."""
        low, high = clopper_pearson(self.certified, self.images)
        return 100.0 * low, 100.0 * high

    @property
    def interval(self) -> Tuple[float, float]:
        """Where another run of this set-up on these images puts the cell (95%), else the Clopper-Pearson interval."""
        return self.spread.interval if self.spread is not None else self.ci95

    @property
    def reach(self) -> bool:
        """Some run of the row can certify this radius (at its n and alpha)."""
        return self.spread is None or self.spread.reach

    @property
    def outside(self) -> bool:
        """A reachable cell whose paper value (printed to 0.1 point) lies outside the interval, beyond its rounding."""
        low, high = self.interval
        return bool(self.reach and (self.paper < low - 0.05 or self.paper > high + 0.05))

    def as_dict(self) -> dict:
        out = {"radius": self.radius, "paper": self.paper, "measured": self.measured, "ci95": list(self.ci95),
               "outside": self.outside}
        if self.spread is not None:
            out.update(rerun95=list(self.spread.interval), reach=self.spread.reach, best_of_bias=self.spread.bias)
        return out


@dataclass(frozen=True)
class Shifts:
    """Each row's shift across its reachable cells and the table's across all of them (engine/table/rerun_cells.py),
    what the paper's run is modelled as (`reference`) and the draws they come from."""

    rows: Dict[str, Shift]
    table: Shift
    reference: str
    draws: int = DRAWS
    findings: List[str] = field(default_factory=list)


def compare(published: Sequence[PublishedRow], table: Dict[str, List[Cell]], radii: Sequence[float],
            spread: Optional[Dict[str, RowDraws]] = None) -> Dict[str, List[Comparison]]:
    """{row name: its comparisons, in radius order}; a row whose lines did not run (none in `table`) is left out.
    `spread` ({row name: its draws}): each cell's spread under Monte Carlo noise (else the Clopper-Pearson interval)."""
    out: Dict[str, List[Comparison]] = {}
    for row in published:
        lines = [table[name] for name in row.lines if name in table]
        if not lines:
            continue
        cells = []
        for radius, paper in row.cells:
            k = list(radii).index(radius)
            best = max(line[k].certified for line in lines)
            draws = None if spread is None else spread[row.name].cell(k, best)
            cells.append(Comparison(row.name, radius, paper, best, lines[0][k].images, draws))
        out[row.name] = cells
    return out


def against_noise(published: Sequence[PublishedRow], table: Dict[str, List[Cell]], runs: TableRuns, images: int,
                  reference: str = "fixed", draws: int = DRAWS,
                  seed: int = 0) -> Tuple[Dict[str, List[Comparison]], Optional[Shifts]]:
    """The comparison against Monte Carlo noise on these images: (comparisons, shifts). `reference`: the paper's run
    as fixed-n CERTIFY at the spec's N ("fixed") or as another run of this table's plan ("same")."""
    rows = [row for row in published if any(name in table for name in row.lines)]
    if not rows:
        return {}, None
    lines = draw_lines(contenders(runs, reference), draws, seed)
    spread = {row.name: RowDraws.of(lines, row.lines, images) for row in rows}
    compared = compare(rows, table, runs.radii, spread)
    parts = {row.name: _shift_part(spread[row.name], compared[row.name], runs.radii) for row in rows}
    row_shifts = {name: shift([part]) for name, part in parts.items()}
    table_shift = shift(list(parts.values()))
    found = [finding(name, s) for name, s in row_shifts.items() if s.marked]
    if table_shift.marked and len(rows) > 1:
        found.append(finding("the table", table_shift))
    return compared, Shifts(row_shifts, table_shift, reference, draws, found + unreached(compared))


def unreached(compared: Dict[str, List[Comparison]]) -> List[str]:
    """One line per row whose paper certifies images at radii no run of the table can reach (not a noise question:
    the paper's N, alpha or sigmas reach further than this spec's)."""
    out = []
    for name, cells in compared.items():
        beyond = [c for c in cells if not c.reach and c.paper > 0.05]
        if beyond:
            listed = ", ".join(f"{c.paper:.1f}% at r = {c.radius:g}" for c in beyond)
            out.append(f"{name}: the paper certifies {listed}, beyond every run of this table at its n-max and alpha: "
                       f"the paper's N, alpha or sigmas reach further than this spec's (or its cell is not this row's).")
    return out


def _shift_part(draws: RowDraws, cells: List[Comparison], radii: Sequence[float]):
    """A row's reachable cells as rerun_cells.shift takes them."""
    kept = [c for c in cells if c.reach]
    return draws, [list(radii).index(c.radius) for c in kept], [c.paper for c in kept], [c.measured for c in kept]


def finding(name: str, s: Shift) -> str:
    """One line naming a marked shift and its likely causes."""
    where = "below" if s.points > 0 else "above"
    causes = CAUSES_BELOW if s.points > 0 else CAUSES_ABOVE
    return (f"{name}: {abs(s.points):.1f} points {where} the paper on average over {s.cells} reachable cells "
            f"({s.below} of them measured below it; p = {s.p_value:.2g} against Monte Carlo noise on these images, "
            f"marked below {SHIFT_LEVEL:g}), more than another draw of the noise moves it. Likely causes: {causes}; "
            f"run `diffsmooth preflight` on its lines and read docs/paper-tables.md (Reading a difference).")


def measured_acr(row: PublishedRow, acr: Dict[str, Optional[float]]) -> Optional[float]:
    """The best ACR of the row's lines (None: the plan reports none)."""
    values = [acr[name] for name in row.lines if acr.get(name) is not None]
    return max(values) if values else None


def _cell_md(c: Comparison) -> str:
    low, high = c.interval
    if c.spread is None:
        text = f"{c.measured:.1f} [{low:.1f}, {high:.1f}] / {c.paper:.1f}"
    elif not c.reach:
        return f"{c.measured:.1f} / {c.paper:.1f} ({BEYOND})"
    else:
        bias = f"; best-of {c.spread.bias:+.1f}" if abs(c.spread.bias) >= 0.05 else ""
        text = f"{c.measured:.1f} / {c.paper:.1f} [{low:.1f}, {high:.1f}]{bias}"
    return f"**{text} ({MARK})**" if c.outside else text


def _caption(compared: Dict[str, List[Comparison]], shifts: Optional[Shifts], sequential: bool) -> str:
    """The section's first paragraph: what a cell shows and what is marked."""
    cells = [c for row in compared.values() for c in row]
    outside = sum(c.outside for c in cells)
    if shifts is None:
        return (f"The paper's cells beside this table's: measured [95% Clopper-Pearson interval over the images] / "
                f"the paper's (%); **({MARK})**: the paper's value lies outside the interval ({outside} of {len(cells)} "
                f"cells)." + (" Under a sequential plan a cell is a lower bound at the stopping look: compare with "
                               "`--plan fixed`." if sequential else "") + " How to read a difference: "
                "docs/paper-tables.md.")
    beyond = sum(not c.reach for c in cells)
    paper = ("the paper's run modelled as fixed-n CERTIFY at this spec's N" if shifts.reference == "fixed"
             else "the other run modelled as this table's plan")
    return (f"The paper's cells beside this table's, on the same images: measured / the paper's (%) [the interval in "
            f"which Monte Carlo noise alone puts another run's cell, {100 * LEVEL:g}%, given the measured one; "
            f"{paper}; {shifts.draws:,} simulated reruns]; best-of: how much the measured cell, the best of several "
            f"runs (sigmas, configurations, lines), is expected above its best single run (the paper's cells are "
            f"best-ofs too). **({MARK})**: the paper's value lies outside ({outside} of {len(cells) - beyond} reachable "
            f"cells; about {100 * (1 - LEVEL):g}% fall outside by chance); ({BEYOND}): no run of the row can certify "
            f"the radius at its n and alpha ({beyond} cells, not counted). Below: each row's shift in one direction. "
            f"How to read a difference: docs/paper-tables.md.")


def _shift_md(rows: Sequence[PublishedRow], shifts: Shifts) -> List[str]:
    """The rows' and the table's shifts, and the findings."""
    head = ["", f"A shift in one direction: the paper's cell minus the measured one, averaged over the row's reachable "
                f"cells, against the same average in the simulated reruns (the cells' correlation kept); "
                f"**({SHIFT_MARK})**: p < {SHIFT_LEVEL:g}.", "",
            "| paper's row | paper - measured (points, mean) | cells below the paper | p |", "|---|---|---|---|"]
    named = [(row.name, shifts.rows[row.name]) for row in rows if row.name in shifts.rows]
    for name, s in named + ([("the table", shifts.table)] if len(named) > 1 else []):
        if not s.cells:
            head.append(f"| {name} | - | 0 reachable cells | - |")
            continue
        mark = f" **({SHIFT_MARK})**" if s.marked else ""
        head.append(f"| {name} | {s.points:+.2f}{mark} | {s.below} of {s.cells} | {s.p_value:.2g} |")
    return head + ([""] + [f"- {line}" for line in shifts.findings] if shifts.findings else [])


def markdown(published: Sequence[PublishedRow], compared: Dict[str, List[Comparison]], acr: Dict[str, Optional[float]],
             radii: Sequence[float], sequential: bool, shifts: Optional[Shifts] = None) -> str:
    """table.md's section: a row per published row, each cell `measured / paper [interval]` (without `shifts`:
    `measured [95% CI] / paper`), bold and marked `(out)` where the paper's value lies outside the interval, then
    the rows' shifts and what a marked one points at."""
    if not compared:
        return ""
    rows = [row for row in published if row.name in compared]
    shown = [r for r in radii if any(c.radius == r for row in rows for c in compared[row.name])]
    with_acr = any(row.acr is not None for row in rows)
    cells = []
    for row in rows:
        by_radius = {c.radius: c for c in compared[row.name]}
        name = row.name if list(row.lines) == [row.name] else f"{row.name} ({'; '.join(row.lines)})"
        cells.append([name] + [_cell_md(by_radius[r]) if r in by_radius else "" for r in shown])
        if with_acr:
            mine = measured_acr(row, acr)
            cells[-1].append(f"{'-' if mine is None else f'{mine:.3f}'} / {'-' if row.acr is None else f'{row.acr:.3f}'}")
    head = ["paper's row (lines)"] + [f"r = {r:g}" for r in shown] + (["ACR (measured / paper)"] if with_acr else [])
    lines = ["", _caption(compared, shifts, sequential), ""] + md_table(head, cells)
    if shifts is not None:
        lines += _shift_md(rows, shifts)
    return "\n".join(lines) + "\n"


def _cell_tex(c: Optional[Comparison]) -> str:
    if c is None:
        return ""
    if not c.reach:
        return f"{c.measured:.1f} / {c.paper:.1f} (n/r)"
    if c.outside:
        return f"{c.measured:.1f} / \\textbf{{{c.paper:.1f}}}$^\\dagger$"
    return f"{c.measured:.1f} / {c.paper:.1f}"


def latex(published: Sequence[PublishedRow], compared: Dict[str, List[Comparison]], radii: Sequence[float],
          shifts: Optional[Shifts] = None) -> str:
    """table.tex's second table: per published row, `measured / paper` per radius, the paper's value in bold with a
    dagger where it lies outside the interval, (n/r) where no run reaches the radius, a double dagger on a row whose
    cells are shifted in one direction."""
    if not compared:
        return ""
    rows = [row for row in published if row.name in compared]
    shown = [r for r in radii if any(c.radius == r for row in rows for c in compared[row.name])]
    if shifts is None:
        what = "outside the run's 95\\% Clopper-Pearson interval over the images."
    else:
        what = (f"outside the {100 * LEVEL:g}\\% interval Monte Carlo noise on these images gives another run's cell; "
                f"(n/r): beyond every run's reach at its $n$ and $\\alpha$; $^\\ddagger$: the row's cells are shifted "
                f"in one direction ($p < {SHIFT_LEVEL:g}$).")
    out = ["\\begin{table}[t]", "\\centering",
           f"\\caption{{The paper's cells beside this table's: measured / paper (\\%); $^\\dagger$: the paper's value "
           f"lies {what}}}",
           f"\\begin{{tabular}}{{l{'c' * len(shown)}}}", "\\toprule",
           " & ".join(["Paper's row"] + [f"{r:g}" for r in shown]) + " \\\\", "\\midrule"]
    for row in rows:
        by_radius = {c.radius: c for c in compared[row.name]}
        marked = shifts is not None and row.name in shifts.rows and shifts.rows[row.name].marked
        name = tex_text(row.name) + ("$^\\ddagger$" if marked else "")
        out.append(" & ".join([name] + [_cell_tex(by_radius.get(r)) for r in shown]) + " \\\\")
    out += ["\\bottomrule", "\\end{tabular}", "\\end{table}"]
    return "\n".join(out) + "\n"


def summary(published: Sequence[PublishedRow], compared: Dict[str, List[Comparison]],
            acr: Dict[str, Optional[float]], shifts: Optional[Shifts] = None) -> dict:
    """summary.json's `published`: each row's cells beside the paper's, how many lie outside, and with `shifts` the
    cells beyond reach, each row's and the table's shift, and the findings."""
    rows = []
    for row in published:
        if row.name not in compared:
            continue
        entry = {"name": row.name, "lines": list(row.lines), "cells": [c.as_dict() for c in compared[row.name]],
                 "acr": {"paper": row.acr, "measured": measured_acr(row, acr)}}
        if shifts is not None and row.name in shifts.rows:
            entry["shift"] = shifts.rows[row.name].as_dict()
        rows.append(entry)
    cells = [c for row in compared.values() for c in row]
    out = {"rows": rows, "compared": len(cells), "outside": sum(c.outside for c in cells)}
    if shifts is not None:
        out.update(beyond_reach=sum(not c.reach for c in cells),
                   agreeing=sum(c.reach and not c.outside for c in cells), shift=shifts.table.as_dict(),
                   findings=list(shifts.findings), reference=shifts.reference, draws=shifts.draws, level=LEVEL)
    return out

"""The table's outputs from its rows: cells (best over sigma and configuration per radius, the
reporting convention of Cohen et al. and the DiffSmooth paper), table.md, table.tex, curves.png and
summary.json."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence

from diffsmooth.engine.runs.analyze import average_certified_radius, clopper_pearson

# Rows of one line at one sigma: {configuration name: rows of every image of the table}
LineRows = Dict[float, Dict[str, List[dict]]]


@dataclass(frozen=True)
class Cell:
    radius: float
    certified: int
    images: int
    sigma: Optional[float]
    config: Optional[str]
    swept: bool = False                 # the config was one of several the line ran at that sigma

    @property
    def accuracy(self) -> float:
        return self.certified / self.images if self.images else float("nan")

    def as_dict(self) -> dict:
        low, high = clopper_pearson(self.certified, self.images)
        return {"radius": self.radius, "certified_accuracy": self.accuracy, "ci95": [low, high],
                "sigma": self.sigma, "config": self.config}


def certified(rows: List[dict], radius: float) -> int:
    """Rows certified correct at `radius` (the printed radius, rounded down, is at least `radius`)."""
    return sum(1 for r in rows if int(r["correct"]) == 1 and float(r["radius"]) >= radius)


def line_cells(rows: LineRows, radii: Sequence[float], images: int, settles) -> List[Cell]:
    """Per radius, the best (sigma, configuration) among the runs that settle it (`settles(sigma, r)`)."""
    cells = []
    for r in radii:
        best = Cell(r, 0, images, None, None)
        for sigma in sorted(rows):
            if not settles(sigma, r):
                continue
            for config, config_rows in sorted(rows[sigma].items()):
                count = certified(config_rows, r)
                if best.sigma is None or count > best.certified:
                    best = Cell(r, count, images, sigma, config, len(rows[sigma]) > 1)
        cells.append(best)
    return cells


def line_acr(rows: LineRows) -> float:
    """The best average certified radius over the line's (sigma, configuration) runs (fixed-n only)."""
    return max(average_certified_radius(config_rows) for per in rows.values() for config_rows in per.values())


def caption(title: str, images: int, sigmas: Sequence[float], alpha: float, how: str) -> str:
    """table.md's caption; `how`: how the runs certify (the plan's, engine/table/plans.py)."""
    return (f"{title}: certified accuracy (%) at l2 radius r on {images} images; each cell is the best over "
            f"sigma in {{{', '.join(f'{s:g}' for s in sigmas)}}} (and over the line's configurations), the "
            f"reporting convention of Cohen et al. and the DiffSmooth paper; every certificate holds with "
            f"probability at least {1 - alpha:g}; {how}. Bold: the best line per radius.")


def _bold_columns(table: Dict[str, List[Cell]], radii: Sequence[float]) -> List[int]:
    return [max(cells[k].certified for cells in table.values()) for k in range(len(radii))]


def md_table(head: Sequence[str], rows: Iterable[Sequence[str]]) -> List[str]:
    """A markdown table's lines: the header, its rule, a line per row (each a list of cell texts)."""
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(row) + " |" for row in rows]


def markdown(table: Dict[str, List[Cell]], acr: Dict[str, Optional[float]], radii: Sequence[float], text: str,
             gaps: Optional[Dict[str, List[float]]] = None) -> str:
    best = _bold_columns(table, radii)
    with_acr = any(v is not None for v in acr.values())
    by_radius = ["method"] + [f"r = {r:g}" for r in radii]
    lines = [text, ""] + md_table(by_radius + (["ACR"] if with_acr else []), [
        [name] + [f"**{100 * c.accuracy:.1f}**" if c.certified == best[k] else f"{100 * c.accuracy:.1f}"
                  for k, c in enumerate(cells)] + ([f"{acr[name]:.3f}"] if with_acr else [])
        for name, cells in table.items()])
    lines += ["", "Where each cell comes from (sigma, and the configuration where a line sweeps several; - : no "
              "image certified):", ""] + md_table(by_radius, [[name] + [_source(c) for c in cells]
                                                             for name, cells in table.items()])
    if gaps:
        lines += ["", "The most each cell can be below `--plan all`'s (points; deterministic: images still undecided "
                  "for a sigma that could win the cell):", ""] + md_table(
            by_radius, [[name] + [f"{g:.1f}" for g in line_gaps] for name, line_gaps in gaps.items()])
    return "\n".join(lines) + "\n"


def _source(cell: Cell) -> str:
    if cell.sigma is None or cell.certified == 0:
        return "-"
    return f"{cell.sigma:g}" + (f"; {cell.config}" if cell.swept else "")


def latex(table: Dict[str, List[Cell]], acr: Dict[str, Optional[float]], radii: Sequence[float], text: str) -> str:
    best = _bold_columns(table, radii)
    with_acr = any(v is not None for v in acr.values())
    columns = "l" + "c" * (len(radii) + with_acr)
    head = " & ".join(["Method"] + [f"{r:g}" for r in radii] + (["ACR"] if with_acr else []))
    out = ["\\begin{table}[t]", "\\centering", f"\\caption{{{tex_text(text)}}}", f"\\begin{{tabular}}{{{columns}}}",
           "\\toprule", f"& \\multicolumn{{{len(radii)}}}{{c}}{{Certified accuracy (\\%) at $\\ell_2$ radius $r$}}"
           + (" &" if with_acr else "") + " \\\\", head + " \\\\", "\\midrule"]
    for name, cells in table.items():
        values = [f"\\textbf{{{100 * c.accuracy:.1f}}}" if c.certified == best[k] else f"{100 * c.accuracy:.1f}"
                  for k, c in enumerate(cells)]
        tail = [f"{acr[name]:.3f}"] if with_acr else []
        out.append(" & ".join([tex_text(name)] + values + tail) + " \\\\")
    out += ["\\bottomrule", "\\end{tabular}", "\\end{table}"]
    return "\n".join(out) + "\n"


_TEX = {"\\": "\\textbackslash{}", "&": "\\&", "%": "\\%", "$": "\\$", "#": "\\#", "_": "\\_", "{": "\\{",
        "}": "\\}", "~": "\\textasciitilde{}", "^": "\\textasciicircum{}", "|": "\\textbar{}",
        "<": "\\textless{}", ">": "\\textgreater{}"}


def tex_text(text: str) -> str:
    """Text as LaTeX: its special characters escaped, then sigma' and sigma as symbols."""
    text = "".join(_TEX.get(c, c) for c in text).replace("sigma'", "\0")
    return text.replace("sigma", "$\\sigma$").replace("\0", "$\\sigma'$")


def plot(path: Path, title: str, rows_by_line: Dict[str, LineRows], table: Dict[str, List[Cell]],
         radii: Sequence[float], images: int, settles) -> None:
    """Each sigma's certified accuracy at the radii it settles (its best configuration) as steps, and
    the best-over-sigma envelope, one panel per line; labelled axes, the title inside the picture.
    Between two listed radii a step shows the value at the larger one (a lower bound there)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(table), figsize=(4.2 * len(table), 3.6), squeeze=False, sharey=True)
    for ax, (name, cells) in zip(axes[0], table.items()):
        for sigma, per in sorted(rows_by_line[name].items()):
            config = max(per, key=lambda c: sum(certified(per[c], r) for r in radii))
            xs = [r for r in radii if settles(sigma, r)]
            ax.step(xs, [100 * certified(per[config], r) / images for r in xs], where="pre", marker=".",
                    label=f"sigma {sigma:g}", alpha=0.8)
        ax.step(list(radii), [100 * c.accuracy for c in cells], where="pre", color="black", linewidth=2,
                label="best over sigma")
        ax.set_title(name)
        ax.set_xlabel("l2 radius r")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("certified accuracy (%)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_summary(path: Path, table: Dict[str, List[Cell]], acr: Dict[str, Optional[float]], extra: dict,
                  gaps: Optional[Dict[str, List[float]]] = None) -> None:
    """summary.json; with `gaps` (race) each cell has `most_below_all`: the most, in points, that `--plan
    all`'s cell can exceed it."""
    rows = [{"name": name, "acr": acr[name],
             "cells": [dict(c.as_dict(), **({"most_below_all": gaps[name][k]} if gaps else {}))
                       for k, c in enumerate(cells)]} for name, cells in table.items()]
    path.write_text(json.dumps({"rows": rows, **extra}, indent=1, allow_nan=False) + "\n")

"""The per-configuration layout (the DiffSmooth paper's sigma x sigma' tables): a row per sigma and
configuration, a configuration being a line's (classifier, sigma', m) at that sigma (every
configuration of a sweep is a row of its own), with the certified accuracy per radius, the ACR where
the plan is `fixed`, and the best per sigma in bold (per group of lines, where the spec names groups).

table_by_config.md, table_by_config.tex and summary.json's `by_config` are written from the same rows
as table.md; nothing here runs a sample.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

from diffsmooth.engine.base_classifier.methods import method_named, method_names
from diffsmooth.engine.runs.analyze import average_certified_radius
from diffsmooth.engine.table.report import LineRows, certified, md_table, tex_text

ACR_DECIMALS = 3                # ACR is printed, and compared for the bold, at this precision


@dataclass
class ConfigRow:
    """One (sigma, configuration) row: counts per radius (None: a radius its run did not settle)."""

    group: Optional[str]
    line: str
    sigma: float
    config: str                         # the configuration's name (its result file's stem)
    method: str
    classifier: str
    local_sigma: Optional[float]
    m: Optional[int]
    counts: List[Optional[int]]
    images: int
    acr: Optional[float] = None
    best: List[bool] = field(default_factory=list)
    best_acr: bool = False

    def accuracy(self, k: int) -> Optional[float]:
        count = self.counts[k]
        return None if count is None else count / self.images

    def as_dict(self, radii: Sequence[float]) -> dict:
        return {"group": self.group, "line": self.line, "sigma": self.sigma, "config": self.config,
                "method": self.method, "classifier": self.classifier, "local_sigma": self.local_sigma, "m": self.m,
                "acr": self.acr, "best_acr": self.best_acr,
                "cells": [{"radius": r, "certified": c, "certified_accuracy": self.accuracy(k), "best": b}
                          for k, (r, c, b) in enumerate(zip(radii, self.counts, self.best))]}


def parse_config(name: str) -> tuple:
    """(method, classifier, sigma', m) from a configuration's name: `rs__STEM`, `dds__STEM`,
    `diffsmooth__STEM__lsSIGMA'__mM` (engine/base_classifier/configurations.py); the classifier's
    stem may itself hold `__`."""
    method, _, rest = name.partition("__")
    if method not in method_names() or not {"local_sigma", "m"} <= {o.name for o in method_named(method).options}:
        return method, rest, None, None
    classifier, local, m = rest.rsplit("__", 2)
    return method, classifier, float(local[2:]), int(m[1:])


def config_rows(lines: Sequence[tuple], rows_by_line: Dict[str, LineRows], radii: Sequence[float], images: int,
                settles: Callable[[float, float], bool], with_acr: bool) -> List[ConfigRow]:
    """Every (sigma, configuration) row of the table, in the order of the layout: group (in the order
    the spec first names it), sigma, line (the spec's order), configuration (sigma', m, classifier).
    `lines`: (name, group) per line; `settles(sigma, r)`: the runs whose rows count at r; `with_acr`:
    every image settled every radius (fixed-n CERTIFY), so the ACR is each configuration's own."""
    groups = list(dict.fromkeys(group for _, group in lines))
    out: List[ConfigRow] = []
    for group in groups:
        members = [name for name, g in lines if g == group]
        sigmas = sorted({s for name in members for s in rows_by_line.get(name, {})})
        for sigma in sigmas:
            block = []
            for name in members:
                per = rows_by_line.get(name, {}).get(sigma, {})
                for config in sorted(per, key=lambda c: _order(parse_config(c))):
                    method, classifier, local_sigma, m = parse_config(config)
                    counts = [certified(per[config], r) if settles(sigma, r) else None for r in radii]
                    acr = average_certified_radius(per[config]) if with_acr else None
                    block.append(ConfigRow(group, name, sigma, config, method, classifier, local_sigma, m, counts,
                                           images, acr))
            _mark_best(block, len(radii))
            out += block
    return out


def _order(parsed: tuple) -> tuple:
    method, classifier, local_sigma, m = parsed
    return (local_sigma if local_sigma is not None else -1.0, m or 0, classifier)


def _mark_best(block: List[ConfigRow], columns: int) -> None:
    """Bold: per radius the rows with the most certified images (every one of a tie; none where no row
    of the block certified an image there), and the rows with the largest ACR as printed (none where
    every ACR is 0)."""
    for k in range(columns):
        top = max((row.counts[k] for row in block if row.counts[k] is not None), default=None)
        for row in block:
            row.best.append(bool(top) and row.counts[k] == top)
    shown = [round(row.acr, ACR_DECIMALS) for row in block if row.acr is not None]
    for row in block:
        row.best_acr = bool(shown) and max(shown) > 0 and row.acr is not None and round(row.acr, ACR_DECIMALS) == max(shown)


def by_config_caption(title: str, images: int, how: str, grouped: bool, no_acr: Optional[str]) -> str:
    """table_by_config.md's caption; `how`: how the runs certify, `no_acr`: why there is no ACR column (None: there
    is one), both the plan's (engine/table/plans.py)."""
    per = "per group and sigma" if grouped else "per sigma"
    text = (f"{title}: certified accuracy (%) at l2 radius r on {images} images, a row per sigma and configuration "
            f"(a line's classifier, sigma' and m at that sigma); {how}. Bold: the best {per} in each column "
            f"(every row of a tie; none where no row certified an image)")
    return text + (", ACR: the average certified radius." if no_acr is None else ". " + no_acr)


def _percent(row: ConfigRow, k: int) -> str:
    value = row.accuracy(k)
    return "-" if value is None else f"{100 * value:.1f}"


def _columns(rows: Sequence[ConfigRow]) -> dict:
    """Which optional columns the layout has: group (the spec names groups), sigma' and m (a diffsmooth
    row), classifier (a line with several classifiers at one sigma), ACR."""
    per_line_sigma: Dict[tuple, set] = {}
    for row in rows:
        per_line_sigma.setdefault((row.line, row.sigma), set()).add(row.classifier)
    return {"group": any(row.group is not None for row in rows),
            "local": any(row.local_sigma is not None for row in rows),
            "classifier": any(len(v) > 1 for v in per_line_sigma.values()),
            "acr": any(row.acr is not None for row in rows)}


def _cells(row: ConfigRow, has: dict, text, bold) -> List[str]:
    """A row's cells; `text` escapes a name, `bold` marks a best value."""
    cells = ([text(row.group or "")] if has["group"] else []) + [text(row.line), f"{row.sigma:g}"]
    if has["local"]:
        cells += [f"{row.local_sigma:g}" if row.local_sigma is not None else "-",
                  f"{row.m}" if row.m is not None else "-"]
    if has["classifier"]:
        cells.append(text(row.classifier))
    if has["acr"]:
        acr = "-" if row.acr is None else f"{row.acr:.{ACR_DECIMALS}f}"
        cells.append(bold(acr) if row.best_acr else acr)
    return cells + [bold(_percent(row, k)) if row.best[k] else _percent(row, k) for k in range(len(row.counts))]


def markdown_text(text: str) -> str:
    """A name as Markdown table text: the characters that would end a cell or start emphasis escaped."""
    for c in ("\\", "|", "*", "_", "`", "<", ">", "[", "]"):
        text = text.replace(c, "\\" + c)
    return text


def by_config_markdown(rows: Sequence[ConfigRow], radii: Sequence[float], caption: str) -> str:
    has = _columns(rows)
    head = (["group"] if has["group"] else []) + ["line", "sigma"] + (["sigma'", "m"] if has["local"] else []) \
        + (["classifier"] if has["classifier"] else []) + (["ACR"] if has["acr"] else []) + [f"r = {r:g}" for r in radii]
    lines = [caption, ""] + md_table(head, (_cells(row, has, markdown_text, lambda v: f"**{v}**") for row in rows))
    return "\n".join(lines) + "\n"


def by_config_latex(rows: Sequence[ConfigRow], radii: Sequence[float], caption: str) -> str:
    """The paper's shape: group and sigma printed once per block, a rule between blocks, booktabs."""
    has = _columns(rows)
    names = (["Group"] if has["group"] else []) + ["Line", "$\\sigma$"] \
        + (["$\\sigma'$", "$m$"] if has["local"] else []) + (["Classifier"] if has["classifier"] else []) \
        + (["ACR"] if has["acr"] else [])
    out = ["\\begin{table}[t]", "\\centering", f"\\caption{{{tex_text(caption)}}}",
           f"\\begin{{tabular}}{{{'l' * (2 + has['group']) + 'c' * (len(names) - 2 - has['group'] + len(radii))}}}",
           "\\toprule",
           "& " * len(names) + f"\\multicolumn{{{len(radii)}}}{{c}}{{Certified accuracy (\\%) at $\\ell_2$ radius $r$}}"
           " \\\\", " & ".join(names + [f"{r:g}" for r in radii]) + " \\\\"]
    previous = None
    for row in rows:
        cells = _cells(row, has, tex_text, lambda v: f"\\textbf{{{v}}}")
        at = 1 if has["group"] else 0           # where the line's name is
        if previous is not None and (row.group, row.sigma) == previous:
            cells[at + 1] = ""                  # a block's sigma (and group) on its first row only
        else:
            out.append("\\midrule")
        if has["group"] and previous is not None and row.group == previous[0]:
            cells[0] = ""
        previous = (row.group, row.sigma)
        out.append(" & ".join(cells) + " \\\\")
    out += ["\\bottomrule", "\\end{tabular}", "\\end{table}"]
    return "\n".join(out) + "\n"


def by_config_summary(rows: Sequence[ConfigRow], radii: Sequence[float], caption: str, no_acr: Optional[str]) -> dict:
    """summary.json's `by_config`."""
    return {"caption": caption, "no_acr": no_acr, "rows": [row.as_dict(radii) for row in rows]}

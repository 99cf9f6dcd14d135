"""Certified accuracy and ACR from result files (the reference TSV, docs/compatibility.md): accuracy at r counts rows with
correct == 1 and radius >= r over ALL rows (abstains count as wrong); ACR = mean radius*correct.
Each accuracy comes with a 95% Clopper-Pearson interval over the images: a table of a few
hundred images is itself a sample of the test set."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from scipy.stats import binomtest

from diffsmooth.engine.runs.results import parse_time, read_rows

DEFAULT_RADII = (0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5)


def _pairs(rows) -> List[tuple]:
    return [(float(r["radius"]), int(r["correct"])) for r in rows]


def certified_accuracy(rows, radius: float) -> float:
    """Fraction of all rows certified correct with radius >= `radius`."""
    return certified_count(rows, radius) / len(rows) if len(rows) else float("nan")


def certified_count(rows, radius: float) -> int:
    """Rows certified correct with radius >= `radius`."""
    return sum(1 for rad, ok in _pairs(rows) if ok == 1 and rad >= radius)


def clopper_pearson(successes: int, total: int, level: float = 0.95) -> Tuple[float, float]:
    """Two-sided exact (Clopper-Pearson) interval for a proportion (scipy's binomtest)."""
    if total == 0:
        return float("nan"), float("nan")
    ci = binomtest(int(successes), int(total)).proportion_ci(confidence_level=level, method="exact")
    return float(ci.low), float(ci.high)


def average_certified_radius(rows) -> float:
    """ACR (MACER): mean over rows of radius * correct."""
    pairs = _pairs(rows)
    return sum(rad * ok for rad, ok in pairs) / len(pairs) if pairs else float("nan")


def summarize(path, radii: Sequence[float] = DEFAULT_RADII) -> Dict:
    """One file's certified accuracies, ACR, row count and mean time per image."""
    rows = read_rows(path)
    times = [parse_time(r["time"]) for r in rows if "time" in r]
    return {
        "file": str(path),
        "rows": len(rows),
        "certified_accuracy": {f"{r:g}": certified_accuracy(rows, r) for r in radii},
        "certified_accuracy_ci95": {f"{r:g}": list(clopper_pearson(certified_count(rows, r), len(rows)))
                                    for r in radii},
        "acr": average_certified_radius(rows),
        "mean_seconds_per_image": sum(times) / len(times) if times else None,
    }


def markdown_table(summaries: List[Dict], radii: Sequence[float] = DEFAULT_RADII, names=None) -> str:
    """A markdown table: one row per file, certified accuracy [95% CP interval] at each radius, then ACR."""
    names = names or [Path(s["file"]).stem for s in summaries]
    head = "| file | n images | " + " | ".join(f"r={r:g}" for r in radii) + " | ACR |"
    sep = "|" + "---|" * (len(radii) + 3)
    lines = [head, sep]
    for name, s in zip(names, summaries):
        accs = " | ".join(_cell(s, f"{r:g}") for r in radii)
        lines.append(f"| {name} | {s['rows']} | {accs} | {s['acr']:.3f} |")
    return "\n".join(lines + ["", "cells: certified accuracy [95% Clopper-Pearson interval over the images]"])


def _cell(summary: Dict, key: str) -> str:
    acc = f"{summary['certified_accuracy'][key]:.3f}"
    ci = summary.get("certified_accuracy_ci95", {}).get(key)
    return acc if ci is None else f"{acc} [{ci[0]:.2f}, {ci[1]:.2f}]"


def best_per_radius(summaries: List[Dict], radii: Sequence[float] = DEFAULT_RADII) -> str:
    """For each radius the configuration with the highest certified accuracy. A best-of choice
    made after seeing the results is a selection over configurations, not one certificate."""
    lines = ["best configuration per radius (a best-of selection over the files above, "
             "not the accuracy of one certified classifier):", "", "| radius | best | certified accuracy |", "|---|---|---|"]
    for r in radii:
        key = f"{r:g}"
        best = max(summaries, key=lambda s: s["certified_accuracy"][key])
        lines.append(f"| {key} | {Path(best['file']).stem} | {best['certified_accuracy'][key]:.3f} |")
    return "\n".join(lines)


def to_json(summaries: List[Dict]) -> str:
    return json.dumps(summaries, indent=2)


BAND_NOTE = "bands: 95% Clopper-Pearson over images"


def curve_figure(paths, names=None, title: str = "certified accuracy"):
    """The certified-accuracy-vs-radius figure of the files (matplotlib, imported here only). The
    title is wrapped to the axes' width and the band note gets its own line, so it stays inside the PNG."""

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = names or [Path(p).stem for p in paths]
    fig, ax = plt.subplots(figsize=(6, 4))
    for path, name in zip(paths, names):
        rows = read_rows(path)
        top = max([float(r["radius"]) for r in rows] + [0.0])
        grid = [top * i / 200 for i in range(201)] if top > 0 else [0.0]
        line, = ax.plot(grid, [certified_accuracy(rows, r) for r in grid], label=name)
        band = [clopper_pearson(certified_count(rows, r), len(rows)) for r in grid]
        ax.fill_between(grid, [b[0] for b in band], [b[1] for b in band], color=line.get_color(), alpha=0.15,
                        linewidth=0)
    ax.set_xlabel("l2 radius")
    ax.set_ylabel("certified accuracy")
    ax.set_title("\n".join(textwrap.wrap(title, 55) + [BAND_NOTE]), fontsize=10)
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig


def plot_curves(paths, out_png, names=None, title: str = "certified accuracy") -> None:
    """Certified accuracy vs radius for each file, one PNG."""
    import matplotlib.pyplot as plt
    fig = curve_figure(paths, names, title)
    Path(out_png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=120)
    plt.close(fig)

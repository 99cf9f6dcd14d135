"""A finished table's outputs from its rows: table.md, table.tex, curves.png, table_by_config.md / .tex
and summary.json (with the samples drawn against fixed-n's and the builds and compiles it took)."""

from __future__ import annotations

import dataclasses
import socket
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Dict, Sequence

from diffsmooth.engine.certify.sequential import SequentialRule
from diffsmooth.engine.table import by_config as layout
from diffsmooth.engine.table import published as paper
from diffsmooth.engine.table.plans import Outcome, Plan
from diffsmooth.engine.table.report import LineRows, caption, latex, line_acr, line_cells, markdown, plot, write_summary
from diffsmooth.engine.table.rerun_cells import TableRuns
from diffsmooth.engine.table.runner import PhaseRunner
from diffsmooth.engine.table.spec import TableSpec


@dataclasses.dataclass(frozen=True)
class RunFacts:
    """How the table ran, for summary.json: its PhaseRunner, the command line, the samples each rank computed now."""

    runner: PhaseRunner
    command: str
    computed: Sequence[int] = ()


def write_outputs(out: Path, spec: TableSpec, plan: Plan, images: int, outcome: Outcome, facts: RunFacts,
                  log) -> dict:
    """Every output file of the table in `out`; returns summary.json's run facts (from `facts` and the rows)."""
    runner, command, computed = facts.runner, facts.command, facts.computed
    rows_by_line, settles = outcome.rows_by_line, outcome.settles
    table = {name: line_cells(per, spec.radii, images, settles) for name, per in rows_by_line.items()}
    acr = {name: line_acr(per) if plan.reports_acr else None for name, per in rows_by_line.items()}
    gaps = None if outcome.bounds is None else {name: [100.0 * b.undecided_gap / images for b in line_bounds]
                                                for name, line_bounds in outcome.bounds.items()}
    text = caption(spec.title, images, spec.sigmas, spec.alpha, plan.how(spec.n_max))
    compared, shifts = paper.against_noise(spec.published, table, table_runs(spec, outcome), images, seed=spec.seed)
    (out / "table.md").write_text(markdown(table, acr, spec.radii, text, gaps)
                                  + paper.markdown(spec.published, compared, acr, spec.radii, not plan.reports_acr, shifts))
    (out / "table.tex").write_text(latex(table, acr, spec.radii, text)
                                   + paper.latex(spec.published, compared, spec.radii, shifts))
    plot(out / "curves.png", spec.title, rows_by_line, table, spec.radii, images, settles)
    by_config = _write_by_config(out, spec, plan, images, rows_by_line, settles)
    runs = len(spec.lines) * len(spec.sigmas)
    costs, pilot_samples, main_samples = outcome.costs, outcome.pilot_samples, outcome.main_samples
    measured = costs.get("measured", {})
    extra = {"plan": dataclasses.asdict(outcome.plan),
             "samples": {"total": pilot_samples + main_samples, "pilot": pilot_samples, "main": main_samples,
                         "fixed_n": images * (spec.n0 + spec.n_max) * runs},
             "seconds": {"predicted": costs["predicted"]["seconds"],
                         "measured": sum(m["seconds"] for m in measured.values()) if measured else None,
                         "pilot": costs.get("pilot_seconds")},
             "builds": runner.model_set.builds, "compiles": runner.model_set.compiles,
             "shared_passes": runner.shared_passes,
             "ranks": ranks_facts(computed, runner.phase_shares),
             "images": images, "version": _version(), "command": command, "seed": spec.seed,
             "device": spec.run.get("device", "cpu"), "host": socket.gethostname(), "spec": spec.as_dict()}
    if compared:
        extra["published"] = paper.summary(spec.published, compared, acr, shifts)
    write_summary(out / "summary.json", table, acr, dict(extra, by_config=by_config), gaps)
    log(f"table: wrote {out / 'table.md'}, table.tex, table_by_config.md, table_by_config.tex, curves.png, summary.json "
        f"({extra['samples']['total']:,} samples; fixed-n would draw {extra['samples']['fixed_n']:,})")
    return extra


def table_runs(spec: TableSpec, outcome: Outcome) -> TableRuns:
    """What the paper comparison reads of the finished table: its rows, radii, which runs settle which radius, n0,
    n-max, alpha and each sigma's sequential rule (as the table's runs use it: engine/table/build.py)."""
    radii = tuple(spec.radii)
    return TableRuns(outcome.rows_by_line, radii, outcome.settles, spec.n0, spec.n_max, spec.alpha,
                     lambda sigma: SequentialRule(radii, sigma, spec.alpha, spec.n_max, schedule_radii=radii))


def ranks_facts(computed: Sequence[int], phases: Sequence[dict]) -> dict:
    """summary.json's `ranks`: how many ran this invocation, the samples each computed, and each pass's shares
    (runner.pass_shares) with the busiest pass's busiest rank over that pass's mean."""
    spread = [p["busiest_over_mean"] for p in phases if p["busiest_over_mean"] is not None]
    return {"count": len(computed) or 1, "computed_samples": list(computed),
            "busiest_over_mean": max(computed) / (sum(computed) / len(computed)) if sum(computed) else None,
            "phases": list(phases), "busiest_phase_over_mean": max(spread) if spread else None}


def _write_by_config(out: Path, spec: TableSpec, plan: Plan, images: int, rows_by_line: Dict[str, LineRows],
                     settles) -> dict:
    """table_by_config.md / .tex: a row per sigma and configuration (the paper's sigma x sigma' layout);
    returns summary.json's `by_config`."""
    rows = layout.config_rows([(line.name, line.group) for line in spec.lines], rows_by_line, spec.radii, images,
                              settles, with_acr=plan.reports_acr)
    text = layout.by_config_caption(spec.title, images, plan.how_by_config(spec.n_max),
                                    any(line.group for line in spec.lines), plan.no_acr())
    (out / "table_by_config.md").write_text(layout.by_config_markdown(rows, spec.radii, text))
    (out / "table_by_config.tex").write_text(layout.by_config_latex(rows, spec.radii, text))
    return layout.by_config_summary(rows, spec.radii, text, plan.no_acr())


def _version() -> str:
    try:
        return version("diffsmooth-engine")
    except PackageNotFoundError:        # a source checkout on sys.path, not installed
        return "unknown"

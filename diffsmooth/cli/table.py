"""`diffsmooth table`: the paper's certified-accuracy table in one command (engine/table/)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from diffsmooth.cli.group import SETUP_EXIT
from diffsmooth.cli.options import echo_err
from diffsmooth.cli.param_types import BATCH, SAMPLES, THREADS, Count, Number
from diffsmooth.engine.choices import RUN_PRECISIONS
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.preflight.run import IMAGES as PREFLIGHT_IMAGES
from diffsmooth.engine.preflight.run import SAMPLES as PREFLIGHT_SAMPLES
from diffsmooth.engine.table.build import TableBuilder, TableInterrupted, TablePlanning, command_line
from diffsmooth.engine.table.check import check_table
from diffsmooth.engine.table.cost import on_ranks
from diffsmooth.engine.table.defaults import (
    DEMO_PILOT_IMAGES,
    MARGIN,
    PILOT_IMAGES,
    PLAN,
    RACE_REACH_SIGMAS,
    RADII,
    TOLERANCE_POINTS,
)
from diffsmooth.engine.table.plans import PLAN_NAMES
from diffsmooth.engine.table.runner import TableInputs
from diffsmooth.engine.table.spec import (
    DEMO_IMAGES,
    DEMO_N_MAX,
    DEMO_SIGMAS,
    SMOKE_IMAGES,
    SMOKE_N,
    demo_spec,
    load_spec,
    smoke_spec,
)


@click.command()
@click.argument("spec", required=False, type=click.Path(dir_okay=False))
@click.option("--demo", is_flag=True,
              help=f"The embedded demo table instead of SPEC: Fashion-MNIST demo models, sigma "
                   f"{' / '.join(str(s) for s in DEMO_SIGMAS)}, radii 0 to {max(RADII)}, {DEMO_IMAGES} images, "
                   f"n-max {DEMO_N_MAX}, pilot {DEMO_PILOT_IMAGES} (estimated about ten minutes on 2 idle CPU cores "
                   f"with every line).")
@click.option("--out", type=click.Path(file_okay=False),
              help="The table's folder (runs/, plan.json, cost.json, table.md, table.tex, curves.png, summary.json).")
@click.option("--models", "models_dir", type=click.Path(file_okay=False),
              help="The folder a spec's {models} paths start from (specs/paper/: docs/paper-tables.md).")
@click.option("--data", "data_dir", type=click.Path(file_okay=False), help="The folder a spec's {data} paths start from.")
@click.option("--check", is_flag=True,
              help="Check that every file SPEC names is in place (exists, loads weights-only, official keys and "
                   "shapes, normalisation, data and selected images), print what would run, write nothing. "
                   "Every table runs this check first.")
@click.option("--preflight/--no-preflight", "preflight", default=True, show_default=True,
              help="Before the first sample (and with --check, after the files), run `diffsmooth preflight` for every "
                   "line and sigma on a small sample (data, accuracies, normalisation, labels, denoiser; the paper's "
                   "r = 0 cell beside the measured bound). A table resumed in its folder skips it (it ran at the start).")
@click.option("--preflight-images", type=Count(1), default=PREFLIGHT_IMAGES, show_default=True,
              help="The preflight's images per run, drawn from the selection with the spec's seed.")
@click.option("--preflight-samples", type=Count(1, 10_000), default=PREFLIGHT_SAMPLES, show_default=True,
              help="The preflight's noise samples per image.")
@click.option("--strict", is_flag=True,
              help=f"A preflight warning stops the table before any sample (with --check: fails the check), exit code "
                   f"{SETUP_EXIT}: the set-up is wrong.")
@click.option("--json", "as_json", is_flag=True,
              help="With --check: one JSON document on stdout (the plan, problems, every run's preflight) instead of "
                   "the lines on stderr.")
@click.option("--smoke", is_flag=True,
              help=f"After the check, run SPEC at a smoke size ({SMOKE_IMAGES} images, n {SMOKE_N}; on the CPU where "
                   f"CUDA is missing): every line, sigma and file end to end in minutes; the numbers mean nothing.")
@click.option("--plan", "plan", type=click.Choice(PLAN_NAMES), default=PLAN, show_default=True,
              help="race: the sigmas race for each radius until every cell is within --tolerance of all's; auto: a "
                   "pilot assigns each radius to the sigmas that can win it; all: every sigma settles every radius "
                   "(sequential); fixed: fixed-n CERTIFY at n = n-max (the paper's way).")
@click.option("--tolerance", type=Number(0, 100, label="the tolerance"), default=TOLERANCE_POINTS, show_default=True,
              help="race: the most, in points, a cell may be below --plan all's (a deterministic bound; 0: all's cells). "
                   "A smaller one on a race's folder continues it.")
@click.option("--pilot", type=Count(1), default=None,
              help=f"Pilot images (race: for the cost prediction; auto: for the plan), an even stride through the "
                   f"selection [default: {PILOT_IMAGES}; demo: {DEMO_PILOT_IMAGES}].")
@click.option("--margin", type=Number(0, 1, label="the margin"), default=MARGIN, show_default=True,
              help="auto: a sigma also settles a radius where its pilot count is within max(1 image, MARGIN x pilot) "
                   "of the best sigma's.")
@click.option("--reach", type=Number(0, None, low_open=True, label="the reach"), default=RACE_REACH_SIGMAS,
              show_default=True,
              help="auto: a sigma other than the pilot's best settles a radius r only where r <= REACH x sigma (further "
                   "out, a larger sigma reaches r for a fraction of the samples); 100 lifts the cap.")
@click.option("--rows", default="rs,dds,diffsmooth", show_default=True,
              help="--demo: the lines of the demo table: any registered method's name (rs, dds, diffsmooth, ...), and "
              "dds-ddpm (DDS with the demo's diffusers DDPM as its denoiser).")
@click.option("--images", type=Count(1, 500, "the demo ships 500"), default=None,
              help="--demo: images (an even stride over the 500).")
@click.option("--n-max", type=SAMPLES, default=None, help="--demo: n-max (sequential) or n (fixed).")
@click.option("--device", default="cpu", show_default=True, help="--demo: the device (a SPEC names its own).")
@click.option("--threads", type=THREADS, default=None, help="--demo: CPU threads for torch.")
@click.option("--batch", type=BATCH, default=None, help="--demo: samples per forward batch.")
@click.option("--compile/--no-compile", "compile_", default=None,
              help="--demo: the compiled static-batch fast path [default: on for CUDA].")
@click.option("--precision", type=click.Choice(RUN_PRECISIONS), default=None,
              help="--demo: fp32, or fp16 / bf16 autocast on CUDA [default: fp32].")
@click.option("--one-pass/--no-one-pass", "one_pass", default=True, show_default=True,
              help="Lines that denoise at the same sigma (dds, diffsmooth) run their full runs as one pass: the "
                   "denoiser runs once per batch and each line's rows equal its separate run's.")
@click.option("--dry-run", is_flag=True, help="Print the plan and its cost estimate (after the pilot) and stop.")
@click.option("--ranks", type=Count(1), default=None,
              help="--dry-run: also estimate the table on this many torchrun ranks (GPUs).")
@click.option("--quiet", is_flag=True, help="No progress bars.")
def table(spec, demo, out, models_dir, data_dir, check, preflight, preflight_images, preflight_samples, strict, as_json,
          smoke, plan, tolerance, pilot, margin, reach, rows, images, n_max, device, threads, batch, compile_, precision,
          one_pass, dry_run, ranks, quiet):
    """The paper's table in one command: which sigma settles which radius, the cost first, table.md/tex, curves.png.

    Certified accuracy per radius, best over sigma, for every line of SPEC (a TOML file; see
    docs/table.md) or of the demo. Every run is an ordinary resumable result file under OUT/runs: a
    table stopped at any point (Ctrl-C, SIGTERM) continues when the same command runs again."""
    if demo == (spec is not None):
        raise UserError("give SPEC or --demo (one of them)")
    if as_json and not check:
        raise UserError("`as_json` belongs to `check` (a table writes summary.json)")
    if strict and not preflight:
        raise UserError("`strict` stops on the preflight's warnings: drop --no-preflight")
    if ranks is not None and not dry_run:
        raise UserError("`ranks` belongs to `dry_run` (under torchrun the ranks are torchrun's)")
    if out is None and not check:
        raise UserError("give --out DIR (the table's folder), or --check")
    if demo and smoke:
        raise UserError("`smoke` belongs to a SPEC (the demo is small already)")
    if demo and (models_dir or data_dir):
        raise UserError("`models_dir` and `data_dir` belong to a SPEC (the demo ships its models and data)")
    if demo:
        table_spec = demo_spec(tuple(r.strip() for r in rows.split(",") if r.strip()), images, n_max, device, threads,
                               batch, compile_, precision)
        pilot = DEMO_PILOT_IMAGES if pilot is None else pilot
    else:
        if (images, n_max, threads, batch, compile_, precision) != (None,) * 6 or rows != "rs,dds,diffsmooth" \
                or device != "cpu":
            raise UserError("`rows`, `images`, `n_max`, `device`, `threads`, `batch`, `compile` and `precision` belong "
                            "to `demo`; a SPEC names them")
        table_spec = load_spec(spec, {"models": models_dir, "data": data_dir})
        pilot = PILOT_IMAGES if pilot is None else pilot
    report = check_table(table_spec, {"models": models_dir, "data": data_dir})      # before any sample: seconds
    for line in report.plan if check and not as_json else ():
        echo_err(line)
    if report.problems:
        if as_json:
            click.echo(json.dumps({"passed": False, "plan": report.plan, "problems": report.problems}, indent=1))
        for line in report.problems:
            click.echo(f"error: {line}", err=True)
        echo_err(f"table: {len(report.problems)} problem(s); nothing was run or written")
        raise SystemExit(2)
    if check:
        lines = _preflight(table_spec, preflight_images, preflight_samples, quiet=as_json) if preflight else None
        warnings = lines.warnings if lines is not None else []
        if as_json:
            click.echo(json.dumps(check_document(report, lines, strict), indent=1, allow_nan=False))
        echo_err(f"table: check passed{f' with {len(warnings)} preflight warning(s)' if warnings else ''}; nothing was "
             f"written")
        if strict and warnings:
            raise SystemExit(SETUP_EXIT)
        return
    if smoke:
        import torch
        table_spec, notes = smoke_spec(table_spec, torch.cuda.is_available())
        for line in notes:
            echo_err(f"table: {line}")
    planning = TablePlanning(plan=plan, pilot=pilot, margin=margin, reach=reach, tolerance=tolerance)
    inputs = TableInputs()                  # the data and sources the preflight and the runs read, opened once
    builder = TableBuilder(table_spec, out, planning=planning, log=echo_err, command=command_line(), progress=not quiet,
                           one_pass=one_pass, inputs=inputs)
    if preflight and not (Path(out) / "table.json").exists():     # a table asks first: before its first sample
        _ask_first(table_spec, Path(out), preflight_images, preflight_samples, strict, inputs)
    try:
        builder.build(dry_run=dry_run)
        if ranks is not None:
            probe = builder.probe_run()
            echo_err(on_ranks(json.loads((builder.out / "cost.json").read_text()), ranks, len(probe.indices), probe.batch))
    except TableInterrupted as stop:
        echo_err(f"table: {stop}; finished rows are kept: run the same command again to continue")
        from diffsmooth.engine.runs.sharding import keep_launcher_from_restarting
        keep_launcher_from_restarting()
        raise SystemExit(130) from None


def _ask_first(table_spec, out: Path, images: int, samples: int, strict: bool, inputs) -> None:
    """A new table's preflight before its first sample (under torchrun rank 0 asks for all), on what the table
    opens (`inputs`: its TableInputs); under `strict` a warning stops it with SETUP_EXIT, nothing written. A folder
    another table writes is refused first."""
    from diffsmooth.engine.runs.locks import check_unlocked
    from diffsmooth.engine.table.ranks import Ranks
    check_unlocked(out, "table folder", True)
    asking = Ranks.join(table_spec.run.get("device", "cpu"))
    warnings = asking.agree(lambda: _preflight(table_spec, images, samples, inputs=inputs).warnings)
    if strict and warnings:
        echo_err(f"table: {len(warnings)} preflight warning(s) under --strict: stopped before any sample, nothing was "
             f"written (fix the set-up, or run without --strict)")
        raise SystemExit(SETUP_EXIT)


def _preflight(table_spec, images: int, samples: int, quiet: bool = False, inputs=None):
    """Every line's preflight (engine/table/preflight_lines.py), its lines and warnings printed (unless `quiet`);
    `inputs`: the table's opened data and sources (None: opened for the preflight). Returns the LinesPreflight."""
    from diffsmooth.engine.table.preflight_lines import preflight_lines
    held: list = []             # printed once every run's preflight is done: a refusal inside stays one line
    result = preflight_lines(table_spec, images, samples, held.append, inputs)
    held += [f"published: {line}" for line in result.published] + [f"warning: {line}" for line in result.warnings]
    for line in held if not quiet else ():
        echo_err(line)
    return result


def check_document(report, lines, strict: bool) -> dict:
    """`table --check --json`: the plan, every run's preflight (its findings and measurements), the published rows'
    r = 0 lines and every warning; `passed` is false where --strict would fail."""
    runs = [] if lines is None else [dict(line=line, sigma=sigma, configuration=config, **found.as_dict())
                                     for (line, sigma, config), found in lines.reports.items()]
    warnings = [] if lines is None else lines.warnings
    return {"passed": not (strict and warnings), "plan": report.plan, "problems": [], "preflight": runs,
            "published": [] if lines is None else lines.published, "warnings": warnings}

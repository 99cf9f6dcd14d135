"""The GPU fast path's options of certify / predict / table and bench, made from its one table
(engine/runs/fast_path_options.py's FAST_PATH_OPTIONS), and the once-per-run check of the fast path's counts
against eager fp32."""

from __future__ import annotations

import click

from diffsmooth.cli.param_types import Count, Number
from diffsmooth.engine.choices import MAX_SAMPLES
from diffsmooth.engine.runs.fast_path_options import FAST_PATH_OPTIONS

__all__ = ["compile_flag", "fast_path_flags", "fast_path_options"]


def _option(o):
    """The click option of one fast-path setting: a bool an on / off switch, an int a range or choice."""
    dash = o.flag[2:]
    if o.kind is bool:
        return click.option(f"--{dash}/--no-{dash}", o.name, default=o.default, help=o.help)
    if o.choices:
        kind = click.Choice([str(c) for c in o.choices])
        convert = (lambda ctx, param, value: None if value is None else int(value)) if o.kind is int else None
        return click.option(o.flag, o.name, type=kind, default=o.default, callback=convert, help=o.help)
    kind = Count(o.low, o.high) if o.kind is int else None
    return click.option(o.flag, o.name, type=kind, default=o.default, metavar=o.metavar, help=o.help)


def compile_flag():
    """`--compile/--no-compile` alone, as the fast path's table declares it: for the commands that run the Python API's
    path (demo, table --demo, serve), which takes compile and precision only."""
    return _option(next(o for o in FAST_PATH_OPTIONS if o.name == "compile"))


def fast_path_flags():
    """The fast path's settings as options, in the table's order (on by default with --device cuda; the
    time-per-sample variants opt-in); `bench` takes the same."""
    return tuple(_option(o) for o in FAST_PATH_OPTIONS if o.asked)


def fast_path_options():
    """The fast path's options of a run: its settings and the check of its counts against eager fp32."""
    return (
        *fast_path_flags(),
        click.option("--validate-samples", type=Count(0, MAX_SAMPLES), default=500, show_default=True,
                     help="Samples per image on which a compiled / fp16 / bf16 path's production counts are "
                          "checked against eager fp32 (TF32 off) once per run (0: skip)."),
        click.option("--validate-images", type=click.IntRange(1), default=4, show_default=True,
                     help="How many of the first selected images that check uses."),
        click.option("--expected-flip-rate", type=Number(0, 1, low_open=True, label="the flip rate"), default=None,
                     help="Per-sample vote flip rate a correct fast path shows; the check refuses a run that exceeds "
                          "it with 1-in-10,000 odds [default: measured on an H200, by precision and method: fp16 "
                          "1.3e-4, bf16 1.7e-3; DDS (a clean-trained classifier) fp16 1.1e-3, bf16 1.7e-2]."),
    )

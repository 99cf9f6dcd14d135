"""`diffsmooth env`: the facts a bug report needs."""

from __future__ import annotations

import json

import click

from diffsmooth.cli.param_types import Number
from diffsmooth.engine.env_report import collect_env, format_env


@click.command("env")
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of text.")
@click.option("--check-compile", is_flag=True,
              help="Also compile a tiny function with torch.compile (CPU, and CUDA when present).")
@click.option("--compile-timeout", type=Number(0, 7 * 86400, low_open=True, label="the timeout"), default=300.0,
              show_default=True,
              help="Seconds before --check-compile gives up.")
def env(as_json, check_compile, compile_timeout):
    """Versions, hardware and optional runtimes, for bug reports."""
    report = collect_env(compile_check=check_compile, compile_timeout=compile_timeout)
    click.echo(json.dumps(report, indent=1) if as_json else format_env(report))

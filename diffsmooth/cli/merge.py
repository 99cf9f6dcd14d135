"""`diffsmooth merge`: shard result files into one."""

from __future__ import annotations

import click

from diffsmooth.engine.runs.results import merge_results


@click.command()
@click.argument("out", type=click.Path())
@click.argument("shards", nargs=-1, required=True, type=click.Path())
def merge(out, shards):
    """Merge shard TSVs into OUT: sorted by idx, every index once (conflicting rows are refused)."""
    count = merge_results(shards, out)
    click.echo(f"merged {count} rows from {len(shards)} files into {out}", err=True)

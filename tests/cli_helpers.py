"""Helpers shared by the CLI-level tests."""

from click.testing import CliRunner

from diffsmooth.cli import main
from diffsmooth.engine.runs.results import read_rows


def invoke_ok(args):
    """Run the CLI in-process; fail the test with its output unless it exits 0."""
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result


def rows_without_time(path):
    """A result file's rows minus the wall-time column (the only one that may differ)."""
    return [{k: v for k, v in r.items() if k != "time"} for r in read_rows(path)]

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
    """A result file's rows minus the wall-time column (the only one that may differ), by index:
    rows are written in the order images finish, which packing may change."""
    rows = [{k: v for k, v in r.items() if k != "time"} for r in read_rows(path)]
    return sorted(rows, key=lambda r: int(r["idx"]))


def assert_rows_spread(path, *, min_classes: int = 2, abstain: bool = False):
    """Fail unless a result file could reveal a wrong noise index or batch offset: its predictions
    cover >= min_classes classes and (certify files) its non-zero radii take >= 2 values."""
    rows = read_rows(path)
    classes = {int(r["predict"]) for r in rows} - {-1}
    assert len(classes) >= min_classes, f"{path}: predictions {sorted(classes)} do not spread; fix the fixture"
    if abstain:
        assert any(int(r["predict"]) == -1 for r in rows), f"{path}: no abstain row"
    if rows and "radius" in rows[0]:
        radii = {r["radius"] for r in rows if float(r["radius"]) > 0}
        assert len(radii) >= 2, f"{path}: radii {sorted(radii)} do not differ; fix the fixture"

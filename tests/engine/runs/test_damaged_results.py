"""Readers refuse damaged result files: analyze, merge and resume each stop with one `error:` line naming
the file and line (`r.tsv:7: ...`) and exit code 2; only a run's own torn last line is repaired on resume."""

import pytest
from cli_helpers import invoke_ok, rows_without_time
from click.testing import CliRunner

from diffsmooth.cli import main
from diffsmooth.engine.runs.results import merge_results, read_rows, settings_path

HEADER = "idx\tlabel\tpredict\tradius\tcorrect\ttime"
ROWS = ["0\t0\t0\t0.5\t1\t0:00:01.5", "1\t1\t1\t0.25\t1\t0:00:01.5", "2\t2\t-1\t0.0\t0\t0:00:01.5",
        "3\t3\t3\t0.75\t1\t0:00:01.5"]
FAST = ["--n0", "8", "--n", "40", "--batch", "16", "--quiet"]

# name -> (the file's lines, the line number the refusal names, what it says)
DAMAGE = {
    "torn middle line": ([HEADER, ROWS[0], "1\t1\t1\t0.", *ROWS[2:]], 3, "expected 6 tab-separated fields, got 4"),
    "extra field": ([HEADER, ROWS[0], ROWS[1] + "\t7", *ROWS[2:]], 3, "got 7"),
    "missing field": ([HEADER, *ROWS[:2], "2\t2\t-1\t0.0\t0", ROWS[3]], 4, "got 5"),
    "empty field": ([HEADER, *ROWS[:3], "3\t3\t\t0.75\t1\t0:00:01.5"], 5, "empty field predict"),
    "index twice": ([HEADER, *ROWS, ROWS[1]], 6, "index 1 twice (also on line 3)"),
    "nan radius": ([HEADER, ROWS[0], "1\t1\t1\tnan\t1\t0:00:01.5", *ROWS[2:]], 3, "radius 'nan'"),
    "abc label": ([HEADER, *ROWS[:2], "2\tabc\t-1\t0.0\t0\t0:00:01.5", ROWS[3]], 4, "label 'abc'"),
    "bad time": ([HEADER, ROWS[0], "1\t1\t1\t0.25\t1\tsoon", *ROWS[2:]], 3, "time 'soon'"),
    "unknown header": (["idx\tlabel\tguess\tradius\tcorrect\ttime", *ROWS], 1, "not a result file"),
    "blank line": ([HEADER, *ROWS[:2], "", *ROWS[2:]], 4, "got 1"),
}


def invoke(args):
    return CliRunner().invoke(main, [str(a) for a in args])


def assert_refused(result, where, says):
    assert result.exit_code == 2, result.output
    assert result.output.startswith(f"error: {where}: ") and result.output.count("\n") == 1, result.output
    assert says in result.output, result.output


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_analyze_merge_and_resume_refuse_a_damaged_file(tmp_path, tiny_cli_args, damage):
    lines, number, says = DAMAGE[damage]
    path = tmp_path / "r.tsv"
    path.write_text("\n".join(lines) + "\n")
    before = path.read_bytes()
    where = f"{path}:{number}"
    assert_refused(invoke(["analyze", path]), where, says)
    merged = tmp_path / "m.tsv"
    assert_refused(invoke(["merge", merged, path]), where, says)
    assert not merged.exists()
    # resume: refused while planning (before models load, before the settings are recorded)
    assert_refused(invoke(["certify", *tiny_cli_args, "--method", "rs", *FAST, "--out", path]), where, says)
    assert path.read_bytes() == before and not settings_path(path).exists()


def test_a_torn_last_line_is_refused_by_readers_and_repaired_by_its_resume(tmp_path, tiny_cli_args):
    part, whole = tmp_path / "part.tsv", tmp_path / "whole.tsv"
    base = ["certify", *tiny_cli_args, "--method", "rs", *FAST]
    invoke_ok([*base, "--max", "3", "--out", part])
    with open(part, "a") as f:
        f.write("3\t3\t")                              # killed mid-row
    assert_refused(invoke(["analyze", part]), f"{part}:5", "torn last line")
    assert_refused(invoke(["merge", tmp_path / "m.tsv", part]), f"{part}:5", "torn last line")
    assert "3 already done" in invoke_ok([*base, "--out", part]).output
    invoke_ok([*base, "--out", whole])
    assert rows_without_time(part) == rows_without_time(whole)
    # a complete but malformed last line is not the run's own torn line: refused, not cut
    with open(part, "a") as f:
        f.write("9\t9\t9\n")
    assert_refused(invoke([*base, "--out", part]), f"{part}:8", "expected 6")


def test_every_known_header_and_both_time_formats_load(tmp_path):
    files = {
        "certify.tsv": [HEADER, "0\t3\t3\t0.5\t1\t15.4", "1\t2\t-1\t0.0\t0\t1 day, 0:00:01.5"],
        "sequential.tsv": [HEADER + "\tsamples\ttop_votes", "0\t3\t3\t0.5\t1\t0:00:02\t1100\t1000"],
        "old_sequential.tsv": [HEADER + "\tsamples", "0\t3\t3\t0.5\t1\t0:00:02\t1100"],
        "predict.tsv": ["idx\tlabel\tpredict\tcorrect\ttime", "0\t3\t-1\t0\t0:00:02"],
    }
    for name, lines in files.items():
        (tmp_path / name).write_text("\n".join(lines) + "\n")
        assert len(read_rows(tmp_path / name)) == len(lines) - 1
    (tmp_path / "empty.tsv").write_text("")
    assert read_rows(tmp_path / "empty.tsv") == []
    invoke_ok(["analyze", tmp_path / "certify.tsv", tmp_path / "sequential.tsv", tmp_path / "old_sequential.tsv"])


def test_merge_accepts_identical_rows_across_rank_files_and_refuses_conflicts(tmp_path):
    a, b, out = tmp_path / "a.tsv", tmp_path / "b.tsv", tmp_path / "m.tsv"
    a.write_text("\n".join([HEADER, ROWS[0], ROWS[1]]) + "\n")
    b.write_text("\n".join([HEADER, ROWS[1].replace("0:00:01.5", "0:00:09"), ROWS[2]]) + "\n")   # a restart
    assert merge_results([a, b], out) == 3
    b.write_text("\n".join([HEADER, ROWS[1].replace("\t0.25\t", "\t0.5\t")]) + "\n")
    result = invoke(["merge", out, a, b])
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert "index 1 has different results" in result.output and len(read_rows(out)) == 3


def test_stored_results_still_load():
    """The result files the tests and benchmarks read pass every check."""
    from pathlib import Path
    root = Path(__file__).resolve().parents[3]
    files = sorted((root / "tests" / "data").rglob("*.tsv")) + sorted(
        p for p in (root / "bench" / "results").glob("*/**/*.tsv")
        if p.name != "steps.tsv" and "table_demo" not in str(p))      # steps.tsv: gpu_check's, not rows
    assert len(files) >= 12
    for f in files:
        read_rows(f)

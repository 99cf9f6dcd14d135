"""Result TSVs: reference formatting, resume, torn-line repair; analysis arithmetic."""

import pytest

from diffsmooth.engine.errors import UserError
from diffsmooth.engine.runs.analyze import average_certified_radius, certified_accuracy, markdown_table, summarize
from diffsmooth.engine.runs.results import CERTIFY_COLUMNS, ResultWriter, format_radius, format_time, parse_time, read_rows


def test_formats():
    assert [format_radius(r) for r in (0.37812, 1.2345, 0.050412, 0.0)] == ["0.378", "1.23", "0.0504", "0.0"]
    assert format_time(151.238689) == "0:02:31.238689"
    assert parse_time("0:02:31.238689") == pytest.approx(151.238689)
    assert parse_time("15.4") == pytest.approx(15.4)
    assert parse_time("1 day, 0:00:01.5") == pytest.approx(86401.5)


def row(i, radius="0.5", correct=1):
    return dict(idx=i, label=1, predict=1 if correct else 0, radius=radius, correct=correct, time="0:00:01")


def test_writer_resume_and_torn_tail(tmp_path):
    path = tmp_path / "deep" / "dir" / "out.tsv"
    with ResultWriter(path) as w:
        w.write(**row(0))
        w.write(**row(5))
    with open(path, "a") as f:
        f.write("10\t1\t1\t0.")                      # killed mid-row
    with ResultWriter(path) as w:
        assert w.done == {0, 5}
        w.write(**row(10))
    lines = path.read_text().splitlines()
    assert lines[0].split("\t") == list(CERTIFY_COLUMNS)
    assert [l.split("\t")[0] for l in lines[1:]] == ["0", "5", "10"]


def test_writer_refuses_other_format(tmp_path):
    path = tmp_path / "x.tsv"
    path.write_text("a\tb\n1\t2\n")
    with pytest.raises(UserError, match="has columns"):
        ResultWriter(path)


def test_certified_accuracy_and_acr(tmp_path):
    rows = [dict(radius="0.5", correct="1"), dict(radius="1.0", correct="1"),
            dict(radius="0.7", correct="0"), dict(radius="0.0", correct="0")]   # wrong + abstain
    assert certified_accuracy(rows, 0.0) == 0.5
    assert certified_accuracy(rows, 0.6) == 0.25
    assert certified_accuracy(rows, 1.5) == 0.0
    assert average_certified_radius(rows) == pytest.approx(1.5 / 4)
    path = tmp_path / "cohen_old.tsv"
    path.write_text("idx\tlabel\tpredict\tradius\tcorrect\ttime\n0\t3\t3\t0.5\t1\t15.4\n1\t2\t-1\t0.0\t0\t16.6\n")
    s = summarize(path, [0.0, 0.5])
    assert s["certified_accuracy"] == {"0": 0.5, "0.5": 0.5} and s["mean_seconds_per_image"] == pytest.approx(16.0)
    table = markdown_table([s], [0.0, 0.5])
    assert "| cohen_old | 2 | 0.500 [0.01, 0.99] | 0.500 [0.01, 0.99] | 0.250 |" in table
    assert s["certified_accuracy_ci95"]["0.5"] == pytest.approx([1 - 0.975 ** 0.5, 0.975 ** 0.5])


def test_clopper_pearson_interval_over_images():
    """Exact 95% interval: covers the estimate, matches the beta quantiles, widens for fewer images."""
    from scipy.stats import beta

    from diffsmooth.engine.runs.analyze import clopper_pearson
    low, high = clopper_pearson(62, 100)
    assert low == pytest.approx(beta.ppf(0.025, 62, 39)) and high == pytest.approx(beta.ppf(0.975, 63, 38))
    assert low < 0.62 < high
    assert clopper_pearson(0, 100)[0] == 0.0 and clopper_pearson(100, 100)[1] == 1.0
    wide, narrow = clopper_pearson(31, 50), clopper_pearson(310, 500)
    assert wide[1] - wide[0] > 2 * (narrow[1] - narrow[0])


def test_read_rows_errors(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        read_rows(tmp_path / "missing.tsv")
    bad = tmp_path / "bad.tsv"
    bad.write_text("idx\tradius\n1\t2\t3\n")
    with pytest.raises(UserError, match="expected 2"):
        read_rows(bad)

"""Result TSVs: reference formatting, resume, torn-line repair; analysis arithmetic."""

import json
import math
import random
from decimal import Decimal

import numpy as np
import pytest
from click.testing import CliRunner
from scipy.stats import binom, norm

from diffsmooth.cli import main
from diffsmooth.engine.certify.cohen import lower_confidence_bounds
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.runs.analyze import average_certified_radius, certified_accuracy, markdown_table, summarize
from diffsmooth.engine.runs.results import (
    CERTIFY_COLUMNS,
    RADIUS_FORMAT,
    RADIUS_FORMAT_KEY,
    ResultWriter,
    check_or_record_settings,
    format_radius,
    format_time,
    parse_time,
    read_rows,
    settings_path,
)


def test_formats():
    assert [format_radius(r) for r in (0.37812, 1.2345, 0.050412, 0.0)] == ["0.378", "1.23", "0.0504", "0.0"]
    # rounded down, in the reference's '{:.3}' style (which rounds to nearest: 0.25, 1.0)
    assert [format_radius(r) for r in (0.2496, 0.9999, 1.0, 0.25, 2.0, 0.5)] == ["0.249", "0.999", "1.0", "0.25",
                                                                                "2.0", "0.5"]
    assert format_time(151.238689) == "0:02:31.238689"
    assert parse_time("0:02:31.238689") == pytest.approx(151.238689)
    assert parse_time("15.4") == pytest.approx(15.4)
    assert parse_time("1 day, 0:00:01.5") == pytest.approx(86401.5)


def _unit(value: float) -> Decimal:
    """One unit in the 3rd significant digit of value (> 0), exactly."""
    return Decimal(1).scaleb(Decimal(value).adjusted() - 2)


def test_radius_rounds_down_never_above_the_float():
    """The printed radius is <= the float and within one unit of its 3rd significant digit: at the
    3-digit thresholds (just below, at, just above) and on many random values."""
    values = []
    for threshold in (0.25, 0.1, 1.0, 0.5, 0.378, 1.23, 0.0504, 2.0, 0.999, 3.79):
        below = math.nextafter(threshold, 0.0)
        values += [below, threshold, math.nextafter(threshold, 2 * threshold), threshold - 1e-9, threshold + 1e-9]
        assert format_radius(below) != format_radius(threshold) or float(format_radius(threshold)) < threshold
    assert format_radius(math.nextafter(0.25, 0.0)) == "0.249" and format_radius(0.25) == "0.25"
    assert format_radius(math.nextafter(1.0, 0.0)) == "0.999" and format_radius(0.2496) == "0.249"
    # 0.484 and 0.3 are stored as floats just below them: they still print as themselves
    assert [format_radius(r) for r in (0.484, 0.3, math.nextafter(0.484, 0.0))] == ["0.484", "0.3", "0.483"]
    rng = random.Random(0)
    values += [rng.uniform(0.0, 4.0) for _ in range(20000)]
    values += [10 ** rng.uniform(-5, 1) for _ in range(20000)]
    for r in values:
        printed = format_radius(r)
        assert float(printed) <= r, (r, printed)
        # exactly: below the float's binary value, or the float is the printed number's own float
        assert Decimal(printed) <= Decimal(r) or float(printed) == r, (r, printed)
        assert Decimal(r) - Decimal(printed) < _unit(r), (r, printed)
        assert printed == "{:.3}".format(float(printed))                # the reference's style
        assert format_radius(float(printed)) == printed                  # read back and printed again: unchanged
    assert format_radius(0.0) == "0.0"                                  # abstain rows keep their radius 0.0


def test_rounding_to_nearest_certifies_above_alpha_rounding_down_does_not():
    """True pA just below Phi(r / sigma), n = 100,000, alpha = 0.001: the probability (exact, over
    the count) that the printed radius reaches r. Rounded to nearest ('{:.3}') 0.0022 at r = 0.25,
    above alpha; rounded down it is the computed radius's, <= alpha (docs/cli.md)."""
    n, alpha, sigma, r = 100_000, 0.001, 0.5, 0.25
    p_a = math.nextafter(float(norm.cdf(r / sigma)), 0.0)
    counts = np.arange(int(p_a * n) - 2000, int(p_a * n) + 2000)
    radii = sigma * norm.ppf(lower_confidence_bounds(counts, n, alpha))
    weight = binom.pmf(counts, n, p_a)

    def reaching(fmt):
        return float(weight[np.array([float(fmt(x)) >= r for x in radii])].sum())
    assert reaching("{:.3}".format) == pytest.approx(0.0022, abs=5e-5)
    assert reaching(format_radius) == pytest.approx(reaching(float)) and reaching(float) <= alpha


def test_a_file_with_radii_rounded_to_nearest_is_not_resumed(tmp_path):
    """Settings recorded without `radius_format` mean rows rounded to nearest: refused (UserError;
    the CLI's one `error:` line, exit code 2), while analyze still reads them."""
    out = tmp_path / "old.tsv"
    out.write_text("idx\tlabel\tpredict\tradius\tcorrect\ttime\n0\t3\t3\t0.25\t1\t0:00:01\n")
    old = dict(mode="certify", sigma=0.5)
    settings_path(out).write_text(json.dumps(old))
    with pytest.raises(UserError, match="rounded to nearest"):
        check_or_record_settings(out, dict(old, **{RADIUS_FORMAT_KEY: RADIUS_FORMAT}), record=False)
    check_or_record_settings(out, old, record=False)                    # a caller printing no radius: unchanged
    new = tmp_path / "new.tsv"
    check_or_record_settings(new, dict(old, **{RADIUS_FORMAT_KEY: RADIUS_FORMAT}))
    assert json.loads(settings_path(new).read_text())[RADIUS_FORMAT_KEY] == "3 significant digits, rounded down"
    result = CliRunner().invoke(main, ["certify", "--method", "rs", "--sigma", "0.5", "--n0", "10", "--n", "100",
                                       "--quiet", "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: ") and result.output.count("\n") == 1, result.output
    assert "rounded to nearest" in result.output and "--out" in result.output
    assert summarize(out, [0.25])["certified_accuracy"] == {"0.25": 1.0}


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
    bad.write_text("idx\tradius\n1\t2\n")
    with pytest.raises(UserError, match="bad.tsv:1: not a result file"):
        read_rows(bad)
    bad.write_text("idx\tlabel\tpredict\tcorrect\ttime\n1\t2\t3\n")
    with pytest.raises(UserError, match="bad.tsv:2: expected 5"):
        read_rows(bad)

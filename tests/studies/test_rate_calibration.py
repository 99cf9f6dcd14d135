import json
import math

import numpy as np
import pytest

from studies.rate_calibration import MODELS, calibrate

HEADER = "idx\tlabel\tpredict\tradius\tcorrect\ttime\tsamples\ttop_votes\n"


def _write(path, rows, n0=100):
    path.write_text(HEADER + "".join(f"{i}\t1\t1\t{r}\t1\t0:00:01\t{n + n0}\t{k}\n" for i, r, n, k in rows))
    path.with_name(path.name + ".settings.json").write_text(json.dumps({"n0": n0}))


def test_reruns_of_images_with_every_vote_are_counted_and_each_model_predicts_them(tmp_path):
    """Images 0-3 had every vote in their first run (371); the rerun kept every vote to 6,306 for 0-2 and
    missed for 3; image 4 had missed before, so it does not count."""
    _write(tmp_path / "line_s0.25.tsv", [(0, 0.5, 371, 371), (1, 0.5, 371, 371), (2, 0.5, 371, 371),
                                         (3, 0.5, 371, 371), (4, 0.25, 900, 880)])
    _write(tmp_path / "line_s0.25_to0.75.tsv", [(0, 0.75, 6306, 6306), (1, 0.75, 6306, 6306), (2, 0.75, 6306, 6306),
                                                (3, 0.5, 9000, 8990), (4, 0.3, 9000, 8900)])
    (entry,) = calibrate(tmp_path)
    assert entry["file"] == "line_s0.25_to0.75.tsv" and entry["images"] == 4 and entry["observed"] == 3
    expected = entry["expected"]
    assert expected[MODELS[0]] == pytest.approx(4 * (371.5 / 372) ** 5935)          # Jeffreys' estimate
    assert expected[MODELS[0]] < expected[MODELS[1]] < expected[MODELS[2]] <= 4
    assert 0.75 < entry["weight"] < 0.8         # 4 of 5 first rows unanimous, each not quite surely rate 1


def _write_run(path, rows, n0=100, seed=0):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(HEADER + "".join(f"{i}\t1\t1\t0.5\t1\t0:00:01\t{n + n0}\t{k}\n" for i, n, k in rows))
    path.with_name(path.name + ".settings.json").write_text(json.dumps({"n0": n0, "seed": seed, "sequential": True}))


def test_rerun_and_probe_checks_score_each_prior_and_refuse_rows_that_are_no_prefix(tmp_path):
    """First rows 0-3 with every vote at 371; a later folder's rows: 0-2 kept every vote to 8,000, 3 missed; 4 had
    missed before. A probe file continues images 0 and 1 of the later folder's rows."""
    import click

    from studies.rate_calibration import compare, fitted_table, poisson_binomial_p, probe_check, rerun_checks

    race, later = tmp_path / "race", tmp_path / "all"
    _write_run(race / "runs" / "line_s0.25.tsv", [(0, 371, 371), (1, 371, 371), (2, 371, 371), (3, 371, 371),
                                                  (4, 900, 880), (5, 200, 100)])
    _write_run(later / "runs" / "line_s0.25.tsv", [(0, 8000, 8000), (1, 8000, 8000), (2, 8000, 8000), (3, 9000, 8990),
                                                   (4, 9000, 8970), (5, 300, 150)])
    (check,) = rerun_checks(race, [later])
    assert check["horizon"] == {0: 8000 - 371, 1: 8000 - 371, 2: 8000 - 371, 3: 8000 - 371}
    assert check["kept"] == {0: True, 1: True, 2: True, 3: False} and check["after"][4] == (8090, 8100)
    (rows, half) = compare([check], ("mixture", "beta"))
    assert rows["mode"] == "rows" and half["mode"] == "half"
    for entry in (rows, half):
        assert [r["images"] for r in entry["results"]] == [6, 6] and entry["results"][0]["delta"] == 0.0
        assert all(r["kept"] == 3 and r["unanimous"] == 4 and 0 < r["expected"] <= 4 for r in entry["results"])
    probe = {"line": "line", "folder": str(later), "sigma": 0.25, "n0": 100, "seed": 0,
             "images": [{"idx": 0, "top_votes": 8000, "drawn": 8000, "unanimous": True, "probe_votes": 5000,
                         "probe_drawn": 5000},
                        {"idx": 3, "top_votes": 8990, "drawn": 9000, "unanimous": False, "probe_votes": 4998,
                         "probe_drawn": 5000}]}
    (tmp_path / "probe.json").write_text(json.dumps(probe))
    check = probe_check(tmp_path / "probe.json")
    assert check["after"] == {0: (5000, 5000), 3: (4998, 5000)} and check["kept"] == {0: True}
    table = fitted_table([check], [later], ("mixture", "beta"))
    assert table.count("| line | 0.25 |") == 4 and "| beta | pooled | a " in table
    _write_run(later / "runs" / "line_s0.25_to1.tsv", [(2, 9000, 7000)])      # 2,000 misses in 1,000 samples after 8,000
    with pytest.raises(click.ClickException, match="no prefix"):
        rerun_checks(race, [later])
    assert poisson_binomial_p(np.array([0.5, 0.5]), 1) == pytest.approx(1.0)
    assert poisson_binomial_p(np.array([0.9] * 10), 5) == pytest.approx(2 * sum(
        math.comb(10, j) * 0.9 ** j * 0.1 ** (10 - j) for j in range(6)))

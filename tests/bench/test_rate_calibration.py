import json

import pytest

from diffsmooth.bench.rate_calibration import MODELS, calibrate

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

"""The wrong-class stop (engine/certify/sequential.py, `sequential_job(label=...)`): a row whose selected
class is not the image's label stops after the selection; every other row is the row of a run without it."""

import numpy as np

from diffsmooth.engine.certify.cohen import ABSTAIN
from diffsmooth.engine.certify.jobs import drive
from diffsmooth.engine.certify.sequential import SequentialRule, sequential_job

RULE = SequentialRule((0.0, 0.25, 0.5), 0.25, 0.001, 2000)
CLASSES = 5


def counter(p_top, tops, seed=0):
    """count(first, num) -> [configurations, classes]: counter-based Binomial votes (the same samples give the
    same counts), configuration c voting for class tops[c] with rate p_top[c], the rest on class 4; records calls."""
    calls = []

    def count(first, num):
        calls.append((first, num))
        out = np.zeros((len(tops), CLASSES), dtype=np.int64)
        for c, (p, top) in enumerate(zip(p_top, tops)):
            votes = sum(np.random.default_rng([seed, c, first + i]).random() < p for i in range(num))
            out[c, top] += votes
            out[c, 4] += num - votes
        return out
    return count, calls


def test_a_row_whose_selected_class_is_not_the_label_stops_after_the_selection():
    count, calls = counter([0.99], [2])
    cert, = drive(sequential_job(50, RULE, label=3), count)
    assert calls == [(0, 50)]                       # no estimation sample was drawn
    assert cert.prediction == ABSTAIN and cert.radius == 0.0 and cert.samples == 50 and cert.top_votes == 0
    assert cert.state.selected == 2 and cert.state.samples == 0


def test_a_row_whose_selected_class_is_the_label_is_the_row_of_a_run_without_the_stop():
    count, _ = counter([0.97], [2])
    with_stop, = drive(sequential_job(50, RULE, label=2), count)
    without, = drive(sequential_job(50, RULE), count)
    assert with_stop == without
    assert with_stop.prediction == 2 and with_stop.samples > 150     # it certified and went past the first look


def test_in_a_sweep_only_the_wrong_rows_stop_and_the_others_equal_their_runs_without_it():
    count, calls = counter([0.97, 0.95, 0.99], [2, 1, 2])
    rows = drive(sequential_job(50, RULE, label=2), count)
    alone = drive(sequential_job(50, RULE), count)
    assert [r.state.selected for r in rows] == [2, 1, 2]
    assert rows[1].prediction == ABSTAIN and rows[1].samples == 50 and rows[1].top_votes == 0
    assert alone[1].prediction == 1 and alone[1].samples > 50       # without the stop it certifies the wrong class
    assert rows[0] == alone[0] and rows[2] == alone[2]
    assert calls[0] == (0, 50) and len(calls) > 2


def test_when_every_row_is_wrong_nothing_but_the_selection_is_drawn():
    count, calls = counter([0.9, 0.9], [1, 4])
    rows = drive(sequential_job(30, RULE, label=0), count)
    assert calls == [(0, 30)] and [r.samples for r in rows] == [30, 30]
    assert [r.state.selected for r in rows] == [1, 4]

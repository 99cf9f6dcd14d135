"""Going on from a stopped row (SequentialState): a job settling more radii from where an earlier run
of the same image stopped gives the rows of a run from the first sample, and draws fewer samples."""

from dataclasses import replace

import numpy as np
import pytest

from diffsmooth.engine.certify.jobs import drive
from diffsmooth.engine.certify.sequential import SequentialRule, continues, sequential_job

ALPHA = 0.001
TABLE = (0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5)


def _labels(seed: int, configs: int, total: int, tops) -> np.ndarray:
    """Each configuration's class per sample index (10 classes): its top class with its rate, else spread."""
    rng = np.random.default_rng(seed)
    out = rng.integers(0, 10, size=(configs, total))
    for c, (top, rate) in enumerate(tops):
        out[c, rng.random(total) < rate] = top
    return out


def _counter(labels: np.ndarray, drawn: list):
    def count(first: int, num: int) -> np.ndarray:
        drawn.append((first, num))
        return np.stack([np.bincount(row[first:first + num], minlength=10) for row in labels])
    return count


def _rule(radii, sigma=0.5, n_max=20_000):
    return SequentialRule(tuple(radii), sigma, ALPHA, n_max, schedule_radii=TABLE)


@pytest.mark.parametrize("seed", range(8))
def test_a_continued_sweep_gives_the_rows_of_a_fresh_run_with_fewer_samples(seed):
    """Three configurations (a sweep) with rates near the thresholds and classes that differ: the first
    run settles {0, 1.25}, the continued run every radius up to 1.5; rows equal a fresh run's."""
    tops = [(seed % 10, 0.97 + 0.003 * seed), ((seed + 3) % 10, 0.9), ((seed + 7) % 10, 0.995)]
    labels = _labels(seed, 3, 100 + 20_000, tops)
    first = drive(sequential_job(100, _rule((0.0, 1.25))), _counter(labels, []))
    wide = _rule(TABLE)
    assert all(continues(wide, c.state) for c in first)
    fresh_drawn, continued_drawn = [], []
    fresh = drive(sequential_job(100, wide), _counter(labels, fresh_drawn))
    continued = drive(sequential_job(100, wide, [c.state for c in first]), _counter(labels, continued_drawn))
    assert continued == fresh                                     # class, radius, samples and votes of every row
    assert [replace(c.state, started=0) for c in continued] == [c.state for c in fresh]     # where each stopped
    assert len({c.prediction for c in fresh}) == 3                # the rows' classes spread
    assert sum(n for _, n in continued_drawn) < sum(n for _, n in fresh_drawn)
    assert min(f for f, _ in continued_drawn) >= 100 + min(c.state.samples for c in first)
    # each row says where its run started drawing: the table counts a row's samples from there
    assert {c.state.started for c in continued} == {min(f for f, _ in continued_drawn) - 100}
    assert {c.state.started for c in fresh} == {0}


def test_a_row_the_wider_rule_would_stop_at_once_draws_nothing():
    """An image the first run ruled out at radius 0 (it abstained): the wider rule stops at the same look."""
    labels = _labels(1, 1, 100 + 20_000, [(4, 0.3)])
    first = drive(sequential_job(100, _rule((0.0, 1.25))), _counter(labels, []))
    assert first[0].radius == 0.0
    drawn = []
    again = drive(sequential_job(100, _rule(TABLE), [first[0].state]), _counter(labels, drawn))
    assert drawn == [] and again == drive(sequential_job(100, _rule(TABLE)), _counter(labels, []))
    assert again[0].state.started == first[0].state.samples                 # it drew nothing after its start


def test_a_state_from_another_schedule_or_more_radii_starts_afresh():
    """A state continues only with the same looks and levels and a superset of its radii; otherwise the
    job runs from the first sample (the same rows, all the samples)."""
    labels = _labels(2, 1, 100 + 20_000, [(6, 0.99)])
    first = drive(sequential_job(100, _rule((0.0, 1.25))), _counter(labels, []))
    for other in (_rule((0.0, 0.5)),                                  # not a superset of {0, 1.25}
                  SequentialRule(TABLE, 0.5, ALPHA, 20_000, schedule_radii=TABLE + (1.75,)),   # other looks
                  _rule(TABLE, n_max=10_000)):
        assert not continues(other, first[0].state)
        drawn = []
        rows = drive(sequential_job(100, other, [first[0].state]), _counter(labels, drawn))
        assert drawn[0] == (0, 100) and rows == drive(sequential_job(100, other), _counter(labels, []))


@pytest.mark.parametrize("seed", range(6))
def test_a_rule_deciding_its_largest_radius_goes_on_from_any_state_to_the_first_look_that_decides_it(seed):
    """The race's extensions: from a state of another radius set (here {0, 1.25}, not a subset of {0 .. r}),
    the rule with the radii up to r and decide_largest goes on to the first later look where `all` on the
    same path would certify r, never could (running upper below Phi(r / sigma)), or stops; the vectorised
    run_rule(..., after=) stops at the same look with the same bound."""
    from diffsmooth.engine.certify.sequential import look_decision, run_rule
    rate = (0.93, 0.97, 0.985, 0.99, 0.995, 0.9995)[seed]
    labels = _labels(seed, 1, 100 + 20_000, [(3, rate)])
    first = drive(sequential_job(100, _rule((0.0, 1.25))), _counter(labels, []))
    state = first[0].state
    for k in range(1, len(TABLE)):
        decide = SequentialRule(TABLE[:k + 1], 0.5, ALPHA, 20_000, schedule_radii=TABLE, decide_largest=True)
        assert continues(decide, state)
        drawn = []
        row = drive(sequential_job(100, decide, [state]), _counter(labels, drawn))[0]
        assert min((f for f, _ in drawn), default=100 + row.state.samples) >= 100 + state.samples
        # replay `all` (every radius) on the same path, look by look, from the first sample
        every = _rule(TABLE)
        hits = np.cumsum(labels[0, 100:] == row.prediction)
        lower, upper, verdict = np.zeros(1), np.ones(1), None
        for j, t in enumerate(every.looks()):
            lower, upper, stop = look_decision(every, hits[t - 1:t].astype(float), np.array([float(t)]), j, lower, upper)
            if t < state.samples:
                continue
            threshold = every.thresholds[k]
            if lower[0] > 0.5 and lower[0] >= threshold:
                verdict = (t, True)
            elif upper[0] < threshold or stop[0]:
                verdict = (t, False)
            if verdict:
                break
        assert (row.state.samples, row.radius >= TABLE[k] and row.radius > 0) == verdict, (rate, k)
        votes = np.diff(np.concatenate([[0], hits[np.asarray(decide.looks()) - 1]]))[None, :]
        final, used = run_rule(decide, votes, after=[state.samples])
        assert used[0] == row.state.samples and final[0] == pytest.approx(row.state.lower)


def test_the_running_lower_bound_never_passes_the_running_upper_bound():
    """A look whose lower bound exceeds the running upper bound (the looks contradict each other) is
    clamped to it: such a path cannot certify a radius whose threshold an earlier look ruled out."""
    from diffsmooth.engine.certify.sequential import look_decision
    rule = _rule(TABLE)
    j = rule.looks().index(1000)
    lower, upper, _ = look_decision(rule, np.array([1000.0]), np.array([1000.0]), j, np.array([0.0]), np.array([0.9]))
    assert upper[0] == 0.9 and lower[0] == 0.9            # every vote: this look alone would give ~0.99
    unclamped = rule.bounds(np.array([1000.0]), np.array([1000.0]), j)[0]
    assert unclamped[0] > 0.95

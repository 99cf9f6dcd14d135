"""Certification math against the reference's spot values (docs/compatibility.md) and its defining properties."""

import random

import pytest
from scipy.stats import beta, norm

from diffsmooth.engine.certify.cohen import (
    ABSTAIN,
    certified_radius,
    certify_from_counts,
    lower_confidence_bound,
    max_certifiable_radius,
    predict_from_counts,
    top_class,
)
from diffsmooth.engine.errors import UserError

SPOT = [(100, 100, 0.933254300797), (9990, 10000, 0.997588308033),
        (10000, 10000, 0.999309463003), (99990, 100000, 0.999758677344)]


@pytest.mark.parametrize("n_a,n,expected", SPOT)
def test_lower_bound_spot_values(n_a, n, expected):
    assert lower_confidence_bound(n_a, n, 0.001) == pytest.approx(expected, abs=1e-11)


def test_lower_bound_zero_successes_and_monotone():
    assert lower_confidence_bound(0, 100, 0.001) == 0.0
    values = [lower_confidence_bound(k, 1000, 0.001) for k in range(0, 1001, 50)]
    assert values == sorted(values)


def test_radius_and_abstain():
    assert certified_radius(10000, 10000, 0.001, 0.5) == pytest.approx(0.5 * norm.ppf(0.999309463003), rel=1e-9)
    assert certified_radius(500, 1000, 0.001, 0.5) is None          # pA_lower < 1/2
    assert max_certifiable_radius(10000, 0.001, 1.0) == pytest.approx(3.1986, abs=1e-4)
    assert max_certifiable_radius(100000, 0.001, 1.0) == pytest.approx(3.8115, abs=1e-4)
    # all votes agreeing reaches exactly the largest possible radius
    assert certified_radius(100000, 100000, 0.001, 0.25) == pytest.approx(
        max_certifiable_radius(100000, 0.001, 0.25), rel=1e-9)


def test_certify_uses_selection_class_and_estimation_counts():
    # selection says class 2; estimation has class 1 as majority: radius is about class 2
    pred, radius = certify_from_counts([0, 10, 90], [0, 9000, 1000], 0.001, 0.5)
    assert pred == ABSTAIN and radius == 0.0
    pred, radius = certify_from_counts([0, 10, 90], [0, 100, 9900], 0.001, 0.5)
    assert pred == 2
    assert radius == pytest.approx(0.5 * norm.ppf(beta.ppf(0.001, 9900, 101)), rel=1e-9)


def test_top_class_first_max_wins():
    assert top_class([3, 7, 7, 1]) == 1
    assert top_class([0, 0]) == 0


def test_predict_binomial_test():
    assert predict_from_counts([0, 60, 40], 0.001) == ABSTAIN
    assert predict_from_counts([0, 990, 10], 0.001) == 1
    assert predict_from_counts([5, 0, 0], 0.001) == ABSTAIN          # 5 votes cannot reject a tie at 0.001
    assert predict_from_counts([20, 0, 0], 0.001) == 0


def test_bound_statistical_coverage():
    """The lower bound exceeds the true p in at most ~alpha of trials (soundness)."""
    rng = random.Random(7)
    alpha, trials = 0.05, 2000
    for p, n in ((0.6, 200), (0.9, 500), (0.99, 1000)):
        misses = 0
        for _ in range(trials):
            n_a = sum(1 for _ in range(n) if rng.random() < p)
            misses += lower_confidence_bound(n_a, n, alpha) > p
        # expected <= alpha * trials = 100; allow binomial slack (~3 sd)
        assert misses <= alpha * trials + 3 * (alpha * (1 - alpha) * trials) ** 0.5


def test_bad_arguments():
    with pytest.raises(ValueError):
        lower_confidence_bound(5, 4, 0.001)
    with pytest.raises(UserError, match="alpha must be in"):
        lower_confidence_bound(1, 4, 1.5)
    with pytest.raises(UserError, match="alpha must be in"):
        predict_from_counts([3, 1], 0.0)


def test_certify_and_predict_jobs_ask_for_exactly_the_papers_samples():
    """CERTIFY selects on samples 0..n0-1 and estimates on n0..n0+n-1 (disjoint, nothing skipped);
    PREDICT counts 0..n-1; one job answers every configuration row on its own counts."""
    import numpy as np

    from diffsmooth.engine.certify.cohen import certify_job, predict_job
    from diffsmooth.engine.certify.jobs import drive
    rng = np.random.default_rng(0)
    votes = np.stack([rng.choice(3, 5000, p=[0.05, 0.9, 0.05]), rng.choice(3, 5000, p=[0.75, 0.15, 0.1])])
    asked = []

    def count(first, num):
        asked.append((first, num))
        return np.stack([np.bincount(v[first:first + num], minlength=3) for v in votes])

    results = drive(certify_job(30, 400, 0.001, 0.5), count)
    assert asked == [(0, 30), (30, 400)]
    for row, certificate in zip(votes, results):
        expected = certify_from_counts(np.bincount(row[:30], minlength=3), np.bincount(row[30:430], minlength=3),
                                       0.001, 0.5)
        assert certificate == expected and certificate.samples == 430
    assert [c.prediction for c in results] == [1, 0] and results[0].radius > results[1].radius > 0
    asked.clear()
    assert drive(predict_job(200, 0.001), count) == [1, predict_from_counts(np.bincount(votes[1][:200], minlength=3),
                                                                           0.001)]
    assert asked == [(0, 200)]

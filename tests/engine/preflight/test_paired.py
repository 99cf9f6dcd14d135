"""The preflight's statistics on simulated data: the paired tests hold their level on a correct set-up and see a
planted gain, a test too weak for its sample is inconclusive with a count that is enough, the r = 0 bound covers
the true fraction (where a plurality of a few votes does not), the samples are stratified by label."""

import numpy as np
import pytest

from diffsmooth.engine.preflight.judge import COVER, r0_upper_bound
from diffsmooth.engine.preflight.paired import (
    DIFFERS,
    INCONCLUSIVE,
    LEVEL,
    POWER,
    SAME,
    mean_test,
    sign_test,
    sign_test_power,
)
from diffsmooth.engine.preflight.run import clean_indices, sample_indices


def test_the_sign_test_holds_its_level_and_sees_a_planted_gain():
    rng = np.random.default_rng(0)
    alarms = sum(sign_test("x", rng.random(200) < 0.7, rng.random(200) < 0.7, 0.1).verdict == DIFFERS
                 for _ in range(400))
    assert alarms / 400 <= 2 * LEVEL
    seen = sum(sign_test("x", rng.random(200) < 0.6, rng.random(200) < 0.8, 0.1).verdict == DIFFERS for _ in range(100))
    assert seen >= 90


def test_a_weak_test_is_inconclusive_and_the_images_it_asks_for_give_it_its_power():
    rng = np.random.default_rng(1)
    a = rng.random(20) < 0.7
    weak = sign_test("x", a, a ^ (rng.random(20) < 0.3), 0.1)
    assert weak.verdict == INCONCLUSIVE and weak.more > 0
    psi = weak.as_dict()
    assert sign_test_power(weak.needed, 0.3, 0.1) >= POWER > sign_test_power(weak.images, 0.3, 0.1)
    assert psi["more_images"] == weak.more
    same = sign_test("x", rng.random(2000) < 0.7, rng.random(2000) < 0.5, 0.1)    # far worse: rules out a gain
    assert same.verdict == SAME and same.upper < 0


def test_the_mean_test_against_a_shifted_null():
    rng = np.random.default_rng(2)
    kept = mean_test("x", rng.normal(-0.02, 0.2, 200), 0.15, null=-0.15)       # loses 2 points: not trained at it
    lost = mean_test("x", rng.normal(-0.40, 0.2, 200), 0.15, null=-0.15)       # loses 40 points: trained at it
    assert kept.verdict == DIFFERS and lost.verdict == SAME


@pytest.mark.parametrize("samples", [3, 5, 10])
def test_the_r0_bound_covers_the_fraction_of_images_whose_label_wins_over_half(samples):
    rng = np.random.default_rng(samples)
    p = np.concatenate([rng.uniform(0.5, 0.56, 60), rng.uniform(0.2, 0.5, 40)])    # 60% above 1/2, many just above
    truth = float(np.mean(p > 0.5))
    bounds, plurality = [], []
    for _ in range(300):
        votes = rng.binomial(samples, p)
        bounds.append(r0_upper_bound(votes, samples))
        plurality.append(np.mean(votes > samples / 2))
    assert np.mean(np.array(bounds) >= truth) >= COVER
    assert np.mean(np.array(plurality) >= truth) < COVER              # a vote count is not a bound


def test_samples_are_stratified_by_label_and_the_clean_one_spans_the_whole_data():
    labels = np.repeat(np.arange(100), 20)                               # 100 labels, 20 images each
    selected = list(range(0, 2000, 20))                                  # a skip that selects one image per label
    picked = sample_indices(selected, 50, 0, labels[selected].tolist())
    assert len(set(labels[list(picked)])) == 50
    clean = clean_indices(labels, 100, 0)
    counts = np.bincount(labels[list(clean)], minlength=100)
    assert len(clean) == 500 and (counts == 5).all()                     # >= 5 per label, whatever the skip
    assert clean_indices(labels, 100, 0) == clean != clean_indices(labels, 100, 1)

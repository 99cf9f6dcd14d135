import numpy as np
import pytest
from scipy.special import betaln

from diffsmooth.engine.runs.rate_model import draw_rates, fit_unanimous_weight, unanimous_posterior


def _rows(rng, weight, images=3000):
    """Rows of images whose rate is 1 with probability `weight`, else Beta(1/2, 1/2), stopped at random counts."""
    one = rng.random(images) < weight
    p = np.where(one, 1.0, rng.beta(0.5, 0.5, images))
    drawn = rng.integers(50, 3000, images)
    return rng.binomial(drawn, p), drawn


@pytest.mark.parametrize("weight", [0.0, 0.3, 0.7])
def test_the_fitted_point_mass_recovers_the_share_of_images_with_rate_one(weight):
    votes, drawn = _rows(np.random.default_rng(int(10 * weight)), weight)
    assert abs(fit_unanimous_weight(votes, drawn) - weight) < 0.04


def test_an_image_that_missed_a_vote_is_never_certain_and_one_with_every_vote_follows_bayes():
    votes, drawn = np.array([99, 100, 400]), np.array([100, 100, 400])
    post = unanimous_posterior(votes, drawn, 0.5)
    assert post[0] == 0.0
    evidence = np.exp(betaln(100.5, 0.5) - betaln(0.5, 0.5))            # P(100 of 100 | Jeffreys)
    assert post[1] == pytest.approx(1 / (1 + evidence))
    assert post[2] > post[1]                                            # a longer unanimous path is surer
    rates = np.array([draw_rates(votes, drawn, 0.5, np.random.default_rng(s)) for s in range(300)])
    assert np.all(rates[:, 0] < 1) and 0.9 < np.mean(rates[:, 1] == 1) < 1     # posterior ~0.95
    assert abs(rates[:, 0].mean() - 99.5 / 101) < 0.005                # Beta(99.5, 1.5)'s mean


def test_without_images_with_every_vote_the_mixture_is_jeffreys_posterior():
    votes, drawn = np.array([5, 50, 90]), np.array([100, 100, 100])
    assert fit_unanimous_weight(votes, drawn) == 0.0
    assert fit_unanimous_weight([], []) == 0.0

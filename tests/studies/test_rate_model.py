import numpy as np
import pytest
from scipy.special import betaln

from studies.rate_model import draw_rates, fit_unanimous_weight, unanimous_posterior


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


# ---- the multi-parameter priors (fit_rate_prior, RatePrior, draw_prior_rates) ----

from studies.rate_model import RATE_PRIORS, RatePrior, draw_prior_rates, fit_rate_prior  # noqa: E402


def _prior_rows(rng, weight, a, b, images=2000, low=100, high=8000):
    """Rows of images whose rate is 1 with probability `weight`, else Beta(a, b), stopped at random counts."""
    one = rng.random(images) < weight
    p = np.where(one, 1.0, rng.beta(a, b, images))
    drawn = rng.integers(low, high, images)
    return rng.binomial(drawn, p), drawn


@pytest.mark.parametrize("weight, a, b", [(0.4, 3.0, 0.15), (0.2, 2.0, 0.5)])
def test_the_beta_mixture_fit_recovers_its_hyperparameters(weight, a, b):
    votes, drawn = _prior_rows(np.random.default_rng(1), weight, a, b)
    prior = fit_rate_prior(votes, drawn, "beta-mixture")
    assert abs(prior.params["w"] - weight) < 0.08
    assert abs(np.log(prior.params["a"] / a)) < 0.25 and abs(np.log(prior.params["b"] / b)) < 0.35


def test_the_beta_fit_recovers_a_tiny_b_and_the_eps_fit_a_point_mass_just_below_one():
    votes, drawn = _prior_rows(np.random.default_rng(2), 0.0, 2.0, 0.1)
    prior = fit_rate_prior(votes, drawn, "beta")
    assert abs(np.log(prior.params["a"] / 2.0)) < 0.25 and abs(np.log(prior.params["b"] / 0.1)) < 0.25
    rng = np.random.default_rng(3)
    eps = 2e-4                              # rows long enough (20,000 to 60,000) to tell 1 - eps from 1
    near = rng.random(1500) < 0.5
    p = np.where(near, 1 - eps, rng.beta(0.5, 0.5, 1500))
    drawn = rng.integers(20000, 60000, 1500)
    prior = fit_rate_prior(rng.binomial(drawn, p), drawn, "mixture-eps")
    assert abs(prior.params["w"] - 0.5) < 0.05 and abs(np.log(prior.params["eps"] / eps)) < 0.15


def test_the_beta_eps_fit_recovers_its_point_mass_and_beta():
    rng = np.random.default_rng(7)
    near = rng.random(1500) < 0.4
    p = np.where(near, 1 - 1e-4, rng.beta(2.0, 0.3, 1500))
    drawn = rng.integers(20000, 60000, 1500)
    prior = fit_rate_prior(rng.binomial(drawn, p), drawn, "beta-eps")
    assert abs(prior.params["w"] - 0.4) < 0.05 and abs(np.log(prior.params["eps"] / 1e-4)) < 0.15
    assert abs(np.log(prior.params["a"] / 2.0)) < 0.3 and abs(np.log(prior.params["b"] / 0.3)) < 0.3


def test_the_mixture_family_is_todays_mixture():
    votes, drawn = _prior_rows(np.random.default_rng(4), 0.5, 0.5, 0.5, images=500)
    prior = fit_rate_prior(votes, drawn, "mixture")
    w = fit_unanimous_weight(votes, drawn)
    assert prior.params["w"] == pytest.approx(w)
    assert np.allclose(prior.responsibilities(votes, drawn)[:, 0], unanimous_posterior(votes, drawn, w))


@pytest.mark.parametrize("name", RATE_PRIORS)
def test_draws_follow_the_posterior_and_its_closed_forms(name):
    """Each family's draws average to its posterior mean; keep_chance and log_predictive are the Beta-Binomial
    closed forms; the predictive probabilities of every count sum to 1."""
    params = {"mixture": ([0.6, 0.4], [("point", 1.0), ("beta", 0.5, 0.5)]),
              "mixture-eps": ([0.6, 0.4], [("point", 1 - 1e-3), ("beta", 0.5, 0.5)]),
              "beta-mixture": ([0.3, 0.7], [("point", 1.0), ("beta", 2.0, 0.2)]),
              "beta": ([1.0], [("beta", 2.0, 0.2)]),
              "beta-eps": ([0.3, 0.7], [("point", 1 - 1e-3), ("beta", 2.0, 0.2)])}[name]
    prior = RatePrior(name, *params, {})
    votes, drawn = np.array([400.0, 398.0, 30.0, 0.0]), np.array([400.0, 400.0, 100.0, 0.0])
    draws = draw_prior_rates(np.tile(votes, 4000), np.tile(drawn, 4000), prior, np.random.default_rng(0)).reshape(4000, 4)
    assert np.all((draws >= 0) & (draws <= 1)) and not np.any(np.isnan(draws))
    mean = prior.posterior_mean(votes, drawn)
    assert np.allclose(draws.mean(axis=0), mean, atol=4 * draws.std(axis=0) / np.sqrt(4000) + 1e-9)
    more = 50
    total = np.exp(np.logaddexp.reduce([prior.log_predictive(votes, drawn, np.full(4, j), np.full(4, more))
                                        for j in range(more + 1)], axis=0))
    assert np.allclose(total, 1.0)
    (a, b), = [c[1:] for c in prior.components if c[0] == "beta"]
    r = prior.responsibilities(votes[:1], drawn[:1])[0]
    beta_keep = np.exp(betaln(400 + a + more, b) - betaln(400 + a, b))
    point_keep = [c[1] ** more for c in prior.components if c[0] == "point"]
    expected = r[-1] * beta_keep + (r[0] * point_keep[0] if point_keep else 0.0)
    assert prior.keep_chance(votes[:1], drawn[:1], more)[0] == pytest.approx(expected)


def test_a_tiny_b_draws_rates_near_one_without_nan():
    prior = RatePrior("beta", [1.0], [("beta", 1.0, 0.01)], {})
    draws = draw_prior_rates(np.full(2000, 8000.0), np.full(2000, 8000.0), prior, np.random.default_rng(5))
    assert not np.any(np.isnan(draws)) and np.all(draws <= 1) and np.median(draws) > 1 - 1e-6
    assert np.mean(draws == 1.0) < 1          # not all exactly 1: the Beta's own law, drawn on the log scale


@pytest.mark.parametrize("name", ["mixture-eps", "beta-mixture"])
def test_without_images_with_every_vote_the_point_mass_weighs_nothing(name):
    votes, drawn = np.array([5, 50, 90, 190]), np.array([100, 100, 100, 200])
    prior = fit_rate_prior(votes, drawn, name)
    assert prior.params["w"] == 0.0
    draws = draw_prior_rates(votes, drawn, prior, np.random.default_rng(6))
    assert np.all(draws < 1)
    assert fit_rate_prior([], [], name).params["w"] == 0.0


def test_an_unknown_prior_is_refused():
    with pytest.raises(ValueError, match="unknown rate prior"):
        fit_rate_prior([1], [2], "gauss")

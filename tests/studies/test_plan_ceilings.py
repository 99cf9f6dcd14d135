"""studies/plan_ceilings.py: Wald's bound per certificate, the winners, and the ceilings' order on the same paths."""

import numpy as np
from scipy.stats import norm

from studies.plan_ceilings import PLANS, cell_winners, information_samples, markdown, study
from studies.race_study import estimate
from tests.studies.test_race_study import _folder


def test_the_information_bound_with_every_vote_is_the_fewest_samples_that_can_certify():
    """ln(alpha) / ln Phi(r / sigma): the issue's 301 / 1,109 / 5,114 / 29,691 at r / sigma = 2 to 3.5."""
    fewest = information_samples(1.0, norm.cdf([2.0, 2.5, 3.0, 3.5]), 0.001, 10**6)
    assert np.floor(fewest).astype(int).tolist() == [300, 1108, 5113, 29690]
    assert 0.001 ** (1 / 5114) >= norm.cdf(3.0) > 0.001 ** (1 / 5113)     # CP's bound with n of n votes: alpha ** (1 / n)


def test_the_information_bound_grows_near_the_threshold_is_capped_and_skips_rates_below_it():
    q = norm.cdf(2.0)
    need = information_samples([1.0, 0.999, 0.99, 0.98, 0.9775, q, 0.5], q, 0.001, 100_000)
    assert need[0] < need[1] < need[2] < need[3] < need[4] == 100_000        # capped at n-max
    assert need[5] == 0 and need[6] == 0


def test_ties_go_to_the_largest_sigma():
    counts = {0.25: [90, 70, 40], 0.5: [88, 70, 50], 1.0: [80, 60, 50]}
    assert cell_winners(counts, [0.0, 0.5, 1.0]) == {0.0: 0.25, 0.5: 0.5, 1.0: 1.0}


def test_the_race_costs_more_than_knowing_the_winners_which_costs_more_than_the_bound(tmp_path):
    doc = study(_folder(tmp_path), n_max=20_000, seeds=2, tolerance=0.0)
    p = {plan: v["samples"] for plan, v in doc["plans"].items()}
    assert p["fixed"] == 60 * 2 * (100 + 20_000)
    assert p["information bound"] < p["winner known"] <= p["race"] < p["fixed"]
    assert p["winner known"] < p["all"]
    assert all(set(w.values()) <= {0.25, 0.5} for w in doc["winners_each_seed"])
    assert len({s for w in doc["winners_each_seed"] for s in w.values()}) == 2     # both sigmas win a cell
    doc["estimate"] = estimate(doc, 9.0, 500, 60.0, 1.12, 1, plans=PLANS)
    assert doc["estimate"]["information bound"]["seconds"] < doc["estimate"]["winner known"]["seconds"]
    text = markdown(doc)
    assert "| winner known |" in text and "ESTIMATED: 500 images" in text


def test_the_winner_known_plan_with_the_races_tolerance_draws_no_more_and_equals_it_at_zero(tmp_path):
    folder = _folder(tmp_path)
    exact, loose = (study(folder, n_max=20_000, seeds=2, tolerance=t) for t in (0.0, 10.0))     # 10 points: 6 images
    assert exact["plans"]["winner known, tolerance"]["samples"] == exact["plans"]["winner known"]["samples"]
    assert loose["plans"]["winner known, tolerance"]["samples"] < 0.97 * loose["plans"]["winner known"]["samples"]

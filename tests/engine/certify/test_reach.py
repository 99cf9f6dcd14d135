"""reach-cp, the default bound: split CP plus a unanimity bound and a look where an image with every
vote can first certify each schedule radius; the pace-floor futility stop; the prefix property."""

import math

import numpy as np
import pytest
from scipy.stats import norm

from diffsmooth.engine.certify.cohen import lower_confidence_bounds
from diffsmooth.engine.certify.sequential import (
    SequentialCertificate,
    SequentialRule,
    pace_futile,
    reach_levels,
    run_rule,
    unanimity_lower,
)
from studies.sequential_coverage import exact_miscoverage, scanned_rates, split_cp_lower

ALPHA = 0.001


def _fewest_samples(z: float, alpha: float = ALPHA) -> int:
    """The fewest samples at which Clopper-Pearson at alpha certifies r / sigma = z at all (every vote)."""
    return math.ceil(math.log(alpha) / math.log(norm.cdf(z)))


@pytest.mark.parametrize("n_max", [10_000, 100_000])
@pytest.mark.parametrize("z", [2.0, 2.5, 3.0])
def test_an_image_with_every_vote_certifies_within_1_3x_of_the_minimum(z, n_max):
    """The issue's target: r / sigma = 2.5 and 3 within 1.3x of ln alpha / ln Phi(z); split CP took 1.5-2x."""
    new, old = (SequentialRule((0.5 * z,), 0.5, ALPHA, n_max, bound=b) for b in ("reach-cp", "split-cp"))
    used = {}
    for rule in (new, old):
        lower, samples = run_rule(rule, np.array([rule.chunks()]))
        assert lower[0] >= norm.cdf(z)                       # certified
        used[rule.bound] = int(samples[0])
    assert used["reach-cp"] <= 1.3 * _fewest_samples(z) < 1.5 * _fewest_samples(z) <= used["split-cp"]


def test_levels_and_the_unanimity_share_sum_to_alpha():
    rule = SequentialRule((0.25, 0.5, 0.75, 1.0), 0.5, ALPHA, 10_000)
    levels, regular = rule.levels(), np.array(rule._schedule[1])
    assert levels.sum() + ALPHA * rule.unanimity == pytest.approx(ALPHA)
    assert levels[-1] == pytest.approx(ALPHA / 2) and np.all(levels[~regular] == 0) and (~regular).sum() == 4
    assert len(set(levels[regular][:-1])) == 1               # the other regular looks share evenly
    assert set(rule.looks()) >= set(SequentialRule((0.5,), 0.5, ALPHA, 10_000, bound="split-cp").looks())
    with pytest.raises(ValueError):
        reach_levels([True, False], ALPHA)                   # the last look must be regular


def test_the_unanimity_bound_exceeds_p_only_on_one_nested_event():
    """Where the first t(p) votes all agree (t(p) the first look with level^(1/t) > p) and nowhere else;
    so its miscoverage is p^t(p) <= level, computed here without the dynamic program."""
    level, looks = 2e-4, np.array([50, 100, 200, 400, 800])
    for p in (0.9, 0.97, 0.99, 0.995):
        bounds = unanimity_lower(looks, looks, level)
        first = looks[np.argmax(bounds > p)] if np.any(bounds > p) else None
        assert first is None or p ** first <= level
        assert np.all(unanimity_lower(looks - 1, looks, level) == 0)      # one miss: no bound


def test_the_default_rules_exact_miscoverage_stays_below_alpha():
    """The dynamic program (no stopping: a bound for every stopping rule) over a fine grid, p near 1 and
    each look's unanimity band. A planted bug (the unanimity bound on top of split CP's full levels)
    must fail the same check."""
    for radii, sigma in (((0.25, 0.5, 0.75, 1.0), 0.5), ((0.5, 0.75), 0.25)):
        rule = SequentialRule(radii, sigma, ALPHA, 3000)
        ps = scanned_rates(rule, 30)
        assert max(exact_miscoverage(split_cp_lower(rule), rule.chunks(), p) for p in ps) <= ALPHA
    rule = SequentialRule((0.25, 0.5, 0.75, 1.0), 0.5, ALPHA, 3000)
    split = SequentialRule((0.25, 0.5, 0.75, 1.0), 0.5, ALPHA, 3000, bound="split-cp")

    def planted(s, t, look):
        return np.maximum(split.bounds(s, t, look)[0], unanimity_lower(s, t, ALPHA))
    worst = max(exact_miscoverage(planted, split.chunks(), p) for p in scanned_rates(rule, 10))
    assert worst > ALPHA


def test_reach_cp_refuses_an_off_schedule_look():
    rule = SequentialRule((0.25,), 0.5, ALPHA, 10_000, futility_rule=None)
    state = SequentialCertificate(rule)
    first = rule.looks()[0]
    assert first != 100
    with pytest.raises(RuntimeError, match=f"next look is at {first}"):
        state.add(100, 100)
    assert not state.add(first - 3, first)


def _paths(rule, ps, rng):
    return rng.binomial(np.asarray(rule.chunks())[None, :], np.asarray(ps)[:, None])


def _certifies(rule, votes, r):
    lower, _ = run_rule(rule, votes)
    return (lower > 0.5) & (lower >= norm.cdf(r / rule.sigma))


@pytest.mark.parametrize("bound", ["reach-cp", "split-cp"])
def test_prefix_property(bound):
    """The rule with radii R certifies r on a path iff the rule with the radii of R up to r (same
    schedule radii) does: its looks and levels and every stop decision depend only on the schedule
    radii and the smallest uncertified radius. Random radius lists, vote rates near every threshold."""
    rng = np.random.default_rng(3)
    grid = np.array([0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75])
    for trial in range(12):
        sigma = (0.25, 0.5)[trial % 2]
        radii = tuple(sorted(rng.choice(grid, size=rng.integers(2, 6), replace=False)))
        n_max = (2000, 10_000)[trial % 3 == 0]
        full = SequentialRule(radii, sigma, ALPHA, n_max, bound=bound)
        near = norm.cdf(np.array(radii) / sigma)
        ps = np.clip(np.concatenate([(near + rng.normal(0, 0.01, (40, len(radii)))).ravel(), [1.0] * 20,
                                     1 - rng.exponential(3 / n_max, 40)]), 0.3, 1.0)
        votes = _paths(full, ps, rng)
        for r in radii:
            prefix = SequentialRule(tuple(x for x in radii if x <= r), sigma, ALPHA, n_max, bound=bound,
                                    schedule_radii=radii)
            assert prefix.chunks() == full.chunks()
            np.testing.assert_array_equal(_certifies(full, votes, r), _certifies(prefix, votes, r), err_msg=str((radii, r)))


def test_a_stopped_run_continues_from_its_five_numbers():
    """(successes, samples, look index, running lower, running upper) is the whole state: a new
    certificate given them continues exactly as the uninterrupted one."""
    rule = SequentialRule((0.25, 0.5, 0.75, 1.0), 0.5, ALPHA, 10_000, futility_rule=None)
    votes = np.random.default_rng(5).binomial(rule.chunks(), 0.84)
    whole, part = SequentialCertificate(rule), SequentialCertificate(rule)
    for v, size in zip(votes[:6], rule.chunks()[:6]):
        whole.add(int(v), size)
        part.add(int(v), size)
    resumed = SequentialCertificate(rule)
    resumed.successes, resumed.samples, resumed.look, resumed.lower, resumed.upper = (
        part.successes, part.samples, part.look, part.lower, part.upper)
    for v, size in zip(votes[6:], rule.chunks()[6:]):
        done = whole.add(int(v), size), resumed.add(int(v), size)
        assert done[0] == done[1] and (whole.lower, whole.upper) == (resumed.lower, resumed.upper)
        if done[0]:
            break
    assert whole.samples == resumed.samples


def test_the_pace_floor_forgives_one_early_miss_near_the_reach():
    """Needing all but 2 of n_max votes (sd ~ 1.4), one miss early stops the pace rule but not the
    pace floor; 3 misses (more than n_max - need) stop both; far from the reach (sd ~ 30) they agree."""
    n_max, need = 10_000, 9998
    assert pace_futile(999, 1000, need, n_max, 0.21) and not pace_futile(999, 1000, need, n_max, 0.21, floor=2)
    assert pace_futile(997, 1000, need, n_max, 0.21, floor=2)
    s = np.arange(700, 1001)
    np.testing.assert_array_equal(pace_futile(s, 1000, 9000, n_max, 0.21), pace_futile(s, 1000, 9000, n_max, 0.21, floor=2))


def test_no_fewer_certificates_at_the_reach_than_the_previous_rule():
    """Images that fixed-n certifies at r = 1.5, sigma 0.5 with a few misses to spare (n_max 10,000): on
    the same paths the default rule certifies at least as many as split CP with the plain pace stop
    (which gives up at the first early miss) and fixed-n certifies at least as many as either."""
    n_max = 10_000
    ps = np.repeat([0.9995, 0.9997, 0.9999], 300)
    new = SequentialRule((1.0, 1.5), 0.5, ALPHA, n_max)
    old = SequentialRule((1.0, 1.5), 0.5, ALPHA, n_max, bound="split-cp", futility_rule="pace")
    rng = np.random.default_rng(11)
    per_sample = rng.random((len(ps), n_max)) < ps[:, None]
    def chunked(rule):
        ends = np.cumsum(rule.chunks())
        return np.diff(np.concatenate([np.zeros((len(ps), 1), int), per_sample.cumsum(axis=1)[:, ends - 1]], axis=1), axis=1)
    fixed = lower_confidence_bounds(per_sample.sum(axis=1), n_max, ALPHA) >= norm.cdf(3.0)
    got_new, got_old = _certifies(new, chunked(new), 1.5), _certifies(old, chunked(old), 1.5)
    assert fixed.sum() >= got_new.sum() > got_old.sum()

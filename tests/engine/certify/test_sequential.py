"""Anytime-valid sequential CERTIFY: the bound's time-uniform coverage (simulated), its tightness,
the stopping rule, and `certify --sequential` end to end (resume, settings guard, shards, sweep)."""

import json

import numpy as np
import pytest
import torch
from cli_helpers import invoke_ok, rows_without_time
from click.testing import CliRunner
from scipy.stats import beta, norm

from diffsmooth.cli import main
from diffsmooth.engine.certify.cohen import lower_confidence_bound, lower_confidence_bounds, upper_confidence_bounds
from diffsmooth.engine.certify.sequential import (
    SequentialCertificate,
    SequentialRule,
    certify_sequential,
    confidence_bounds,
    default_pace_margin,
    futility_bounds,
    look_decision,
    look_schedule,
    needed_votes,
    pace_futile,
    reach_levels,
    run_rule,
    split_levels,
)
from diffsmooth.engine.runs.request import parse_futility
from diffsmooth.engine.runs.results import read_rows

PATHS = 2000
ALPHA = 0.1


def _paths(p, sizes, rng):
    """Cumulative successes at each look of PATHS Bernoulli(p) paths (binomial per chunk: exact)."""
    return rng.binomial(np.asarray(sizes), p, size=(PATHS, len(sizes))).cumsum(axis=1), np.cumsum(sizes)


@pytest.mark.parametrize("p", [0.5, 0.52, 0.8, 0.97, 0.999])
def test_lower_bound_is_time_uniform_at_the_engine_looks(p):
    """Over 2,000 paths checked at every look up to n_max, the fraction whose running lower bound
    ever exceeds the true p stays <= alpha; per-look Clopper-Pearson (not time-uniform) does not."""
    rng = np.random.default_rng(int(p * 1000))
    sizes = look_schedule(10000)
    s, t = _paths(p, sizes, rng)
    lower, upper = confidence_bounds(s, t, ALPHA)
    assert (np.maximum.accumulate(lower, axis=1) > p).any(axis=1).mean() <= ALPHA
    assert (np.minimum.accumulate(upper, axis=1) < p).any(axis=1).mean() <= ALPHA
    assert np.all(lower <= s / t) and np.all(upper >= s / t)


def test_simulation_has_power_against_repeated_fixed_n_bounds():
    """The same check catches the naive rule: Clopper-Pearson at alpha at every look (here every
    20 samples up to 2,000) exceeds p on far more than alpha of the paths. The mixture does not."""
    rng = np.random.default_rng(7)
    p, sizes = 0.5, [20] * 100
    s, t = _paths(p, sizes, rng)
    naive = np.where(s > 0, beta.ppf(ALPHA, np.maximum(s, 1), t - s + 1), 0.0)
    assert (naive > p).any(axis=1).mean() > 2 * ALPHA
    lower, _ = confidence_bounds(s, t, ALPHA)
    assert (lower > p).any(axis=1).mean() <= ALPHA


@pytest.mark.parametrize("n", [10000, 100000])
def test_tighter_than_union_bound_and_close_to_fixed_n(n):
    """At the last look the CS is tighter than a union bound over every sample index (the naive
    anytime bound: Clopper-Pearson at alpha / n_max) and within 12% of fixed-n CERTIFY's radius."""
    alpha, sigma = 0.001, 0.5
    for p_hat in (0.7, 0.9, 0.99, 0.999, 1.0):
        s = int(round(p_hat * n))
        ours = float(confidence_bounds(s, n, alpha)[0])
        union = lower_confidence_bound(s, n, alpha / n)
        fixed = lower_confidence_bound(s, n, alpha)
        assert union < ours < fixed, p_hat
        assert sigma * norm.ppf(ours) >= 0.88 * sigma * norm.ppf(fixed), p_hat


def test_bounds_edge_cases():
    lower, upper = confidence_bounds([0, 5, 3], [5, 5, 6], 0.05)
    assert lower[0] == 0.0 and upper[1] == 1.0
    assert 0 < lower[2] < 0.5 < upper[2] < 1
    with pytest.raises(ValueError):
        confidence_bounds(6, 5, 0.05)


def test_look_schedule():
    assert np.cumsum(look_schedule(10000))[:16].tolist() == [100, 200, 300, 400, 500, 600, 700, 800, 900, 1000,
                                                             1200, 1400, 1700, 2000, 2400, 2900]
    assert look_schedule(10000, growth=2.0, fine_until=0)[:6] == [100, 100, 200, 400, 800, 1000]   # the first release's
    assert sum(look_schedule(10000)) == 10000 and sum(look_schedule(123457)) == 123457
    assert look_schedule(50) == [50]
    assert max(look_schedule(100000)) == 2500
    assert len(look_schedule(10000)) == 24 and len(look_schedule(100000)) == 60


def test_vectorised_clopper_pearson_is_the_scalar_one():
    n_a, n = np.array([0, 1, 37, 500, 999, 1000]), np.array([1000, 1000, 1000, 1000, 1000, 1000])
    vec = lower_confidence_bounds(n_a, n, 0.001)
    assert vec.tolist() == [lower_confidence_bound(int(a), 1000, 0.001) for a in n_a]
    assert vec[0] == 0.0 and vec[-1] == pytest.approx(0.001 ** (1 / 1000))
    upper = upper_confidence_bounds(n_a, n, 0.001)
    assert upper[-1] == 1.0 and np.all(upper[:-1] > n_a[:-1] / 1000) and np.all(vec[1:] < n_a[1:] / 1000)
    with pytest.raises(ValueError):
        lower_confidence_bounds(5, 4, 0.1)


def test_split_levels_sum_to_alpha():
    levels = split_levels(24, 0.001)
    assert levels[:-1] == pytest.approx(np.full(23, 0.001 / 46)) and levels[-1] == pytest.approx(0.0005)
    assert levels.sum() == pytest.approx(0.001) and split_levels(1, 0.01).tolist() == [0.01]
    rule = SequentialRule((0.5,), 0.5, 0.001, 10000, bound="split-cp")
    assert rule.looks()[-1] == 10000 and rule.levels().sum() == pytest.approx(0.001)
    lower, upper = rule.bounds(9000.0, 10000.0, 23)               # the last look: CP at alpha / 2 each side
    assert float(lower) == pytest.approx(lower_confidence_bound(9000, 10000, 0.0005))
    assert float(upper) == pytest.approx(1 - lower_confidence_bound(1000, 10000, 0.0005))


def test_split_cp_refuses_an_off_schedule_look():
    """A padded or packed batch must never move a look: split CP spent its levels on the schedule's counts."""
    rule = SequentialRule((0.25, 0.5), 0.5, 0.001, 10000, futility_rule=None, bound="split-cp")
    state = SequentialCertificate(rule)
    assert not state.add(80, 100)                                    # the first look, at 100
    with pytest.raises(RuntimeError, match="next look is at 200"):
        state.add(100, 128)                                          # a padded batch: 228 is no look
    assert state.samples == 100 and state.successes == 80            # the refused update left no trace
    assert not state.add(80, 100)                                    # the real next look still works
    with pytest.raises(RuntimeError, match="next look is at 300"):
        state.add(70, 90)                                            # a short (packed) batch neither
    mixture = SequentialCertificate(SequentialRule((0.25, 0.5), 0.5, 0.001, 10000, futility_rule=None, bound="mixture"))
    assert not mixture.add(100, 128)                                 # the mixture is valid at any count


def _stream(p, seed=0, classes=3):
    """A count(first, num) over a fixed vote sequence: class 0 with prob. p, else spread."""
    rng = np.random.default_rng(seed)
    votes = np.where(rng.random(200000) < p, 0, rng.integers(1, classes, 200000))
    calls = []

    def count(first, num):
        calls.append((first, num))
        return np.bincount(votes[first:first + num], minlength=classes)
    return count, calls, votes


def certify_one(count, n0, rule):
    """(prediction, radius, samples) of one configuration's sequential CERTIFY on count(first, num) -> [K]."""
    c, = certify_sequential(lambda first, num: count(first, num)[None], n0, rule)
    return c.prediction, c.radius, c.samples


def test_stopping_rule_settles_each_case():
    rule = SequentialRule((0.25, 0.5, 0.75, 1.0), sigma=0.5, alpha=0.001, n_max=10000)
    # ~all votes agree: every radius certified after a few hundred samples
    count, calls, _ = _stream(0.9995)
    pred, radius, used = certify_one(count, 100, rule)
    assert pred == 0 and radius >= 1.0 and used <= 100 + 1600
    assert calls[0] == (0, 100) and calls[1] == (100, rule.chunks()[0])   # selection, then the looks
    # far below Phi(0.5) = 0.69: the first radius is out of reach at once
    count, calls, _ = _stream(0.45)
    pred, radius, used = certify_one(count, 100, rule)
    assert pred == -1 and radius == 0.0 and used <= 100 + 400
    # between thresholds: radius 0.25 certified, 0.5 (Phi(1) = 0.84) out of reach
    count, _, _ = _stream(0.76)
    pred, radius, used = certify_one(count, 100, rule)
    assert pred == 0 and 0.25 <= radius < 0.5 and used < 100 + 10000
    # exactly at a threshold: undecidable; without the futility stop it runs to n_max and reports
    # sigma * Phi^-1(max L); with it (the default) it stops early in the same bracket
    count, _, votes = _stream(norm.cdf(1.0))
    no_futility = SequentialRule((0.25, 0.5, 0.75, 1.0), sigma=0.5, alpha=0.001, n_max=10000, futility_rule=None,
                                 bound="split-cp")
    pred, radius, used = certify_one(count, 100, no_futility)
    assert used == 100 + 10000
    ends = np.cumsum(no_futility.chunks())                          # L is the running max over the looks
    s = np.array([int((votes[100:100 + e] == 0).sum()) for e in ends])
    running = lower_confidence_bounds(s, ends, no_futility.levels()).max()
    assert radius == pytest.approx(0.5 * norm.ppf(running))
    assert radius >= 0.5 * norm.ppf(lower_confidence_bound(int(s[-1]), 10000, 0.0005))
    pred2, radius2, used2 = certify_one(_stream(norm.cdf(1.0))[0], 100, rule)
    assert pred2 == 0 and used2 < 100 + 10000 / 2 and 0.25 <= radius2 < 0.5 and radius2 <= radius


def test_futility_projection():
    """All votes agreeing projects to the bound of n_max agreeing votes; a wider margin is more
    optimistic; at margin 0 it is the CS at n_max for the current rate."""
    n_max, alpha = 10000, 0.001
    assert futility_bounds(300, 300, n_max, alpha, 2.0) == pytest.approx(confidence_bounds(n_max, n_max, alpha)[0])
    k0, k1, k3 = (float(futility_bounds(850, 1000, n_max, alpha, k)) for k in (0.0, 1.0, 3.0))
    assert k0 == pytest.approx(float(confidence_bounds(8500, n_max, alpha)[0])) and k0 < k1 < k3 < 0.9
    with pytest.raises(Exception, match="futility"):
        SequentialRule((0.5,), 0.5, 0.01, 100, futility=-1.0)
    # split CP projects to its own last-look bound (CP at alpha / 2)
    rule = SequentialRule((0.5,), 0.5, alpha, n_max, futility=0.0, futility_rule="projection")
    assert float(rule.projected_lower(850.0, 1000.0)) == pytest.approx(lower_confidence_bound(8500, n_max, alpha / 2))


@pytest.mark.parametrize("bound", ["reach-cp", "split-cp", "mixture"])
def test_needed_votes_are_the_fewest_that_certify_at_n_max(bound):
    """rule.needed[j] is the smallest vote count whose bound at n_max certifies radius j (its own
    last-look level for split CP): one vote fewer does not. Unreachable radii get n_max + 1."""
    n_max = 2000
    rule = SequentialRule((0.0, 0.25, 0.5, 1.0, 1.5), 0.5, 0.001, n_max, bound=bound)
    for j, threshold in enumerate(rule.thresholds[:-1]):
        c = int(rule.needed[j])
        at, below = float(rule.final_bound(c)), float(rule.final_bound(c - 1))
        assert at > 0.5 and at >= threshold and not (below > 0.5 and below >= threshold), (j, c)
    if bound == "split-cp":
        assert rule.needed[1] == needed_votes(lambda v: lower_confidence_bounds(v, n_max, 0.0005), n_max, [norm.cdf(0.5)])[0]
    # r = 1.5 at sigma 0.5 needs pA >= 0.99865: 2,000 agreeing votes cannot show it
    assert rule.needed[-1] == n_max + 1 and float(rule.final_bound(n_max)) < rule.thresholds[-1]


def test_pace_futility_is_a_line_behind_the_pace():
    """Futile once the votes trail t * need / n_max by more than m (1 + 4 t / n_max) final standard
    deviations: on pace never; the margin widens with m and with t; need beyond n_max always."""
    n_max, need, m = 100000, 93579, 0.13
    sd = np.sqrt(n_max * (need / n_max) * (1 - need / n_max))
    for t in (100.0, 1000.0, 20000.0, 99000.0):
        pace = t * need / n_max
        line = pace - m * (1 + 4 * t / n_max) * sd
        assert not pace_futile(np.ceil(pace), t, need, n_max, m)
        assert not pace_futile(np.ceil(line), t, need, n_max, m) and pace_futile(np.ceil(line) - 1, t, need, n_max, m)
    assert not pace_futile(84.0, 100.0, need, n_max, m)                 # 4 standard errors behind at t = 100: waits
    assert pace_futile(18600.0, 20000.0, need, n_max, m)                # 116 behind at t = 20,000: gives up
    assert not pace_futile(18600.0, 20000.0, need, n_max, 2.0)          # ... unless m is wide
    assert pace_futile(1000.0, 1000.0, n_max + 1, n_max, m)             # unreachable: always futile
    assert pace_futile(999.0, 1000.0, n_max, n_max, m)                  # every vote needed: one miss ends it,
    assert not pace_futile(1000.0, 1000.0, n_max, n_max, m)             # ... no miss never does
    assert default_pace_margin(10000) == 0.21 and default_pace_margin(100000) == 0.13
    assert SequentialRule((0.5,), 0.5, 0.001, 100000).futility == 0.13


def test_pace_rule_loses_less_and_stops_hopeless_images_sooner_than_the_projection():
    """Why the pace stop is the default (n_max 100,000, the same 1,000 paths for both rules): on an
    image that fixed-n certifies every time it gives up less often, and on a hopeless one (3 final
    standard deviations short) it stops sooner on average. docs/sequential-rules.md has the tables."""
    n_max = 100000
    pace = SequentialRule((0.5,), 0.5, 0.001, n_max)
    projection = SequentialRule((0.5,), 0.5, 0.001, n_max, futility_rule="projection")
    v = pace.needed[0] / n_max
    out = {}
    for d in (5.0, -3.0):
        p = v + d * np.sqrt(v * (1 - v) / n_max)
        votes = np.random.default_rng(0).binomial(np.asarray(pace.chunks())[None, :], np.full((1000, 1), p))
        fixed = lower_confidence_bounds(votes.sum(axis=1), n_max, 0.001) >= pace.thresholds[0]
        for name, rule in (("pace", pace), ("projection", projection)):
            lower, used = run_rule(rule, votes)
            out[name, d] = (float(np.mean(fixed & (lower < rule.thresholds[0]))), float(used.mean()))
        if d > 0:
            assert fixed.all()
    assert out["pace", 5.0][0] < out["projection", 5.0][0] - 0.02
    assert out["pace", -3.0][1] < 0.9 * out["projection", -3.0][1]


def test_futility_option_parsing():
    from diffsmooth.engine.errors import UserError
    assert parse_futility(None) == ("pace-floor", None) and parse_futility("off") == (None, None)
    assert parse_futility("0.2") == ("pace-floor", 0.2) and parse_futility("pace:0.3") == ("pace", 0.3)
    assert parse_futility("pace") == ("pace", None) and parse_futility("pace-floor:0.1") == ("pace-floor", 0.1)
    assert parse_futility("projection:1.25") == ("projection", 1.25) and parse_futility("projection") == ("projection", None)
    assert SequentialRule((0.5,), 0.5, 0.001, 1000, futility_rule="projection").futility == 1.25
    assert SequentialRule((0.5,), 0.5, 0.001, 1000, futility=0.3, futility_rule=None).futility is None
    for bad in ("x", "-1", "bogus:1", "pace:", "pace:-2", "nan", "pace:inf"):
        with pytest.raises(UserError, match="futility"):
            parse_futility(bad)
    assert SequentialRule((0.5,), 0.5, 0.001, 1000).describe_futility() == f"pace-floor:{default_pace_margin(1000):g}"
    assert SequentialRule((0.5,), 0.5, 0.001, 1000, futility_rule="pace").futility == default_pace_margin(1000)


@pytest.mark.parametrize("bound", ["split-cp", "mixture"])
def test_simulation_rule_equals_engine_rule(bound):
    """The vectorised rule (run_rule, which studies/sequential_sim.py calls) makes the engine's
    decisions, path by path, for both bounds and both futility rules."""
    from studies.sequential_sim import simulate_sequential
    radii, sigma, alpha, n_max = (0.25, 0.5, 0.75, 1.0), 0.5, 0.001, 10000
    p = np.array([0.3, 0.55, 0.69, 0.75, 0.84, 0.85, 0.9, 0.93, 0.975, 0.98, 0.995, 1.0] * 2)
    for futility, futility_rule in ((None, "pace"), (1.25, "projection"), (None, None)):
        rule = SequentialRule(radii, sigma, alpha, n_max, futility=futility, bound=bound, futility_rule=futility_rule)
        chunks = rule.chunks()
        votes = np.random.default_rng(3).binomial(np.asarray(chunks)[None, :], p[:, None])
        sim_radius, sim_used = simulate_sequential(p, rule, None, votes=votes)
        stops = set()
        for i in range(len(p)):
            state = SequentialCertificate(rule)
            for j, size in enumerate(chunks):
                if state.add(int(votes[i, j]), size):
                    break
            _, radius = state.result(0, 0)
            assert state.samples == sim_used[i] and radius == pytest.approx(sim_radius[i]), (futility, p[i])
            stops.add(state.samples)
        assert len(stops) >= 5


@pytest.mark.parametrize("p", [0.5, norm.cdf(0.5), norm.cdf(1.0), norm.cdf(1.5), norm.cdf(2.0), 0.99])
def test_new_rule_reported_radius_is_valid(p):
    """The default rule (finer looks + futility stop) end to end: over 2,000 simulated paths the
    REPORTED radius at the stopping time exceeds the true radius sigma * Phi^-1(p) in <= alpha
    of them (p at and between the thresholds, where stopping decisions are closest)."""
    from studies.sequential_sim import simulate_sequential
    radii, sigma, n_max = (0.25, 0.5, 0.75, 1.0), 0.5, 10000
    rule = SequentialRule(radii, sigma, ALPHA, n_max)
    assert rule.futility is not None
    rng = np.random.default_rng(int(p * 1e4))
    radius, used = simulate_sequential(np.full(PATHS, p), rule, rng)
    true_radius = sigma * norm.ppf(p) if p > 0.5 else 0.0
    assert (radius > true_radius + 1e-12).mean() <= ALPHA
    assert used.min() < n_max                                       # the rule did stop early


def test_many_configurations_stop_on_their_own():
    """One job, several count rows (a sweep): each row stops at its own look, as its single run does."""
    rule = SequentialRule((0.25, 0.5), sigma=0.5, alpha=0.01, n_max=5000)
    streams = [_stream(p, seed=k)[0] for k, p in enumerate((0.999, 0.75, 0.87))]
    many = certify_sequential(lambda first, num: np.stack([c(first, num) for c in streams]), 50, rule)
    singles = [certify_one(_stream(p, seed=k)[0], 50, rule) for k, p in enumerate((0.999, 0.75, 0.87))]
    assert [(c.prediction, c.radius, c.samples) for c in many] == singles
    assert len({c.samples for c in many}) == 3                       # three different stopping points


def test_rule_validation():
    from diffsmooth.engine.errors import UserError
    with pytest.raises(UserError, match="radii"):
        SequentialRule((), 0.5, 0.01, 100)
    with pytest.raises(UserError, match="n-max"):
        SequentialRule((0.5,), 0.5, 0.01, 0)


# ---------------------------------------------------------------- CLI end to end on tiny models

@pytest.fixture(scope="module")
def spread_models(tmp_path_factory):
    """A tiny classifier whose votes under noise spread over several classes (random ResNet with
    BatchNorm statistics calibrated on noisy inputs), and 6 8x8 images labelled with its top votes."""
    from diffsmooth.engine.models.checkpoints import save_cohen_checkpoint
    from diffsmooth.engine.models.resnet import NormalizedClassifier, build_classifier_net, normalization_layer
    root = tmp_path_factory.mktemp("spread")
    for seed, name in ((3, "clf.pt"), (4, "clf_b.pt")):
        torch.manual_seed(seed)
        net = NormalizedClassifier(normalization_layer("normalize", "cifar10"),
                                   build_classifier_net("cifar_resnet20", 10, 3))
        for m in net.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.momentum = None
        net.train()
        with torch.no_grad():
            for _ in range(5):
                net(torch.rand(64, 3, 8, 8) + 0.25 * torch.randn(64, 3, 8, 8))
        save_cohen_checkpoint(root / name, net.eval(), "cifar_resnet20")
    images = np.random.default_rng(0).integers(0, 256, size=(6, 8, 8, 3), dtype=np.uint8)
    np.savez(root / "data.npz", images=images, labels=np.array([6, 6, 4, 6, 3, 6]))
    return root


def _args(root, *extra, classifiers=("clf.pt",)):
    return ["certify", *[a for c in classifiers for a in ("--classifier", root / c)], "--arch", "cifar_resnet20",
            "--dataset", "npz",
            "--data", root / "data.npz", "--method", "rs", "--sigma", "0.12", "--n0", "20", "--alpha", "0.01",
            "--quiet", *extra]


SEQ = ["--sequential", "--radii", "0.05,0.1", "--n-max", "1500"]


@pytest.mark.slow
def test_cli_sequential_rows_resume_and_guard(tmp_path, spread_models):
    whole, part = tmp_path / "whole.tsv", tmp_path / "part.tsv"
    invoke_ok([*_args(spread_models, *SEQ, "--batch", "300"), "--out", whole])
    rows = read_rows(whole)
    assert list(rows[0]) == ["idx", "label", "predict", "radius", "correct", "time", "samples", "top_votes", "selected"]
    assert all(r["selected"] == r["predict"] for r in rows if r["predict"] != "-1")
    used = [int(r["samples"]) for r in rows]
    assert all(20 < u <= 20 + 1500 for u in used)                # reach-cp may look before 100 samples
    # top_votes: cA's estimation votes at the stopping look; with `samples` they rebuild the bound
    for r in rows:
        assert 0 <= int(r["top_votes"]) <= int(r["samples"]) - 20
        if int(r["predict"]) != -1:
            assert int(r["top_votes"]) > (int(r["samples"]) - 20) / 2
    assert len(set(used)) >= 2 and min(used) < 20 + 1500            # early stops, at different looks
    assert len({r["predict"] for r in rows}) >= 2                    # votes spread over classes
    # a sequential row is never certified beyond what fixed-n CERTIFY on a superset of its samples allows
    fixed = tmp_path / "fixed.tsv"
    invoke_ok([*_args(spread_models, "--n", "1500", "--batch", "300"), "--out", fixed])
    fixed_rows = {r["idx"]: r for r in read_rows(fixed)}              # rows come in completion order
    for seq_row in rows:
        fixed_row = fixed_rows[seq_row["idx"]]
        if int(seq_row["predict"]) != -1:
            assert seq_row["predict"] == fixed_row["predict"]
    # batch size does not change a row; resume continues; other radii are refused
    invoke_ok([*_args(spread_models, *SEQ, "--batch", "64", "--max", "3"), "--out", part])
    assert len(read_rows(part)) == 3
    result = invoke_ok([*_args(spread_models, *SEQ, "--batch", "64"), "--out", part])
    assert "3 already done" in result.output
    assert rows_without_time(part) == rows_without_time(whole)
    bad = CliRunner().invoke(main, [str(a) for a in _args(spread_models, "--sequential", "--radii", "0.05",
                                                          "--n-max", "1500", "--batch", "64")] + ["--out", str(part)])
    assert bad.exit_code == 2 and "radii" in bad.output
    off = CliRunner().invoke(main, [str(a) for a in _args(spread_models, *SEQ, "--batch", "64", "--futility", "off")]
                             + ["--out", str(part)])
    assert off.exit_code == 2 and "futility" in off.output                 # another stopping rule: refused
    other = CliRunner().invoke(main, [str(a) for a in _args(spread_models, *SEQ, "--batch", "64", "--bound", "mixture")]
                               + ["--out", str(part)])
    assert other.exit_code == 2 and "bound" in other.output                # another bound: refused
    settings = json.loads((tmp_path / "part.tsv.settings.json").read_text())
    assert settings["sequential"] is True and settings["radii"] == [0.05, 0.1] and settings["n_max"] == 1500
    assert settings["futility"] == f"pace-floor:{default_pace_margin(1500):g}"
    assert settings["look_growth"] == 1.2 and settings["bound"] == "reach-cp"
    assert settings["schedule_radii"] == [0.05, 0.1] and settings["unanimity"] == 0.2
    # a file of the previous rule: refused by the default in one line, continued with its options
    old = tmp_path / "old.tsv"
    previous = ["--bound", "split-cp", "--futility", "pace"]
    invoke_ok([*_args(spread_models, *SEQ, "--batch", "64", "--max", "1", *previous), "--out", old])
    assert "schedule_radii" not in json.loads((tmp_path / "old.tsv.settings.json").read_text())
    refused = CliRunner().invoke(main, [str(a) for a in _args(spread_models, *SEQ, "--batch", "64")] + ["--out", str(old)])
    assert refused.exit_code == 2 and "bound='split-cp'" in refused.output
    invoke_ok([*_args(spread_models, *SEQ, "--batch", "64", "--max", "2", *previous), "--out", old])
    table = invoke_ok(["analyze", whole, "--radii", "0,0.05,0.1"]).output
    assert "| whole | 6 |" in table


@pytest.mark.slow
def test_cli_sequential_shards_merge_and_sweep(tmp_path, spread_models):
    whole = tmp_path / "whole.tsv"
    invoke_ok([*_args(spread_models, *SEQ), "--out", whole])
    for shard in range(2):
        invoke_ok([*_args(spread_models, *SEQ, "--shard", f"{shard}/2"), "--out", tmp_path / "m.tsv"])
    invoke_ok(["merge", tmp_path / "m.tsv", tmp_path / "m.shard-0-of-2.tsv", tmp_path / "m.shard-1-of-2.tsv"])
    assert rows_without_time(tmp_path / "m.tsv") == rows_without_time(whole)
    # a sweep over two classifiers: each configuration stops on its own, rows equal single runs
    sweep = tmp_path / "sweep"
    invoke_ok([*_args(spread_models, *SEQ, classifiers=("clf.pt", "clf_b.pt")), "--out", sweep])
    single_b = tmp_path / "b.tsv"
    invoke_ok([*_args(spread_models, *SEQ, classifiers=("clf_b.pt",)), "--out", single_b])
    index = json.loads((sweep / "index.json").read_text())
    assert index["settings"]["sequential"] is True
    assert rows_without_time(sweep / "rs__clf.tsv") == rows_without_time(whole)
    assert rows_without_time(sweep / "rs__clf_b.tsv") == rows_without_time(single_b)
    assert [r["samples"] for r in read_rows(single_b)] != [r["samples"] for r in read_rows(whole)]


def test_cli_sequential_option_errors(tmp_path, spread_models):
    for extra, message in ((["--radii", "0.5"], "belong to --sequential"),
                           (["--sequential"], "needs --radii"),
                           (["--sequential", "--radii", "a,b"], "comma-separated"),
                           (["--futility", "off"], "belong to --sequential"),
                           (["--bound", "mixture"], "belong to --sequential"),
                           (["--sequential", "--radii", "0.5", "--bound", "cp"], "--bound"),
                           (["--sequential", "--radii", "0.5", "--futility", "-1"], "--futility must be"),
                           (["--sequential", "--radii", "0.5", "--futility", "x"], "--futility must be"),
                           (["--sequential", "--radii", "0.5", "--futility", "sprt:1"], "--futility must be")):
        result = CliRunner().invoke(main, [str(a) for a in _args(spread_models, *extra)] + ["--out", str(tmp_path / "x.tsv")])
        assert result.exit_code == 2 and message in result.output, result.output


def _coverage_holds(lower, chunks, alpha, paths=20000, ps=(0.5, norm.cdf(1.0), 0.99)):
    """Miscoverage at the looks within estimation noise of alpha (<= 1.6 alpha over 20,000 paths)."""
    from studies.sequential_coverage import miscoverage
    for p in ps:
        failures = miscoverage(lower, chunks, p, paths, np.random.default_rng(int(p * 1e6)))
        assert failures <= 1.6 * alpha * paths, (p, failures)


@pytest.mark.slow
def test_split_cp_coverage_at_the_looks_and_a_naive_rule_fails():
    """The smaller version of `python -m studies.sequential_coverage`: split CP keeps its
    lower bound below p at every look on all but ~alpha of the paths; Clopper-Pearson at alpha at
    every look (the naive rule, ~1% misses) fails the same check."""
    from studies.sequential_coverage import naive_cp_lower, split_cp_lower
    rule = SequentialRule((0.25, 0.5, 0.75, 1.0), 0.5, 0.001, 10000)
    _coverage_holds(split_cp_lower(rule), rule.chunks(), rule.alpha)
    with pytest.raises(AssertionError):
        _coverage_holds(naive_cp_lower(rule.alpha), rule.chunks(), rule.alpha)


def _drive(rule, votes_per_chunk):
    """Feed a SequentialCertificate chunk by chunk; the (lower, upper) it holds after each look."""
    state, held = SequentialCertificate(rule), []
    for votes, size in zip(votes_per_chunk, rule.chunks()):
        state.add(int(votes), size)
        held.append((state.lower, state.upper))
        if state.done:
            break
    return held


def test_the_bounds_are_the_running_max_and_min_over_the_looks():
    """A planted path: votes at 0.8 (the lower bound climbs), then a run at 0.7 (this look's lower
    bound falls) and at 0.8 again (this look's upper bound rises). The rule must keep the best bounds
    seen so far: Cohen's guarantee holds for the max over looks of split CP's lower bounds, and
    the certificate would shrink (or the stop come late) with the current look's bounds."""
    schedule = SequentialRule((0.5,), sigma=0.5, alpha=0.001, n_max=4000, futility_rule=None, bound="split-cp")
    chunks = np.array(schedule.chunks())
    k = len(chunks)
    rates = np.where(np.arange(k) < k // 3, 0.8, np.where(np.arange(k) < 2 * k // 3, 0.7, 0.8))
    votes = np.round(chunks * rates).astype(int)
    s, t = np.cumsum(votes), np.cumsum(chunks)
    lows = lower_confidence_bounds(s, t, schedule.levels())
    highs = upper_confidence_bounds(s, t, schedule.levels())
    assert lows.max() < highs.min()                              # a threshold between: neither side ever settles
    threshold = (lows.max() + highs.min()) / 2
    rule = SequentialRule((0.5 * norm.ppf(threshold),), sigma=0.5, alpha=0.001, n_max=4000, futility_rule=None,
                          bound="split-cp")
    assert rule.chunks() == schedule.chunks()
    held = _drive(rule, votes)
    assert len(held) == k                                        # no stop before n_max
    np.testing.assert_allclose([h[0] for h in held], np.maximum.accumulate(lows))
    np.testing.assert_allclose([h[1] for h in held], np.minimum.accumulate(highs))
    falls = np.flatnonzero(np.diff(lows) < 0) + 1
    rises = np.flatnonzero(np.diff(highs) > 0) + 1
    assert len(falls) and len(rises)                             # the path really does both
    assert all(held[j][0] > lows[j] for j in falls)              # kept above this look's bound
    assert all(held[j][1] < highs[j] for j in rises)
    lower, used = run_rule(rule, votes[None, :])                 # the simulator's vectorised rule agrees
    assert used[0] == rule.n_max and lower[0] == pytest.approx(np.maximum.accumulate(lows)[-1])


def test_each_look_uses_its_own_level():
    """Look k of K spends alpha / (2(K - 1)) (alpha / 2 at the last): each look's bound equals an
    independent Beta quantile at that level, not a neighbour's or the last one's."""
    from scipy.stats import beta
    rule = SequentialRule((0.5,), sigma=0.5, alpha=0.001, n_max=5000, futility_rule=None, bound="split-cp")
    looks = rule.looks()
    big_k = len(looks)
    for k, t in enumerate(looks):
        level = 0.001 / (2 * (big_k - 1)) if k < big_k - 1 else 0.0005
        s = int(0.7 * t)
        lower, upper, _ = look_decision(rule, np.array([float(s)]), np.array([float(t)]), k,
                                        np.array([0.0]), np.array([1.0]))
        assert lower[0] == pytest.approx(beta.ppf(level, s, t - s + 1), rel=1e-12)
        assert upper[0] == pytest.approx(beta.ppf(1 - level, s + 1, t - s), rel=1e-12)


# ---------------------------------------------------------------- the last look's share of alpha (issue 46)

LAST_LOOK_SHARES = (0.5, 0.4, 0.3, 0.2, 0.1, 0.05, 0.02)


@pytest.mark.parametrize("bound", ["split-cp", "reach-cp"])
@pytest.mark.parametrize("n_max", [2000, 10_000, 100_000])
def test_last_look_levels_and_the_unanimity_share_sum_to_alpha(bound, n_max):
    """Every split spends exactly alpha (the union bound): the last look alpha * last_look, the other
    regular looks the rest (less reach-cp's unanimity share), evenly; the looks do not move."""
    base = SequentialRule((0.25, 0.5, 1.0), 0.5, 0.001, n_max, bound=bound)
    for share in LAST_LOOK_SHARES:
        rule = SequentialRule((0.25, 0.5, 1.0), 0.5, 0.001, n_max, bound=bound, last_look=share)
        levels = rule.levels()
        unanimity = rule.alpha * rule.unanimity if bound == "reach-cp" else 0.0
        assert levels.sum() + unanimity == pytest.approx(0.001, rel=1e-12)
        assert levels[-1] == pytest.approx(0.001 * share, rel=1e-12) and np.all(levels >= 0)
        earlier = levels[:-1][levels[:-1] > 0]
        assert np.ptp(earlier) < 1e-18 and rule.looks() == base.looks()
    for share in (0.3, 0.1):
        regular = [True, False, True, True]
        levels = reach_levels(regular, 0.01, 0.2, share)
        assert levels.tolist() == pytest.approx([0.01 * (0.8 - share) / 2, 0.0, 0.01 * (0.8 - share) / 2, 0.01 * share])
        assert split_levels(5, 0.01, share).sum() == pytest.approx(0.01)


def test_the_default_last_look_reproduces_the_earlier_levels_exactly():
    """last_look's default is today's split, bit for bit: alpha / (2(K - 1)) and alpha / 2 (split CP),
    alpha (1/2 - share) / (K_regular - 1) and alpha / 2 (reach-cp), the formulas before the field."""
    for looks, alpha in ((24, 0.001), (60, 0.001), (2, 0.05), (7, 0.1)):
        assert split_levels(looks, alpha).tolist() == [alpha / (2 * (looks - 1))] * (looks - 1) + [alpha / 2]
    for regular, alpha, share in (([True] * 23 + [False, True], 0.001, 0.2), ([True, False, True], 0.05, 0.25),
                                  ([True] * 60, 0.001, 0.2), ([False, True, True, False, True], 0.01, 0.15)):
        earlier = sum(regular) - 1
        expected = [alpha * (0.5 - share) / earlier if r else 0.0 for r in regular[:-1]] + [alpha / 2]
        assert reach_levels(regular, alpha, share).tolist() == expected
    for bound in ("split-cp", "reach-cp"):
        for n_max in (10_000, 100_000):
            rule = SequentialRule((0.25, 0.5, 0.75, 1.0), 0.5, 0.001, n_max, bound=bound)
            assert rule.last_look == 0.5 and rule.levels()[-1] == 0.001 / 2
            regular = rule.levels()[:-1][rule.levels()[:-1] > 0]
            share = 0.5 if bound == "split-cp" else 0.5 - 0.2
            assert set(regular.tolist()) == {0.001 * share / len(regular)}


def test_schedule_key_of_the_default_split_is_the_earlier_key_and_another_split_never_continues_it():
    """The default split's key is the key written before last_look existed (states files and result
    settings keep resuming); another split has its own key, so states of one never continue the other."""
    rule = SequentialRule((0.25, 0.5), 0.5, 0.001, 10_000)
    assert rule.schedule_key == '["reach-cp", 0.001, 10000, 0.5, 1.2, "pace-floor", 0.21, 0.2, [0.25, 0.5]]'
    assert SequentialRule((0.25, 0.5), 0.5, 0.001, 100_000, bound="split-cp", last_look=0.5).schedule_key == \
        '["split-cp", 0.001, 100000, 0.5, 1.2, "pace-floor", 0.13, 0.2, [0.25, 0.5]]'
    other = SequentialRule((0.25, 0.5), 0.5, 0.001, 10_000, last_look=0.1)
    assert other.schedule_key != rule.schedule_key and other.looks() == rule.looks()
    assert json.loads(other.schedule_key)[-1] == 0.1
    from diffsmooth.engine.certify.sequential import SequentialState, continues
    look = rule.looks()[5]
    for mine, theirs in ((rule, other), (other, rule)):
        state = SequentialState(1, look, look, 0.9, 1.0, mine.radii, mine.schedule_key)
        assert continues(mine, state) and not continues(theirs, state)
    earlier = SequentialState(1, look, look, 0.9, 1.0, (0.25,), json.dumps(
        ["reach-cp", 0.001, 10000, 0.5, 1.2, "pace-floor", 0.21, 0.2, [0.25, 0.5]]))
    assert continues(rule, earlier)                                 # a state written before last_look existed


def test_last_look_validation():
    from diffsmooth.engine.errors import UserError
    for share, bound in ((0.0, "reach-cp"), (-0.1, "split-cp"), (1.0, "split-cp"), (0.8, "reach-cp"),
                         (0.85, "reach-cp")):
        with pytest.raises(UserError, match="the last look's share of alpha must be > 0"):
            SequentialRule((0.5,), 0.5, 0.001, 1000, bound=bound, last_look=share)
    assert SequentialRule((0.5,), 0.5, 0.001, 1000, bound="split-cp", last_look=0.9).levels()[-1] == pytest.approx(0.0009)
    with pytest.raises(ValueError, match="last look"):
        reach_levels([True, True], 0.01, 0.2, 0.8)
    with pytest.raises(ValueError, match="last look"):
        split_levels(3, 0.01, 0.0)


@pytest.mark.parametrize("share", [0.1, 0.05])
@pytest.mark.parametrize("bound", ["split-cp", "reach-cp"])
def test_the_exact_miscoverage_of_a_smaller_last_look_stays_below_alpha(bound, share):
    """The dynamic program of studies/sequential_coverage.py (no stopping: every stopping rule's upper
    bound) at n-max 2,000 and alpha 0.05, at the thresholds and a scan of p: <= alpha for the split,
    and the same DP finds CP at alpha at every look above it (the check has power)."""
    from studies.sequential_coverage import exact_miscoverage, naive_cp_lower, scanned_rates, split_cp_lower
    rule = SequentialRule((0.25, 0.5, 1.0), 0.5, 0.05, 2000, bound=bound, last_look=share)
    ps = sorted(set(scanned_rates(rule, 12).tolist()) | {float(p) for p in rule.thresholds})
    worst = max(exact_miscoverage(split_cp_lower(rule), rule.chunks(), p) for p in ps)
    assert 0.3 * rule.alpha < worst <= rule.alpha
    assert exact_miscoverage(naive_cp_lower(rule.alpha), rule.chunks(), float(norm.cdf(0.5))) > rule.alpha

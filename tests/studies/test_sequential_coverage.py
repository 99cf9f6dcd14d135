"""studies/sequential_coverage.py: the exact miscoverage of the sequential looks (a dynamic program over
the vote count, no stopping) against a brute-force sum over every path and against the Monte Carlo."""

import functools
import itertools

import numpy as np
import pytest
from click.testing import CliRunner
from scipy.stats import binom, norm

import studies.sequential_coverage as coverage
from diffsmooth.engine.certify.cohen import lower_confidence_bounds
from diffsmooth.engine.certify.sequential import SequentialRule, split_levels
from diffsmooth.engine.runs.analyze import clopper_pearson
from studies.sequential_coverage import (
    exact_miscoverage,
    exact_miscoverage_by_look,
    first_exceeding,
    main,
    miscoverage,
    naive_cp_lower,
    split_cp_lower,
)


@functools.lru_cache(maxsize=None)
def _every_path(chunks):
    """The votes of each chunk, for every path."""
    return np.array(list(itertools.product(*(range(size + 1) for size in chunks))), dtype=np.float64)


def _brute_force(lower, chunks, p) -> float:
    """Sum of P(path) over every path (the votes of each chunk) whose bound exceeds p at some look:
    no thresholds, no truncation, nothing shared with the dynamic program."""
    votes = _every_path(tuple(chunks))
    prob = np.prod([binom.pmf(votes[:, j], size, p) for j, size in enumerate(chunks)], axis=0)
    counts, trials = np.cumsum(votes, axis=1), np.cumsum(chunks)
    missed = np.zeros(len(votes), dtype=bool)
    for look, t in enumerate(trials):
        missed |= lower(counts[:, look], float(t), look) > p
    return float(prob[missed].sum())


def _split_cp(chunks, alpha):
    levels = split_levels(len(chunks), alpha)
    return lambda s, t, look: lower_confidence_bounds(s, t, levels[look])


@pytest.mark.parametrize("fft", [False, True])
@pytest.mark.parametrize("chunks", [(5, 10, 15, 30), (60,), (5, 15, 40), (2, 2, 2, 4, 50)])
def test_exact_equals_brute_force_at_n_max_60(chunks, fft, monkeypatch):
    """n-max 60, every path enumerated: the split CP bound (levels split over the looks) at a large
    alpha (so the events are frequent) and the naive control, with direct and FFT convolutions."""
    if fft:
        monkeypatch.setattr(coverage, "_DIRECT", 0)
    for alpha in (0.3, 0.05):
        for lower in (_split_cp(chunks, alpha), naive_cp_lower(alpha)):
            for p in (0.2, 0.5, norm.cdf(0.5), 0.9):
                exact = exact_miscoverage(lower, chunks, p)
                assert exact == pytest.approx(_brute_force(lower, chunks, p), abs=1e-13, rel=1e-11), (alpha, p)


def test_thresholds_and_the_running_max():
    """first_exceeding is the first count whose bound is above p; the by-look masses are first
    miscoverages (they sum to P(running max > p)) and the probability mass is kept to ~1e-13."""
    lower = _split_cp((100, 100, 200), 0.01)
    for look, t in enumerate((100, 200, 400)):
        c = first_exceeding(lower, t, look, 0.7)
        assert lower(np.array([c - 1.0]), t, look)[0] <= 0.7 < lower(np.array([float(c)]), t, look)[0]
    assert first_exceeding(lower, 100, 0, 0.9999) == 101            # no count reaches p: nothing miscovers
    by_look, mass_error = exact_miscoverage_by_look(lower, (100, 100, 200), 0.7)
    assert np.all(by_look > 0) and mass_error < 1e-13
    assert by_look.sum() <= 0.01                                      # union bound: each look at most its level


def test_exact_agrees_with_the_monte_carlo():
    """At n-max 3,000 (17 looks of the engine's schedule, alpha 0.05 so failures are common) the exact
    figure lies in the simulation's 99.9% interval over 20,000 paths; split CP <= alpha, the control not."""
    rule = SequentialRule((0.25, 0.5), 0.5, 0.05, 3000)
    paths = 20000
    for p in (0.5, round(float(norm.cdf(1.0)), 6)):
        for lower in (split_cp_lower(rule), naive_cp_lower(rule.alpha)):
            exact = exact_miscoverage(lower, rule.chunks(), p)
            failures = miscoverage(lower, rule.chunks(), p, paths, np.random.default_rng([7, int(p * 1e6)]))
            low, high = clopper_pearson(failures, paths, 0.999)
            assert low <= exact <= high, (p, exact, failures)
        assert exact_miscoverage(split_cp_lower(rule), rule.chunks(), p) <= rule.alpha
        assert exact_miscoverage(naive_cp_lower(rule.alpha), rule.chunks(), p) > 2 * rule.alpha


def test_cli_exact_table_and_the_simulated_cross_check(tmp_path):
    out = CliRunner().invoke(main, ["--n-max", "2000", "--radii", "0.25", "--out", str(tmp_path)])
    assert out.exit_code == 0, out.output
    assert "exact (dynamic program, no stopping: an upper bound for every stopping rule)" in out.output
    looks = len(SequentialRule((0.25,), 0.5, 0.001, 2000).looks())      # reach-cp, the default: 14 + 1 added
    assert f"worst reach-cp at n_max 2,000 ({looks} looks)" in out.output and "simulated" not in out.output
    rows = [line for line in out.output.splitlines() if line.startswith("| 2,000")]
    assert len(rows) == 2 * 6                                            # 0.5, Phi(0.5), 0.9, 0.99, 0.999, 0.9999
    assert all(row.endswith("| yes |") for row in rows if "reach-cp" in row)
    assert any(row.endswith("| NO |") for row in rows if "control" in row)
    assert (tmp_path / "coverage.md").read_text().startswith("EXACT miscoverage")
    crossed = CliRunner().invoke(main, ["--n-max", "2000", "--radii", "0.25", "--paths", "500", "--scan", "5"])
    assert crossed.exit_code == 0 and "simulated: failures / paths" in crossed.output and " / 500, " in crossed.output
    scanned = len(coverage.scanned_rates(SequentialRule((0.25,), 0.5, 0.001, 2000), 5))
    assert f"worst reach-cp over {scanned} p (evenly spaced in [0.5, 0.999], near 1, and at the looks' unanimity " \
           "bands) at n_max 2,000:" in crossed.output

"""studies/sequential_sim.py: vote rates recovered from printed radii, and the simulated table."""

import numpy as np
import pytest
from click.testing import CliRunner

from diffsmooth.engine.certify.cohen import certified_radius
from diffsmooth.engine.runs.results import format_radius
from studies.sequential_sim import main, recover_votes


def test_recover_votes_reprints_the_radius():
    n, alpha, sigma = 10000, 0.001, 0.5
    for n_a in (5300, 6912, 8450, 9771, 9990, 10000):
        printed = format_radius(certified_radius(n_a, n, alpha, sigma))
        got = recover_votes(float(printed), n, alpha, sigma)
        assert format_radius(certified_radius(got, n, alpha, sigma)) == printed
        assert abs(got - n_a) <= max(5, 0.002 * n)
    assert recover_votes(0.0, n, alpha, sigma) is None


def test_sim_table_from_a_tsv(tmp_path):
    rng = np.random.default_rng(0)
    n, alpha, sigma = 2000, 0.001, 0.5
    lines = ["idx\tlabel\tpredict\tradius\tcorrect\ttime"]
    for i, n_a in enumerate(rng.integers(1100, n + 1, 30)):
        radius = certified_radius(int(n_a), n, alpha, sigma)
        lines.append(f"{i}\t1\t{1 if radius else -1}\t{format_radius(radius or 0.0)}\t{int(bool(radius))}\t0:00:01")
    lines.append("30\t2\t-1\t0.0\t0\t0:00:01")
    (tmp_path / "fixed.tsv").write_text("\n".join(lines) + "\n")
    out = CliRunner().invoke(main, ["--rows", str(tmp_path / "fixed.tsv"), "--n", str(n), "--seeds", "2",
                                    "--radii", "0.25,0.5"])
    assert out.exit_code == 0, out.output
    assert "SIMULATION" in out.output and f"| fixed-n n={n} | {31 * (100 + n):,} | 1.00x |" in out.output
    seq = [line for line in out.output.splitlines() if line.startswith("| split-cp, pace m=")
           and "(default)" in line][0]
    assert float(seq.split("|")[3].strip().rstrip("x")) > 1.0          # the sequential rule saved samples
    assert "| mixture, projection k=2 (first default) |" in out.output
    assert "| split-cp, projection k=1.25 (previous default) |" in out.output
    oracle = [line for line in out.output.splitlines() if line.startswith("| oracle")][0]
    assert float(oracle.split("|")[3].strip().rstrip("x")) > 1.0
    # a longer n-max than the rows' n: the fixed-n baseline is simulated at n-max
    out = CliRunner().invoke(main, ["--rows", str(tmp_path / "fixed.tsv"), "--n", str(n), "--n-max", "5000",
                                    "--seeds", "1", "--radii", "0.25,0.5,0.75,1.0,1.25,1.5"])
    assert out.exit_code == 0, out.output
    assert f"| fixed-n n=5000 | {31 * (100 + 5000):,} | 1.00x |" in out.output and "r=1.5" in out.output


def test_sim_computes_no_bound_of_its_own():
    """One implementation: the simulator's core lives in the engine (the table command predicts with
    it) and takes its bounds and its rule from engine/certify; the studies replay rows through it and print tables."""
    import diffsmooth.engine.runs.simulation as sim
    import studies.replay as replay
    import studies.sequential_sim as bench_sim
    from diffsmooth.engine.certify import cohen, sequential
    assert replay.lower_confidence_bounds is cohen.lower_confidence_bounds and sim.run_rule is sequential.run_rule
    assert replay.simulate_sequential is sim.simulate_sequential and replay.shared_paths is sim.shared_paths
    assert not hasattr(sim, "beta") and not hasattr(sim, "confidence_bounds") and not hasattr(replay, "beta")
    assert bench_sim.simulate is replay.simulate and not hasattr(bench_sim, "lower_confidence_bounds")


def test_rules_and_fixed_n_share_one_path_per_image():
    """Paired comparison: each rule's chunk votes are cut from the same path, whose total is the
    fixed-n count, also for rules whose looks differ."""
    from diffsmooth.engine.certify.sequential import SequentialRule
    from studies.sequential_sim import chunk_votes, shared_paths
    rules = [SequentialRule((0.5,), 0.5, 0.001, 5000, growth=g) for g in (1.2, 2.0)]
    assert rules[0].looks() != rules[1].looks()
    p = np.linspace(0.5, 0.99, 40)
    cuts, segments = shared_paths(p, rules, 5000, np.random.default_rng(0))
    assert cuts[-1] == 5000 and len(set(segments.sum(axis=1))) > 10       # totals spread over the paths
    for rule in rules:
        votes = chunk_votes(cuts, segments, rule)
        assert votes.shape == (40, len(rule.chunks())) and np.all(votes >= 0)
        assert np.array_equal(votes.sum(axis=1), segments.sum(axis=1))
        assert np.all(votes <= np.asarray(rule.chunks())[None, :])
        # the first look's votes are the same prefix of the path for both rules
    assert np.array_equal(chunk_votes(cuts, segments, rules[0])[:, 0], chunk_votes(cuts, segments, rules[1])[:, 0])


def test_a_sequential_rows_rate_is_jeffreys_estimate_never_certain():
    """An image that stopped early with every vote for its class must not replay as p = 1 (certain at
    any n-max, which would overstate what a larger n-max saves); half its votes replay near 1/2."""
    from studies.replay import image_from_row

    row = {"idx": 3, "label": 1, "predict": 1, "radius": "0.5", "correct": 1, "samples": 600, "top_votes": 500}
    image = image_from_row(row, n=10_000, n0=100, alpha=0.001, sigma=0.5, abstain_p=0.45)
    assert image.p == pytest.approx(500.5 / 501) and image.p < 1 and image.idx == 3 and image.correct
    half = image_from_row({**row, "top_votes": 250}, n=10_000, n0=100, alpha=0.001, sigma=0.5, abstain_p=0.45)
    assert half.p == pytest.approx(0.5)
    # no estimation sample drawn (stopped at n0): the abstain rate stands in
    assert image_from_row({**row, "samples": 100, "top_votes": 0}, 10_000, 100, 0.001, 0.5, 0.45).p == 0.45

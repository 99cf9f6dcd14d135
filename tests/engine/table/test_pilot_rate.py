"""The predicted seconds' rate comes from the pilot's own batches (no sample drawn for timing); only a
resumed table whose pilot ran before probes full batches."""

import tomllib

import pytest
from table_fixtures import small_table_spec

from diffsmooth.engine.demo import shipped as demo_assets
from diffsmooth.engine.table import build as table_build
from diffsmooth.engine.table import runner as table_runner
from diffsmooth.engine.table.pilot_rate import BatchClock
from diffsmooth.engine.table.spec import parse_spec

needs_demo = pytest.mark.skipif(not demo_assets.DEMO_UNET.exists(), reason="embedded demo models not shipped")


def clocked(batches):
    """A BatchClock fed (rows, seconds) batches on a fake clock, after a first batch that starts it."""
    now = [100.0]
    clock = BatchClock("cpu", clock=lambda: now[0])
    clock(1000)                             # the first batch (compiles, captures): only starts the clock
    for rows, seconds in batches:
        now[0] += seconds
        clock(rows)
    return clock


def test_the_rate_is_that_of_the_pilots_full_batches_the_first_one_untimed():
    clock = clocked([(300, 1.0), (1000, 2.0), (1000, 2.0), (200, 1.0)])
    assert clock.rate(1000) == pytest.approx(500.0)
    assert "2 full batches" in clock.describe(1000)


def test_without_two_full_batches_the_largest_ones_give_a_lower_bound():
    clock = clocked([(600, 1.0), (300, 1.0), (100, 1.0), (1000, 1.0)])
    # one full batch is not enough: batches of at least half the largest size (1000, 600) count
    assert clock.rate(1000) == pytest.approx(800.0)
    assert "lower bound" in clock.describe(1000)


def test_nothing_timed_gives_no_rate():
    assert clocked([]).rate(1000) is None


@needs_demo
def test_a_pilot_is_timed_on_its_own_batches_and_a_resumed_one_is_probed(tmp_path, monkeypatch):
    spec = parse_spec(tomllib.loads(small_table_spec()))
    builder = table_build.TableBuilder(spec, tmp_path / "t", table_build.TablePlanning("auto", pilot=2),
                                       log=lambda line: None, progress=False)
    builder.claim_folder()
    probes = []
    real_probe = table_runner.probe_rate
    monkeypatch.setattr(table_runner, "probe_rate", lambda *a, **k: probes.append(a) or real_probe(*a, **k))
    line, sigma = spec.lines[0], spec.sigmas[0]
    phase = table_build.Phase(line, sigma, [83, 250], spec.radii, builder.phase_path(line, sigma, "pilot"), "pilot")
    result = builder.run_phase(phase)
    voter = builder.runner.voters[(line.name, sigma)]
    assert result.probe_rate > 0 and probes == []
    assert voter.samples_computed == result.samples          # no sample drawn beyond the pilot's own
    again = builder.run_phase(phase)                          # rows already there: nothing of the pilot is timed
    assert len(probes) == 1 and again.probe_rate > 0 and again.seconds == 0

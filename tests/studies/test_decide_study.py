"""studies/decide_study.py: its reading of `all` on every look equals the engine's rule image by image, and
the race that decides only the radius asked keeps `all`'s cells and draws fewer samples."""

import numpy as np

from diffsmooth.engine.table.race import initial_radii
from diffsmooth.engine.table.race_sim import RaceRule, SimulatedSigma
from studies.decide_study import PLANS, PathLooks, markdown, race, study
from tests.studies.test_race_study import _folder

RADII = (0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5)


def _paths(seed: int, images: int = 150) -> dict:
    """Three sigmas' simulated images, rates piled up below 1 (many near a threshold), 90% right-class."""
    rng = np.random.default_rng(seed)
    rates = {s: np.clip(rng.beta(6, 0.6, images), 0.3, 1.0) for s in (0.25, 0.5, 1.0)}
    correct = {s: rng.random(images) < 0.9 for s in rates}
    return {s: SimulatedSigma(s, rates[s], correct[s], RaceRule(RADII, 0.001, 20_000), rng, initial_radii(RADII, s))
            for s in rates}


def test_all_read_on_every_look_certifies_what_the_engines_rule_certifies_image_by_image():
    sims = _paths(1)
    for sigma, sim in sims.items():
        paths = PathLooks(sim)
        radius, used, *_ = sim.run(RADII)
        looks = np.asarray(sim.rule.looks())
        ran = sim.correct
        np.testing.assert_array_equal(looks[paths.stop][ran], used[ran])        # `all` stops where the rule does
        for k, r in enumerate(RADII):
            np.testing.assert_array_equal(paths.all_certifies[ran, k], ((radius > 0) & (radius >= r - 1e-12))[ran])
        assert np.all(paths.decided <= paths.stop[:, None])                      # known by the time `all` stops
        assert len(set(radius[ran].round(3))) >= 4                                # the radii spread


def test_deciding_the_radius_asked_keeps_alls_cells_and_draws_fewer_samples():
    totals = {plan: 0.0 for plan in PLANS}
    for seed in (2, 3, 4):
        paths = {s: PathLooks(sim) for s, sim in _paths(seed).items()}
        all_cells = [max(int((p.correct & p.all_certifies[:, k]).sum()) for p in paths.values())
                     for k in range(len(RADII))]
        assert len(set(all_cells)) >= 4
        for plan, decide in zip(PLANS, (False, True)):
            run = race(paths, RADII, 0, decide)
            assert run["cells"] == all_cells                                     # tolerance 0: exactly `all`'s
            totals[plan] += run["samples"]
    assert totals["decide the radius asked"] < totals["settle the radii up to the one asked"]


def test_the_study_reads_a_table_folder_and_reports_both_plans(tmp_path):
    doc = study(_folder(tmp_path), None, seeds=2, rates="mixture", images=None, n_max=2000, tolerance_points=0.0)
    assert set(doc["plans"]) == set(PLANS) and not doc["reading_differs_any_cell"]
    assert all(p["below_all_worst"] == 0 for p in doc["plans"].values())
    assert doc["plans"]["decide the radius asked"]["samples"] <= doc["plans"]["settle the radii up to the one asked"]["samples"]
    assert "decide the radius asked" in markdown(doc)

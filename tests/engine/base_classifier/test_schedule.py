"""t* and the one-shot coefficients reproduce the reference's values for both presets and all four sigmas."""

import pytest

from diffsmooth.engine.base_classifier.denoise import PRESET_SCHEDULES
from diffsmooth.engine.base_classifier.schedule import DiffusionSchedule, betas_for
from diffsmooth.engine.errors import UserError

REFERENCE_TABLE = [
    # preset, sigma, t*, model timestep, sqrt(abar*), sqrt(1/abar*), sqrt(1/abar* - 1)
    ("cifar10", 0.12, 573, 143.25, 0.9723362365, 1.0284508202, 0.2402313253),
    ("cifar10", 0.25, 1158, 289.5, 0.8943423212, 1.1181400861, 0.5002371959),
    ("cifar10", 0.50, 1984, 496.0, 0.7068861815, 1.4146548994, 1.0006240474),
    ("cifar10", 1.00, 2809, 702.25, 0.4472085209, 2.2360933510, 2.0000283684),
    ("imagenet", 0.12, 70, 70.0, 0.9720823558, 1.0287194228, 0.2413786464),
    ("imagenet", 0.25, 145, 145.0, 0.8932943733, 1.1194518066, 0.5031623468),
    ("imagenet", 0.50, 259, 259.0, 0.7054174736, 1.4176002686, 1.0047838183),
    ("imagenet", 1.00, 396, 396.0, 0.4471274015, 2.2364990307, 2.0004819206),
]


@pytest.mark.parametrize("preset,sigma,t,model_t,a,ra,rm1", REFERENCE_TABLE)
def test_facts_table(preset, sigma, t, model_t, a, ra, rm1):
    c = PRESET_SCHEDULES[preset].coefficients(sigma)
    assert c.t == t
    assert c.model_timestep == pytest.approx(model_t, abs=0)
    assert c.sqrt_abar == pytest.approx(a, abs=1e-10)
    assert c.sqrt_recip_abar == pytest.approx(ra, abs=1e-10)
    assert c.sqrt_recipm1_abar == pytest.approx(rm1, abs=1e-10)


def test_t_star_is_first_index_not_nearest():
    sched = PRESET_SCHEDULES["cifar10"]
    abar = sched.alphas_cumprod
    for sigma in (0.12, 0.25, 0.5, 1.0, 0.33):
        t = sched.timestep(sigma)
        assert ((1 - abar[t]) / abar[t]) ** 0.5 >= 2 * sigma
        assert ((1 - abar[t - 1]) / abar[t - 1]) ** 0.5 < 2 * sigma


def test_schedules_shapes_and_bounds():
    for name in ("linear", "cosine"):
        b = betas_for(name, 1000)
        assert b.shape == (1000,) and (b > 0).all() and (b <= 0.999).all()
    assert betas_for("linear", 1000)[0] == pytest.approx(1e-4)
    assert betas_for("linear", 4000)[-1] == pytest.approx(0.02 / 4)


def test_bad_sigma_and_schedule():
    with pytest.raises(UserError, match="sigma must be > 0"):
        PRESET_SCHEDULES["cifar10"].timestep(0.0)
    with pytest.raises(UserError, match="beyond"):
        DiffusionSchedule("linear", 1000).timestep(100.0)
    with pytest.raises(UserError, match="unknown noise schedule"):
        betas_for("quadratic", 10)
    with pytest.raises(UserError, match="needs >= 50 steps"):
        betas_for("linear", 10)

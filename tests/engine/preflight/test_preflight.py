"""`diffsmooth preflight` and `model.preflight(data)` on the demo models and data: each planted set-up error gives
its warning naming the fix, the correct set-ups give none while every check reports what it measured and its paired
tests pass (so switching a check off fails here), --strict exits 3, nothing is written. Small samples (40-100
images, 1-3 noise samples): each case takes about a second on 2 CPU cores."""

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from diffsmooth import DenoisedSmoothing, DiffSmooth, RandomizedSmoothing, load_dataset, load_demo_classifier, load_demo_denoiser
from diffsmooth.cli import main
from diffsmooth.engine.base_classifier.diffusion_denoiser import PRESET_SCHEDULES, DiffusionDenoiser
from diffsmooth.engine.data.base import load_arrays
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.models import shipped
from diffsmooth.engine.preflight.labels import LabelOrder

needs_demo = pytest.mark.skipif(not shipped.DEMO_UNET.exists(), reason="embedded demo models not shipped")
pytestmark = needs_demo

CHECKS = ["data", "clean", "noise", "normalization", "labels", "sigma"]
TESTS = {"normalization center against normalize", "normalization none against normalize",
         "label permutation against the labels as given (cross-fitted)"}


@pytest.fixture(scope="module")
def data():
    return load_dataset("embedded")


@pytest.fixture(scope="module")
def arrays(data):
    return load_arrays(data)


def fixes(report):
    return [w.fix for w in report.warnings]


def preflight(args, tmp_path=None):
    return CliRunner().invoke(main, ["preflight", *[str(a) for a in args]])


# -- the correct set-ups: no warning, and every check measured --------------------------------------------------


def test_a_correct_rs_set_up_warns_nothing_and_every_check_reports(data):
    report = RandomizedSmoothing(classifier=load_demo_classifier(0.5), sigma=0.5).preflight(data, images=60, samples=3)
    assert report.ok and not report.inconclusive, report.text()
    assert report.checks() == CHECKS, report.text()
    m = report.measured
    assert m["images"] == 60 and m["samples"] == 3 and m["classes"] == 10
    assert m["clean_images"] == 60 and m["labels"]["per_label"] == 6.0     # stratified over the whole data
    assert m["clean_accuracy"] > 0.6 and m["noise_accuracy"] > 0.6         # the demo's s0.50 classifier: ~0.8
    assert m["noise_accuracy"] < m["r0_upper"] <= 1.0
    assert set(m["normalization"]) == {"normalize", "center", "none"}
    assert m["normalization"]["normalize"]["clean"] > m["normalization"]["none"]["clean"] + 0.3
    assert m["labels"]["moved"] == {} and m["labels"]["identity"] == m["labels"]["best"]
    assert abs(m["scale"]["at"] - m["scale"]["half"]) < 0.2 and m["scale"]["higher"] < m["scale"]["at"] - 0.3
    tests = m["tests"]
    assert TESTS <= set(tests) and len(tests) == 5, sorted(tests)       # + half and twice the noise
    assert all(t["verdict"] == "same" and t["upper"] < t["effect"] for t in tests.values()), tests


def test_a_correct_diffsmooth_set_up_warns_nothing_and_reports_the_denoiser(data):
    model = DiffSmooth(denoiser=load_demo_denoiser(), classifier=load_demo_classifier(0.25), sigma=0.5,
                       local_sigma=0.25, m=2)
    report = model.preflight(data, images=60, samples=2)
    assert report.ok and not report.inconclusive, report.text()
    assert report.checks() == CHECKS + ["denoiser"], report.text()
    assert any(name.startswith("schedule ") for name in report.measured["tests"])
    den = report.measured["denoiser"]
    assert den["t_star"] == 1984 and den["schedule"] == "cosine/4000"          # t* of sigma 0.5 on the demo schedule
    assert den["error"] < 0.3 * den["noise"]                                   # ~0.10 against ~0.50
    assert den["alternatives"]["linear/1000"] > den["error"]


def test_the_command_prints_one_line_per_check_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = preflight(["--method", "rs", "--sigma", "0.5", "--images", 40, "--samples", 2, "--strict"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("preflight: rs at sigma 0.5 on embedded (40 of 500 selected images")
    assert list(dict.fromkeys(line.split(":")[0] for line in lines[1:-1])) == CHECKS
    assert "no warnings" in lines[-1] and "nothing was written" in lines[-1]
    assert list(tmp_path.iterdir()) == []
    as_json = json.loads(preflight(["--method", "rs", "--sigma", "0.5", "--images", 40, "--samples", 2, "--json"]).output)
    assert as_json["ok"] and as_json["measured"]["images"] == 40 and as_json["inconclusive"] == 0


# -- the planted errors: each its warning, naming the fix ----------------------------------------------------------


def test_no_normalisation_where_the_classifier_needs_it_names_the_option():
    result = preflight(["--method", "rs", "--sigma", "0.5", "--classifier", shipped.demo_classifier_path(0.5),
                        "--normalization", "none", "--stats", "fashion-mnist", "--images", 40, "--samples", 1])
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.output.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "fix: --normalization normalize" in warnings[0], result.output
    strict = preflight(["--method", "rs", "--sigma", "0.5", "--classifier", shipped.demo_classifier_path(0.5),
                        "--normalization", "none", "--stats", "fashion-mnist", "--images", 40, "--samples", 1, "--strict"])
    assert strict.exit_code == 3 and "fix: --normalization normalize" in strict.output    # the set-up is wrong


def test_labels_in_another_order_name_the_permutation(data, arrays):
    x, y = arrays
    shifted = (y + 1) % 10                       # data label l is the classifier's class l - 1
    report = RandomizedSmoothing(classifier=load_demo_classifier(0.5), sigma=0.5).preflight((x, shifted), images=100,
                                                                                             samples=1)
    assert [w.check for w in report.warnings] == ["labels"], report.text()
    assert "relabel the data" in report.warnings[0].fix
    assert report.measured["labels"]["moved"] == {str(l): (l - 1) % 10 for l in range(10)}
    assert report.measured["labels"]["best"] > report.measured["labels"]["identity"] + 0.5


def test_the_permutation_is_the_confusion_matrix_best_assignment():
    labels = np.array([0, 0, 1, 1, 2, 2, 2])
    order = LabelOrder.of(labels, np.array([1, 1, 2, 0, 0, 0, 1]), 3)
    assert order.mapping == {0: 1, 1: 2, 2: 0} and order.identity == 0.0 and order.best == pytest.approx(5 / 7)


@pytest.mark.parametrize("scale,fix", [(lambda x: 255 * x, "divide the images by 255"),
                                       (lambda x: 2 * x - 1, "(x + 1) / 2")])
def test_images_in_another_pixel_range_are_named_with_their_fix(arrays, scale, fix):
    x, y = arrays
    report = RandomizedSmoothing(classifier=load_demo_classifier(0.5), sigma=0.5).preflight((scale(x), y), images=40,
                                                                                             samples=1)
    assert [w.check for w in report.warnings] == ["data"], report.text()
    assert fix in report.warnings[0].fix


def test_an_npz_file_in_another_range_is_refused_with_its_fix(tmp_path, arrays):
    x, y = arrays
    path = tmp_path / "minus_one.npz"
    np.savez(path, images=(2 * x - 1).numpy(), labels=y.numpy())
    result = preflight(["--dataset", "npz", "--data", path, "--method", "rs", "--images", 10])
    assert result.exit_code == 2 and result.output.count("\n") == 1 and "(x + 1) / 2" in result.output


def test_a_denoiser_with_the_wrong_schedule_names_the_right_one():
    result = preflight(["--method", "dds", "--sigma", "0.5", "--denoiser", shipped.DEMO_UNET, "--preset", "demo",
                        "--schedule", "linear", "--diffusion-steps", 1000, "--classifier", shipped.demo_classifier_path(0.0),
                        "--images", 40, "--samples", 1])
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.output.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "fix: --schedule cosine --diffusion-steps 4000" in warnings[0], result.output
    assert "t* 259 (linear/1000)" in result.output


def test_a_denoiser_read_with_another_presets_schedule_is_named(data):
    den = load_demo_denoiser()
    wrong = DiffusionDenoiser(den.unet, PRESET_SCHEDULES["imagenet"])    # guided-diffusion's linear/1000, not rescaled
    report = DenoisedSmoothing(denoiser=wrong, classifier=load_demo_classifier(0.0), sigma=0.5).preflight(
        data, images=40, samples=1)
    assert [w.check for w in report.warnings] == ["denoiser"], report.text()
    assert report.warnings[0].fix.startswith("--schedule cosine")


def test_a_sigma_meant_for_minus_one_to_one_pixels_is_named(data):
    """A classifier trained at 0.25 on [0, 1] pixels, run at the [-1, 1] reading of that noise (0.5)."""
    rs = RandomizedSmoothing(classifier=load_demo_classifier(0.25), sigma=0.5).preflight(data, images=60, samples=1)
    assert [w.check for w in rs.warnings] == ["sigma"], rs.text()
    assert rs.warnings[0].fix.startswith("--sigma 0.25")
    ds = DiffSmooth(denoiser=load_demo_denoiser(), classifier=load_demo_classifier(0.25), sigma=1.0, local_sigma=0.5,
                    m=1).preflight(data, images=60, samples=2)
    assert [w.check for w in ds.warnings] == ["sigma"], ds.text()
    assert ds.warnings[0].fix.startswith("--local-sigma 0.25")


def test_a_published_cell_above_the_bound_is_a_gap_that_cannot_be_closed(data):
    model = RandomizedSmoothing(classifier=load_demo_classifier(0.5), sigma=0.5)
    reachable = model.preflight(data, images=40, samples=5, published=70.0)
    assert reachable.ok and "the paper's 70.0%" in reachable.text()
    beyond = model.preflight(data, images=100, samples=8, published=99.9)
    assert beyond.measured["r0_upper"] < 0.999, beyond.text()
    assert [w.check for w in beyond.warnings] == ["published"] and "cannot reproduce it" in beyond.text()
    assert "[-1, 1]" not in beyond.text()          # half the sigma does not reach it either


def test_the_sample_is_seeded_and_its_noise_is_certifys(data):
    model = RandomizedSmoothing(classifier=load_demo_classifier(0.5), sigma=0.5)
    one, two = model.preflight(data, images=30, samples=2), model.preflight(data, images=30, samples=2)
    assert one.measured == two.measured
    other = RandomizedSmoothing(classifier=load_demo_classifier(0.5), sigma=0.5, seed=1).preflight(data, images=30,
                                                                                                    samples=2)
    assert other.measured != one.measured
    assert one.measured["r0_upper"] == two.measured["r0_upper"]


def test_channels_last_images_get_the_layout_they_need_in_one_line(arrays):
    x, y = arrays
    model = RandomizedSmoothing(classifier=load_demo_classifier(0.5), sigma=0.5)
    with pytest.raises(UserError, match=r"channels-last \[N,H,W,C\]; give them as \[N,C,H,W\].*permute\(0, 3, 1, 2\)"):
        model.preflight((x[:40].permute(0, 2, 3, 1).repeat(1, 1, 1, 3), y[:40]), images=20, samples=1)
    assert model.preflight((x[:40], y[:40]), images=20, samples=1).ok        # the same images as [N,C,H,W]


class OutOfMemory(torch.nn.Module):
    """A classifier whose forward runs out of device memory (a batch too large for the GPU)."""

    def forward(self, x):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")


def test_out_of_memory_is_reported_as_such_not_as_a_layout_the_classifier_cannot_take(arrays):
    x, y = arrays
    with pytest.raises(UserError, match=r"out of memory classifying .* lower `batch`") as raised:
        RandomizedSmoothing(classifier=OutOfMemory(), sigma=0.5).preflight((x[:40], y[:40]), images=20, samples=1)
    assert "cannot take" not in str(raised.value)


# -- the classifier's training noise, both directions, every method ------------------------------------------------


@pytest.mark.parametrize("make", [
    lambda: RandomizedSmoothing(classifier=load_demo_classifier(0.5), sigma=0.25),
    lambda: DiffSmooth(denoiser=load_demo_denoiser(), classifier=load_demo_classifier(0.5), sigma=0.5, local_sigma=0.25,
                       m=1),
    lambda: DenoisedSmoothing(denoiser=load_demo_denoiser(), classifier=load_demo_classifier(0.5), sigma=0.5),
], ids=["rs", "diffsmooth", "dds"])
def test_a_classifier_trained_at_a_higher_noise_than_it_is_fed_is_named(data, make):
    report = make().preflight(data, images=60, samples=2)
    assert [w.check for w in report.warnings] == ["sigma"], report.text()
    assert "trained at a higher noise than it is fed" in report.warnings[0].text
    assert report.warnings[0].fix.startswith("a classifier trained at")


def test_dds_with_a_classifier_trained_below_its_sigma_is_the_papers_dds_gaussian_not_a_warning(data):
    model = DenoisedSmoothing(denoiser=load_demo_denoiser(), classifier=load_demo_classifier(0.25), sigma=0.5)
    report = model.preflight(data, images=60, samples=2)
    assert report.ok and "noise 0.5 against the denoised images" in report.text(), report.text()


def test_a_sigma_in_0_255_units_is_named_before_any_sample(data):
    report = RandomizedSmoothing(classifier=load_demo_classifier(0.25), sigma=64.0).preflight(data, images=20, samples=1)
    assert [w.check for w in report.warnings] == ["sigma"] and report.warnings[0].fix.startswith("sigma 0.251")
    assert "noise_accuracy" not in report.measured           # nothing measured on drowned images


def test_a_dds_sigma_given_for_minus_one_to_one_pixels_is_named_from_the_published_cell(data):
    """DDS at sigma 1.0 where the paper's 0.5 was meant: its r = 0 cell is out of reach at 1.0, within it at 0.5."""
    model = DenoisedSmoothing(denoiser=load_demo_denoiser(), classifier=load_demo_classifier(0.0), sigma=1.0)
    report = model.preflight(data, images=40, samples=16, published=92.0)
    m = report.measured
    assert m["r0_upper"] < 0.92 <= m["r0_upper_at_half_sigma"], report.text()
    assert [w.check for w in report.warnings] == ["published"] and "[-1, 1] pixels" in report.warnings[0].text
    assert report.warnings[0].fix.startswith("--sigma half")


# -- RGB / BGR, near chance, too few images ------------------------------------------------------------------------


class FirstChannel(torch.nn.Module):
    """An RGB classifier built from the demo's: it reads the red channel (the images' grey values)."""

    def __init__(self):
        super().__init__()
        self.net = load_demo_classifier(0.0)

    def forward(self, x):
        return self.net(x[:, :1])


def test_images_in_bgr_order_are_named_and_rgb_ones_pass(arrays):
    x, y = arrays
    rgb = torch.cat([x, 0.5 * x, torch.zeros_like(x)], dim=1)
    model = RandomizedSmoothing(classifier=FirstChannel(), sigma=0.25)
    right = model.preflight((rgb, y), images=60, samples=1)
    assert "channels" in right.checks() and not [w for w in right.warnings if w.check == "channels"], right.text()
    swapped = model.preflight((rgb.flip(1), y), images=60, samples=1)
    assert "channels" in [w.check for w in swapped.warnings], swapped.text()
    assert "x.flip(1)" in next(w.fix for w in swapped.warnings if w.check == "channels")


def test_accuracy_near_chance_warns_by_itself(arrays):
    x, y = arrays
    shuffled = y[torch.randperm(len(y), generator=torch.Generator().manual_seed(0))]
    report = RandomizedSmoothing(classifier=load_demo_classifier(0.5), sigma=0.5).preflight((x, shuffled), images=60,
                                                                                             samples=1)
    assert [w.check for w in report.warnings] == ["chance"], report.text()


def test_too_few_images_make_a_check_inconclusive_with_the_images_it_needs_not_a_pass(data):
    result = preflight(["--method", "rs", "--sigma", "0.5", "--classifier", shipped.demo_classifier_path(0.5),
                        "--images", 12, "--samples", 1, "--strict"])
    assert result.exit_code == 0, result.output                # inconclusive is not a warning
    weak = [line for line in result.output.splitlines() if line.startswith("inconclusive:")]
    assert weak and all("more images" in line for line in weak), result.output
    assert "check(s) inconclusive" in result.output.splitlines()[-1]

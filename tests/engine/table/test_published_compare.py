"""The comparison of a table's cells with the paper's against Monte Carlo noise on the same images
(engine/table/published.py `against_noise`, engine/table/rerun_cells.py, engine/table/image_odds.py), on synthetic
tables: rows certified from known per-image vote rates (an image's label rate at sigma is Phi(margin / sigma), the
margins spread over certified levels and misclassified images, the rival class taking the rest), fixed-n rows as the
reference TSV prints them (no counts) and sequential rows drawn by the engine's own rule. Two seeds of a table fall
inside each other's intervals in >= 95% of cells and their rows are not marked; a planted 2-point shortfall is;
cells beyond reach are labelled and not counted; a best of several lines states its bias."""

import numpy as np
import pytest
from scipy.stats import norm

from diffsmooth.engine.certify.cohen import certified_radius, lower_confidence_bounds, max_certifiable_radius
from diffsmooth.engine.certify.sequential import SequentialRule, radius_from_lower, run_rule
from diffsmooth.engine.runs.results import format_radius
from diffsmooth.engine.table import published as paper
from diffsmooth.engine.table.image_odds import fixed_rule, recover_count, run_rates, sequential_rule
from diffsmooth.engine.table.report import line_cells
from diffsmooth.engine.table.rerun_cells import TableRuns
from diffsmooth.engine.table.spec import PublishedRow

RADII = (0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0)
SIGMAS = (0.25, 0.5, 1.0)
N0, ALPHA = 100, 0.001
PAIRS = 10                      # independent pairs of seeds of a synthetic table


def margins(images: int, seed: int, loc: float = 0.7, scale: float = 0.8) -> np.ndarray:
    """Each image's margin: its label's vote rate at sigma is Phi(margin / sigma) (negative: misclassified)."""
    return np.random.default_rng(seed).normal(loc, scale, images)


def _row(i: int, predict: int, radius: str, **extra) -> dict:
    return {"idx": str(i), "label": "0", "predict": str(predict), "radius": radius,
            "correct": str(int(predict == 0)), "time": "0.1", **{k: str(v) for k, v in extra.items()}}


def fixed_rows(p: np.ndarray, sigma: float, n: int, rng) -> list:
    """Fixed-n CERTIFY rows (the reference TSV: no counts): the label selected where it holds half the n0 votes."""
    label = 2 * rng.binomial(N0, p) >= N0
    votes = rng.binomial(n, np.where(label, p, 1 - p))
    lower = lower_confidence_bounds(votes, n, ALPHA)
    return [_row(i, (0 if label[i] else 1) if lower[i] >= 0.5 else -1,
                 format_radius(sigma * norm.ppf(lower[i])) if lower[i] >= 0.5 else "0.0") for i in range(len(p))]


def sequential_rows(p: np.ndarray, sigma: float, n_max: int, rng) -> list:
    """Sequential rows (samples, top_votes, selected) from the engine's rule settling every radius; an image whose
    selection picks the rival stops after its n0 samples."""
    rule = SequentialRule(RADII, sigma, ALPHA, n_max, schedule_radii=RADII)
    label = 2 * rng.binomial(N0, p) >= N0
    votes = rng.binomial(np.asarray(rule.chunks())[None, :], p[:, None])
    lower, used = run_rule(rule, votes)
    top = [int(votes[i, :np.searchsorted(rule.looks(), used[i]) + 1].sum()) for i in range(len(p))]
    rows = []
    for i in range(len(p)):
        if not label[i]:
            rows.append(_row(i, -1, "0.0", samples=N0, top_votes=0, selected=1))
            continue
        ok = lower[i] > 0.5
        rows.append(_row(i, 0 if ok else -1, format_radius(radius_from_lower(lower[i], sigma)) if ok else "0.0",
                         samples=N0 + used[i], top_votes=top[i], selected=0))
    return rows


def table(margin_by_line: dict, seed: int, n: int = 1000, sequential: bool = False):
    """(TableRuns, cells, images) of a synthetic table: every line at every sigma, certified at `seed`."""
    rng = np.random.default_rng(seed)
    make = sequential_rows if sequential else fixed_rows
    rows = {line: {s: {"": make(norm.cdf(m / s), s, n, rng)} for s in SIGMAS} for line, m in margin_by_line.items()}
    settles = lambda sigma, r: True                                          # noqa: E731
    rule = (lambda sigma: SequentialRule(RADII, sigma, ALPHA, n, schedule_radii=RADII)) if sequential else None
    images = len(next(iter(margin_by_line.values())))
    runs = TableRuns(rows, RADII, settles, N0, n, ALPHA, rule)
    return runs, {line: line_cells(per, RADII, images, settles) for line, per in rows.items()}, images


def as_published(cells: dict, rows: dict) -> list:
    """A table's cells as the paper prints them (0.1 point): {row name: its lines}."""
    out = []
    for name, lines in rows.items():
        values = tuple((r, round(100.0 * max(cells[line][k].certified for line in lines) / cells[lines[0]][k].images, 1))
                       for k, r in enumerate(RADII))
        out.append(PublishedRow(name, tuple(lines), values))
    return out


def _pairs(margin_by_line: dict, rows: dict, pairs: int, sequential: bool, n: int, reference: str):
    """`pairs` independent pairs of seeds: the first one's cells as the paper's, the second's table compared."""
    for k in range(pairs):
        _, paper_cells, _ = table(margin_by_line, 2 * k, n, sequential)
        runs, cells, images = table(margin_by_line, 2 * k + 1, n, sequential)
        yield paper.against_noise(as_published(paper_cells, rows), cells, runs, images, reference, draws=1000, seed=k)


@pytest.mark.parametrize("sequential,reference", [(False, "fixed"), (True, "same")], ids=["fixed-n", "sequential"])
def test_two_seeds_fall_inside_each_others_interval_in_95_percent_of_cells_and_no_row_is_marked(sequential, reference):
    margin_by_line = {"A": margins(200, 0), "B": margins(200, 1, 0.6, 0.9)}
    rows = {"A": ("A",), "B": ("B",), "A or B": ("A", "B")}
    inside = reachable = marked = 0
    for compared, shifts in _pairs(margin_by_line, rows, PAIRS, sequential, 1000, reference):
        cells = [c for row in compared.values() for c in row]
        reachable += sum(c.reach for c in cells)
        inside += sum(c.reach and not c.outside for c in cells)
        marked += sum(s.marked for s in shifts.rows.values()) + shifts.table.marked
    assert reachable == PAIRS * len(rows) * len(RADII)              # n = 1,000 reaches 2.46 sigma: every cell here
    assert inside / reachable >= 0.95, (inside, reachable)
    assert marked == 0


def _planted(margin: np.ndarray, images_lost: int) -> np.ndarray:
    """The same images with the `images_lost` most robust ones misclassified: every reachable cell loses them."""
    worse = margin.copy()
    worse[np.argsort(-margin)[:images_lost]] = -1.0
    return worse


def test_a_planted_two_point_shortfall_is_marked_for_the_row_and_the_finding_names_the_causes():
    margin = margins(500, 0)
    _, paper_cells, _ = table({"A": margin, "B": margins(500, 1)}, 10, n=200)
    runs, cells, images = table({"A": _planted(margin, 10), "B": margins(500, 1)}, 11, n=200)  # 10 of 500: 2 points
    published = as_published(paper_cells, {"A": ("A",), "B": ("B",)})
    compared, shifts = paper.against_noise(published, cells, runs, images, "fixed", draws=1000)
    a, b = shifts.rows["A"], shifts.rows["B"]
    assert a.marked and a.p_value < 0.01 and 1.0 < a.points < 3.0 and not b.marked
    assert shifts.table.cells == a.cells + b.cells
    text = " ".join(shifts.findings)
    assert text.startswith("A: ") and "below the paper" in text and "another checkpoint" in text
    assert "normalisation" in text and "diffsmooth preflight" in text and "B:" not in text
    md = paper.markdown(published, compared, {}, RADII, False, shifts)
    assert f"| A | +{a.points:.2f} **(shift)** |" in md and "- A: " in md
    summary = paper.summary(published, compared, {}, shifts)
    assert summary["rows"][0]["shift"]["marked"] and not summary["rows"][1]["shift"]["marked"]
    assert summary["findings"] == shifts.findings


def test_cells_beyond_reach_are_labelled_and_not_counted_as_agreeing():
    n = 100                     # reach: sigma x Phi^-1(0.001^(1/100)) = 1.50 sigma: r = 1.75 and 2 beyond every sigma
    rule = fixed_rule(n, ALPHA, 1.0, RADII)
    assert list(rule.reaches()) == [r <= max_certifiable_radius(n, ALPHA, 1.0) for r in RADII]
    margin = {"A": margins(200, 0)}
    _, paper_cells, _ = table(margin, 0, n=n)
    runs, cells, images = table(margin, 1, n=n)
    published = as_published(paper_cells, {"A": ("A",)})
    published[0] = PublishedRow("A", ("A",), published[0].cells[:-1] + ((2.0, 30.0),))   # a paper cell nothing reaches
    compared, shifts = paper.against_noise(published, cells, runs, images, "fixed", draws=500)
    beyond = [c for c in compared["A"] if not c.reach]
    assert [c.radius for c in beyond] == [1.75, 2.0] and not any(c.outside for c in beyond)
    assert shifts.rows["A"].cells == len(RADII) - 2
    summary = paper.summary(published, compared, {}, shifts)
    assert summary["beyond_reach"] == 2 and summary["agreeing"] + summary["outside"] == len(RADII) - 2
    assert "30.0 (beyond reach)" in paper.markdown(published, compared, {}, RADII, False, shifts)
    assert "(n/r)" in paper.latex(published, compared, RADII, shifts)


def test_fixed_rows_are_read_from_their_radii_and_sequential_rows_from_their_counts():
    n = 10000
    for count in (5160, 5200, 7000, 9000, 9990, 10000):
        radius = certified_radius(count, n, ALPHA, 0.5)
        recovered = recover_count(float(format_radius(radius)), n, ALPHA, 0.5)
        assert format_radius(certified_radius(recovered, n, ALPHA, 0.5)) == format_radius(radius)
    rows = [_row(0, 0, format_radius(certified_radius(9000, n, ALPHA, 0.5))), _row(1, 1, "0.3"),
            _row(2, -1, "0.0"), _row(3, -1, "0.0")]
    rates = run_rates(rows, [0, 1, 2, 3, 4], N0, n, ALPHA, 0.5)
    assert list(rates.never) == [False, True, True, True, True]      # another class; abstained far below; missing
    near = recover_count(0.001, n, ALPHA, 0.5)                          # certified just above the abstain threshold
    rates = run_rates([_row(0, 0, "0.001"), _row(1, -1, "0.0"), _row(2, -1, "0.0")], [0, 1, 2], N0, n, ALPHA, 0.5)
    assert list(rates.never) == [False, False, True]                  # one abstained row mirrors the one above
    assert rates.a[1] - 0.5 == 2 * fixed_rule(n, ALPHA, 0.5, [0.0]).needed[0] - 1 - near
    seq = [_row(0, 0, "0.5", samples=1100, top_votes=990, selected=0), _row(1, -1, "0.0", samples=100, top_votes=0,
                                                                           selected=3)]
    rates = run_rates(seq, [0, 1], N0, n, ALPHA, 0.5)
    assert (rates.a[0], rates.b[0], list(rates.never)) == (990.5, 10.5, [False, True])
    rule = SequentialRule(RADII, 0.5, ALPHA, n, schedule_radii=RADII)
    as_counts = sequential_rule(rule, RADII)
    assert list(as_counts.needed) == list(rule.needed)
    p = np.array([[0.3, as_counts.needed[2] / n, 0.9999]])
    chance = np.stack(as_counts.chances_at(p), axis=-1)[0]
    assert chance[0, 0] == 0 and 0.2 < chance[1, 2] < 0.9 and chance[2, 2] == 1.0


def test_the_best_of_lines_bias_is_stated_beside_the_number():
    margin = margins(300, 0)
    _, paper_cells, _ = table({"A": margin, "B": margin}, 0)
    runs, cells, images = table({"A": margin, "B": margin}, 1)      # two lines of the same model: a best of two draws
    published = as_published(paper_cells, {"A or B": ("A", "B"), "A": ("A",)})
    compared, shifts = paper.against_noise(published, cells, runs, images, "fixed", draws=1000)
    either = [c.spread.bias for c in compared["A or B"]]
    alone = [c.spread.bias for c in compared["A"]]
    assert min(either) >= 0 and max(either) > 0.3 and max(either) > 2 * max(alone)
    assert "best-of +" in paper.markdown(published, compared, {}, RADII, False, shifts)
    assert all(c["best_of_bias"] >= 0 for c in paper.summary(published, compared, {}, shifts)["rows"][0]["cells"])

"""How far a table plan could go, SIMULATED on the same paired vote paths as studies/race_study.py:
the race against a plan that knows every cell's winner in advance, and against an ESTIMATED lower
bound on the samples of any valid rule that certifies those cells.

    python -m studies.plan_ceilings --rows DIR [--n-max 100000] [--seeds 20] [--images N]
        [--estimate SECONDS_PER_IMAGE IMAGES] [--out FILE.md]

- *winner known*: each sigma settles only the radii where it has `all`'s best count (ties go to the
  largest sigma, the cheapest), with today's rule. No plan can know this before it samples; it is
  the ceiling of what choosing radii can give (the issue's "perfect plan").
- *information bound*: every image `all` certifies at the radius its sigma wins costs at least
  ln(1 / alpha) / KL(p || Phi(r / sigma)) samples (Wald's bound on the expected sample size of a test
  of level alpha that certifies when the rate is p; exactly the fewest samples when p = 1), capped at
  n-max; an image never certified costs nothing. No rule and no plan can draw fewer on average.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional, Sequence

import click
import numpy as np
from scipy.stats import norm

from diffsmooth.engine.table.defaults import RACE_REACH_SIGMAS
from diffsmooth.engine.table.race import initial_radii, tolerance_images
from diffsmooth.engine.table.race_sim import RaceRule, SimulatedSigma
from studies.race_study import (
    RATE_TEXT,
    estimate,
    estimate_lines,
    load_selected,
    publish,
    rates_from,
    seed_rates,
    simulation_options,
    stop_text,
    tiled,
)
from studies.replay import simulate_race

PLANS = ("fixed", "all", "race", "winner known", "winner known, tolerance", "information bound")


def information_samples(p, threshold, alpha: float, n_max: int) -> np.ndarray:
    """Wald's lower bound ln(1 / alpha) / KL(p || threshold) on the expected samples a level-alpha test
    needs to certify a rate p above `threshold` (0 where p <= threshold: such an image is not counted),
    capped at n_max. For p = 1 it is ln(alpha) / ln(threshold), the fewest samples with every vote."""
    p, q = np.broadcast_arrays(np.asarray(p, np.float64), np.asarray(threshold, np.float64))
    with np.errstate(divide="ignore", invalid="ignore"):
        kl = (np.where(p > 0, p * np.log(p / q), 0.0)
              + np.where(p < 1, (1 - p) * np.log((1 - p) / (1 - q)), 0.0))
        need = np.where(p > q, np.log(1 / alpha) / kl, 0.0)
    return np.minimum(need, n_max)


def cell_winners(counts: Dict[float, Sequence[int]], radii: Sequence[float]) -> Dict[float, float]:
    """Per radius, the sigma with the most certified images (ties: the largest sigma, which settles
    the radius at the smallest r / sigma)."""
    out = {}
    for k, r in enumerate(radii):
        best = max(c[k] for c in counts.values())
        out[r] = max(s for s, c in counts.items() if c[k] == best)
    return out


def tolerant_winner_samples(sim: SimulatedSigma, won: Sequence[float], certified: np.ndarray, full_radius: np.ndarray,
                            tolerance: int) -> float:
    """Estimation samples of a plan that knows the sigma's won radii and, like the race, may leave each cell up
    to `tolerance` images below `all`'s: at each won radius, from the largest down, the `tolerance` images whose
    hardest won certificate is that radius and whose run costs the most settle only the smaller won radii (or
    nothing); every other image settles every won radius."""
    won = sorted(won)
    targets = {i: tuple(won) for i in range(len(certified))}
    hardest = np.full(len(certified), -1.0)
    for r in won:
        hardest = np.where(certified & (full_radius >= r), r, hardest)
    for j in range(len(won) - 1, -1, -1):
        r, below = won[j], tuple(won[:j])
        cost = sim.run(tuple(won))[1]
        candidates = [i for i in np.argsort(-cost, kind="stable") if hardest[i] == r][:tolerance]
        for i in candidates:
            targets[i] = below
    return float(sum(sim.run(t)[1][i] for i, t in targets.items() if t))


def one_seed(rates: Dict[float, np.ndarray], correct: Dict[float, np.ndarray], radii: Sequence[float], alpha: float,
             n_max: int, n0: int, tolerance_points: float, rng, wrong_class_stop: bool = False) -> dict:
    """{plan: samples (n0 included)} and the winners, every plan on the same paths."""
    sigmas = sorted(rates)
    images = len(rates[sigmas[0]])
    rule = RaceRule(radii, alpha, n_max, wrong_class_stop)
    sims = {s: SimulatedSigma(s, rates[s], correct[s], rule, rng, initial_radii(radii, s, RACE_REACH_SIGMAS)) for s in sigmas}
    tolerance = tolerance_images(tolerance_points, images)
    out = {"fixed": float(images * len(sigmas) * (n0 + n_max)), "all": 0.0, "winner known": 0.0,
           "winner known, tolerance": 0.0, "information bound": 0.0}
    counts, certified, full = {}, {}, {}
    for s in sigmas:
        full[s] = sims[s].run(sims[s].radii)
        out["all"] += float(full[s][1].sum()) + images * n0
        certified[s] = sims[s].correct & (full[s][0] > 0)
        counts[s] = [int((certified[s] & (full[s][0] >= r)).sum()) for r in radii]
    winners = cell_winners(counts, radii)
    shortfall = 0
    for s in sigmas:
        won = tuple(r for r in radii if winners[r] == s)
        if not won:
            continue
        known = sims[s].run(won)
        out["winner known"] += float(known[1].sum()) + images * n0
        out["winner known, tolerance"] += tolerant_winner_samples(sims[s], won, certified[s], full[s][0], tolerance) \
            + images * n0
        for r in won:          # a run settling only the won radii may stop before `all` certifies one
            k = list(radii).index(r)
            shortfall = max(shortfall, counts[s][k] - int((certified[s] & (known[0] >= r)).sum()))
        hardest = np.full(images, -1.0)             # the largest won radius each image certifies under `all`
        for r in won:
            hardest = np.where(certified[s] & (full[s][0] >= r), r, hardest)
        counted = hardest >= 0
        threshold = norm.cdf(np.maximum(hardest, 0.0) / s)
        out["information bound"] += float(np.where(counted, information_samples(rates[s], threshold, alpha, n_max), 0).sum())
    race = simulate_race(sims, tolerance, n0)
    out["race"] = sum(race.samples.values()) + len(sigmas) * images * n0
    return {"samples": out, "winners": {f"{r:g}": winners[r] for r in radii}, "shortfall": shortfall}


def study(folder: Path, n_max: int, seeds: int, tolerance: float, rates: str = "mixture", images: Optional[int] = None,
          selected: Optional[dict] = None, wrong_class_stop: bool = False) -> dict:
    data = tiled(rates_from(folder, selected), images)
    spec = data["spec"]
    rng = np.random.default_rng(0)
    runs: List[dict] = [one_seed(seed_rates(data, rates, rng), data["correct"], spec["radii"], spec["alpha"], n_max,
                                 spec["n0"], tolerance, rng, wrong_class_stop) for _ in range(seeds)]
    fewer = {plan: [r["samples"]["fixed"] / r["samples"][plan] for r in runs] for plan in PLANS}
    return {"line": data["line"], "images": len(next(iter(data["rates"].values()))), "n_max": n_max, "seeds": seeds,
            "n0": spec["n0"],
            "rates": rates, "tolerance": tolerance, "alpha": spec["alpha"], "wrong_class_stop": wrong_class_stop,
            "selected_known": selected is not None,
            "wrong_class_images": {f"{s:g}": int((~c).sum()) for s, c in data["correct"].items()},
            "plans": {plan: {"samples": float(np.mean([r["samples"][plan] for r in runs])),
                             "fewer_than_fixed": float(np.mean([r["samples"]["fixed"] for r in runs])
                                                       / np.mean([r["samples"][plan] for r in runs])),
                             "worst_seed": float(np.min(fewer[plan])),
                             "best_seed": float(np.max(fewer[plan]))} for plan in PLANS},
            "winners_each_seed": [r["winners"] for r in runs],
            "winner_known_most_below_all": max(r["shortfall"] for r in runs)}


def markdown(doc: dict) -> str:
    lines = [f"## SIMULATED: {doc['line']}, {doc['images']} images, n-max {doc['n_max']:,}, {doc['seeds']} seeds on paired "
             f"paths, race tolerance {doc['tolerance']:g} points, vote rates: {RATE_TEXT[doc['rates']]}; "
             f"{stop_text(doc)}", "",
             "| plan | samples (mean) | fewer than fixed-n (of the means) | worst seed | best seed |", "|---|---|---|---|---|"]
    for plan, p in doc["plans"].items():
        lines.append(f"| {plan} | {p['samples']:,.0f} | {p['fewer_than_fixed']:.1f}x | {p['worst_seed']:.1f}x | "
                     f"{p['best_seed']:.1f}x |")
    race, known = doc["plans"]["race"], doc["plans"]["winner known"]
    patterns: Dict[str, int] = {}
    for w in doc["winners_each_seed"]:
        key = ", ".join(f"{r}: {s:g}" for r, s in w.items())
        patterns[key] = patterns.get(key, 0) + 1
    lines += ["", f"The race draws {race['samples'] / known['samples']:.2f}x the samples of the plan that knows the winners "
              f"(the information bound is ESTIMATED: Wald's ln(1/alpha) / KL per certificate). The plan that knows the "
              f"winners ends at most {doc['winner_known_most_below_all']} image(s) below `all` in a cell (its runs "
              f"may stop on a radius before `all` certifies a won one).", "",
              "Each cell's winner (radius: sigma) under `all`, and in how many seeds:", ""]
    lines += [f"- {key}: {n}" for key, n in sorted(patterns.items(), key=lambda kv: -kv[1])]
    lines += estimate_lines(doc, PLANS)
    return "\n".join(lines) + "\n"


@click.command()
@simulation_options
def main(folder, n_max, seeds, tolerance, estimate_, warmup_s, overhead, builds, rates, images, out: Optional[str],
         selected, wrong_class_stop):
    """Prints the ceilings as markdown."""
    doc = study(Path(folder), n_max, seeds, tolerance, rates, images, load_selected(selected), wrong_class_stop)
    if estimate_:
        doc["estimate"] = estimate(doc, estimate_[0], estimate_[1], warmup_s, overhead, builds, plans=PLANS)
    publish(doc, markdown(doc), out)


if __name__ == "__main__":
    main()

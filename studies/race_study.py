"""The race plan against `all`, the pilot plan (`auto`, the previous default) and fixed-n, SIMULATED on
paired vote paths from a measured table's rows, with where the samples go (by sigma and by why an
image's run stopped), and an ESTIMATED GPU line.

    python -m studies.race_study --rows DIR [--n-max 100000] [--seeds 20] [--tolerance 0.5]
        [--estimate SECONDS_PER_IMAGE IMAGES] [--out FILE.md]

Each image's vote rate per sigma is read from the table folder's rows of its first line (any plan;
the row with the most samples where an image has several), as Jeffreys' estimate from top_votes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import click
import numpy as np

from diffsmooth.engine.runs.results import read_rows
from diffsmooth.engine.table.defaults import PILOT_IMAGES, TOLERANCE_POINTS
from diffsmooth.engine.table.race_sim import RaceRule
from diffsmooth.engine.table.spec import LineSpec
from studies.rate_model import draw_prior_rates, draw_rates, fit_rate_prior, fit_unanimous_weight
from studies.replay import STOP_REASONS, PlanKnobs, image_from_row, simulate_plans

PLANS = ("fixed", "all", "auto", "race")
RATE_MODELS = ("mixture", "jeffreys", "beta-mixture", "beta")  # studies/rate_model.py; rate_calibration.py checks them
RATE_TEXT = {"mixture": "each seed draws every image's rate from its posterior (point mass at 1 fitted to the rows, "
                        "else Jeffreys)", "jeffreys": "Jeffreys' estimate of each row",
             "beta-mixture": "each seed draws every image's rate from its posterior under a point mass at 1 plus a "
                             "Beta(a, b), all three fitted to the rows (the model the measured reruns support)",
             "beta": "each seed draws every image's rate from its posterior under a Beta(a, b) fitted to the rows "
                     "(no point mass: the lower bracket of the measured reruns)"}
REASONS = STOP_REASONS + ("extended",)


def right_class(row: dict, selected: Optional[dict], sigma: float) -> bool:
    """The image's selected class is its label: from the row's `selected` column, else from `selected` (a
    studies/selected_classes.py file), else the row's `correct` (an abstaining row then counts as another class,
    as studies did before the selected class was recorded)."""
    if row.get("selected") not in (None, ""):
        return int(row["selected"]) == int(row["label"])
    if selected is not None:
        return int(selected["selected"][f"{sigma:g}"][row["idx"]]) == int(row["label"])
    return int(row["correct"]) == 1


def rates_from(folder: Path, selected: Optional[dict] = None) -> dict:
    """{'spec', 'line', 'rates': {sigma: p}, 'correct': {sigma: bool}, 'votes'/'drawn': {sigma: counts}}
    from a table folder's rows (votes -1 where a row is fixed-n); `correct`: the selected class is the label
    (right_class)."""
    summary = json.loads((folder / "summary.json").read_text())
    spec, line = summary["spec"], summary["rows"][0]["name"]
    first = spec["lines"][0]
    slug = LineSpec(first["name"], first["method"], {}, {}, {}).slug
    rates, correct, votes, drawn, order = {}, {}, {}, {}, None
    for sigma in spec["sigmas"]:
        best: Dict[int, dict] = {}
        runs = folder / "runs"
        for path in sorted([runs / f"{slug}_s{sigma:g}.tsv", *runs.glob(f"{slug}_s{sigma:g}_*.tsv")]):
            for row in read_rows(path) if path.is_file() else []:
                i = int(row["idx"])
                if i not in best or int(row["samples"]) > int(best[i]["samples"]):
                    best[i] = row
        idx = sorted(best)
        if order is not None and idx != order:
            raise click.ClickException(f"sigma {sigma:g} has rows for other images than the first sigma")
        order = idx
        images = [image_from_row(best[i], spec["n_max"], spec["n0"], spec["alpha"], sigma, 0.45) for i in idx]
        rates[sigma] = np.array([im.p for im in images])
        correct[sigma] = np.array([right_class(best[i], selected, sigma) for i in idx])
        votes[sigma] = np.array([im.votes for im in images])
        drawn[sigma] = np.array([im.drawn for im in images])
    return {"spec": spec, "line": line, "rates": rates, "correct": correct, "votes": votes, "drawn": drawn}


def seed_rates(data: dict, model: str, rng) -> Dict[float, np.ndarray]:
    """One seed's vote rates: Jeffreys' estimate of each row (`jeffreys`), or a draw from each image's
    posterior under the point-mass-at-1 mixture fitted to the sigma's rows (`mixture`)."""
    if model == "jeffreys":
        return data["rates"]
    if model in ("beta-mixture", "beta"):
        return _prior_draws(data, model, rng)
    out = {}
    for sigma, p in data["rates"].items():
        votes, drawn = data["votes"][sigma], data["drawn"][sigma]
        counted = (votes >= 0) & (drawn > 0)
        weight = fit_unanimous_weight(votes[counted], drawn[counted])
        out[sigma] = p.copy()
        out[sigma][counted] = draw_rates(votes[counted], drawn[counted], weight, rng)
    return out


def _prior_draws(data: dict, model: str, rng) -> Dict[float, np.ndarray]:
    """One seed's rates from each sigma's prior `model` fitted once to its rows (studies/rate_model.py)."""
    priors = data.setdefault("_priors", {})
    out = {}
    for sigma, p in data["rates"].items():
        votes, drawn = data["votes"][sigma], data["drawn"][sigma]
        counted = (votes >= 0) & (drawn > 0)
        if (model, sigma) not in priors:
            priors[(model, sigma)] = fit_rate_prior(votes[counted], drawn[counted], model)
        out[sigma] = p.copy()
        out[sigma][counted] = draw_prior_rates(votes[counted], drawn[counted], priors[(model, sigma)], rng)
    return out


def tiled(data: dict, images: Optional[int]) -> dict:
    """The rows' images repeated in order up to `images` (a line of the paper's size from a smaller
    measurement: the same rates, each copy on its own paths); unchanged when None."""
    if images is None:
        return data
    out = dict(data)
    for key in ("rates", "correct", "votes", "drawn"):
        out[key] = {s: np.resize(v, images) for s, v in data[key].items()}
    return out


def load_selected(path: Optional[str]) -> Optional[dict]:
    """A studies/selected_classes.py file, or None."""
    return json.loads(Path(path).read_text()) if path else None


def study(folder: Path, n_max: int, seeds: int, tolerance: float, pilot: int, rates: str = "mixture",
          images: Optional[int] = None, selected: Optional[dict] = None, wrong_class_stop: bool = False,
          first_smallest: bool = True) -> dict:
    data = tiled(rates_from(folder, selected), images)
    spec = data["spec"]
    rng = np.random.default_rng(0)
    rule = RaceRule(spec["radii"], spec["alpha"], n_max, wrong_class_stop=wrong_class_stop)
    knobs = PlanKnobs(first_smallest=first_smallest, pilot=pilot)
    runs: List[dict] = [simulate_plans(seed_rates(data, rates, rng), data["correct"], rule, spec["n0"], tolerance, rng, knobs)
                        for _ in range(seeds)]
    out = {"line": data["line"], "radii": spec["radii"], "sigmas": spec["sigmas"], "n_max": n_max, "seeds": seeds, "rates": rates,
           "tolerance": tolerance, "images": len(next(iter(data["rates"].values()))), "n0": spec["n0"], "plans": {},
           "wrong_class_stop": wrong_class_stop, "selected_known": selected is not None, "first_smallest": first_smallest,
           "wrong_class_images": {f"{s:g}": int((~c).sum()) for s, c in data["correct"].items()}}
    for plan in PLANS:
        samples = np.array([r[plan]["samples"] for r in runs])
        cells = np.array([r[plan]["cells"] for r in runs])
        by_sigma = {f"{s:g}": {why: float(np.mean([r[plan]["by_sigma"][s].get(why, 0.0) for r in runs])) for why in REASONS}
                    for s in spec["sigmas"]}
        out["plans"][plan] = {"samples": float(samples.mean()), "cells": cells.mean(axis=0).tolist(),
                              "fewer_than_fixed_each_seed": (runs[0]["fixed"]["samples"] / samples).tolist(),
                              "by_sigma": by_sigma}
    all_cells = np.array([r["all"]["cells"] for r in runs])
    fixed_cells = np.array([r["fixed"]["cells"] for r in runs])
    for plan in ("auto", "race"):
        cells = np.array([r[plan]["cells"] for r in runs])
        out["plans"][plan]["minus_all_worst"] = float((cells - all_cells).min())
        out["plans"][plan]["minus_all_best"] = float((cells - all_cells).max())
        out["plans"][plan]["minus_fixed_mean"] = float((cells - fixed_cells).mean())
    out["plans"]["all"]["minus_fixed_mean"] = float((all_cells - fixed_cells).mean())
    out["plans"]["race"]["extensions"] = float(np.mean([r["race"]["extensions"] for r in runs]))
    out["plans"]["race"]["by_extension"] = extension_means([r["race"]["by_extension"] for r in runs])
    return out


def extension_means(seeds: Sequence[dict]) -> List[dict]:
    """The race's extensions per (sigma, radius, role), mean images and samples per seed over `seeds`
    (each race_sim's by_extension), dearest first."""
    keys = sorted({key for seed in seeds for key in seed})
    rows = [{"sigma": sigma, "radius": radius, "role": role,
             "images": float(np.mean([seed.get((sigma, radius, role), (0, 0.0))[0] for seed in seeds])),
             "samples": float(np.mean([seed.get((sigma, radius, role), (0, 0.0))[1] for seed in seeds]))}
            for sigma, radius, role in keys]
    return sorted(rows, key=lambda row: -row["samples"])


def estimate(doc: dict, seconds_per_image: float, images: int, warmup_s: float, overhead: float, builds: int,
             plans: Sequence[str] = PLANS) -> dict:
    """ESTIMATED: a line of `images` images on a GPU from the simulated samples per image, a measured
    fixed-n rate (seconds per image at n = n-max), the sequential path's overhead per sample and one
    compile warm-up per model build."""
    per_sample = seconds_per_image / (doc["n0"] + doc["n_max"])
    out = {"images": images, "seconds_per_image_fixed": seconds_per_image, "warmup_s": warmup_s, "builds": builds,
           "overhead": overhead}
    for plan in plans:
        samples = doc["plans"][plan]["samples"] / doc["images"] * images
        rate = per_sample * (1.0 if plan == "fixed" else overhead)
        out[plan] = {"samples": samples, "seconds": samples * rate + builds * warmup_s}
    return out


def stop_text(doc: dict) -> str:
    """What the study assumed about the selected class and the wrong-class stop."""
    wrong = ", ".join(f"{n} at sigma {s}" for s, n in doc.get("wrong_class_images", {}).items())
    known = "recorded" if doc.get("selected_known") else "from the rows (an abstaining row counts as another class)"
    if not doc.get("wrong_class_stop"):
        return f"no wrong-class stop (selected classes {known})"
    return f"the wrong-class stop (selected classes {known}; images whose class is not their label: {wrong})"


def markdown(doc: dict) -> str:
    r, plans = doc["radii"], doc["plans"]
    lines = [f"## SIMULATED: {doc['line']}, {doc['images']} images, sigma {doc['sigmas']}, n-max {doc['n_max']:,}, "
             f"{doc['seeds']} seeds on paired paths, race tolerance {doc['tolerance']:g} points, vote rates: "
             f"{RATE_TEXT[doc.get('rates', 'jeffreys')]}; {stop_text(doc)}", "",
             "| plan | samples (mean) | fewer than fixed-n (worst seed) | " + " | ".join(f"r={x:g}" for x in r) + " |",
             "|" + "---|" * (len(r) + 3)]
    fixed = plans["fixed"]["samples"]
    for plan in PLANS:
        p = plans[plan]
        worst = min(p["fewer_than_fixed_each_seed"])
        lines.append(f"| {plan} | {p['samples']:,.0f} | {fixed / p['samples']:.1f}x ({worst:.1f}x) | "
                     + " | ".join(f"{v:.1f}" for v in p["cells"]) + " |")
    race, auto = plans["race"], plans["auto"]
    lines += ["", f"race - all, every cell and seed (points): worst {race['minus_all_worst']:+.1f}, best "
              f"{race['minus_all_best']:+.1f}; auto - all: worst {auto['minus_all_worst']:+.1f}. Mean change against "
              f"fixed-n: race {race['minus_fixed_mean']:+.2f}, all {plans['all']['minus_fixed_mean']:+.2f}, auto "
              f"{auto['minus_fixed_mean']:+.2f}. The race asked for {race['extensions']:.1f} extensions on average.", "",
              "Where the samples go (mean per seed; n0 included; why an image's run stopped: certified = every radius "
              "it was asked to settle, ruled out = its upper bound or the futility stop gave up, n-max; extended = "
              "the race's reruns):", "", "| plan | sigma | " + " | ".join(REASONS) + " | total |",
              "|" + "---|" * (len(REASONS) + 3)]
    for plan in ("all", "auto", "race"):
        for sigma, by in plans[plan]["by_sigma"].items():
            lines.append(f"| {plan} | {sigma} | " + " | ".join(f"{by[w]:,.0f}" for w in REASONS)
                         + f" | {sum(by.values()):,.0f} |")
    lines += extension_lines(race, plans["race"]["samples"])
    lines += estimate_lines(doc, PLANS)
    return "\n".join(lines) + "\n"


def extension_lines(race: dict, total: float) -> List[str]:
    """The markdown of the race's extensions by sigma, radius and role (none for studies written before)."""
    if not race.get("by_extension"):
        return []
    lines = ["", "The race's extensions (mean per seed, dearest first; *likely winner*: the contender with the most "
             "expected certificates settles its undecided images; *shows it loses*: another settles just enough of "
             "them to fall within the tolerance):", "",
             "| sigma | radius | role | images | samples | share of the race |", "|---|---|---|---|---|---|"]
    for row in race["by_extension"]:
        lines.append(f"| {row['sigma']:g} | {row['radius']:g} | {row['role']} | {row['images']:.1f} | "
                     f"{row['samples']:,.0f} | {100 * row['samples'] / total:.1f}% |")
    return lines


def estimate_lines(doc: dict, plans: Sequence[str]) -> List[str]:
    """The markdown of doc['estimate'] (none without one): samples and minutes per plan."""
    if "estimate" not in doc:
        return []
    e = doc["estimate"]
    return ["", f"## ESTIMATED: {e['images']} images on one GPU", "",
            f"{e['seconds_per_image_fixed']} s per image fixed-n at n = {doc['n_max']:,} (measured), the sequential "
            f"path's {e['overhead']:.2f}x time per sample (measured), {e['builds']} model build(s) of "
            f"{e['warmup_s']:.0f} s warm-up (measured per build):", "", "| plan | samples | minutes |", "|---|---|---|",
            *(f"| {plan} | {e[plan]['samples']:,.0f} | {e[plan]['seconds'] / 60:.1f} |" for plan in plans)]


def simulation_options(command):
    """The options every study of simulated table plans takes (this one and studies/plan_ceilings.py)."""
    options = [
        click.option("--rows", "folder", type=click.Path(exists=True, file_okay=False), required=True,
                     help="A table folder (any plan): its first line's rows give each image's vote rate per sigma."),
        click.option("--n-max", type=click.IntRange(1), default=100_000, show_default=True),
        click.option("--seeds", type=click.IntRange(1), default=20, show_default=True),
        click.option("--tolerance", type=click.FloatRange(0, 100), default=TOLERANCE_POINTS, show_default=True),
        click.option("--estimate", "estimate_", nargs=2, type=(float, click.IntRange(1)), default=None,
                     help="SECONDS IMAGES: a GPU line of IMAGES images from a measured fixed-n rate at n = --n-max."),
        click.option("--warmup-s", type=click.FloatRange(0), default=60.0, show_default=True),
        click.option("--overhead", type=click.FloatRange(0), default=1.12, show_default=True),
        click.option("--builds", type=click.IntRange(0), default=1, show_default=True),
        click.option("--rates", type=click.Choice(RATE_MODELS), default="mixture", show_default=True,
                     help="How a seed gets each image's vote rate from its row (studies/rate_model.py)."),
        click.option("--images", type=click.IntRange(1), default=None,
                     help="Repeat the rows' images in order up to this many (each copy on its own paths)."),
        click.option("--out", type=click.Path(dir_okay=False), default=None,
                     help="Write the markdown (and FILE.json) here."),
        click.option("--selected", type=click.Path(exists=True, dir_okay=False), default=None,
                     help="Each image's selected class (studies/selected_classes.py), for rows written before sequential "
                          "rows recorded it; else an abstaining row counts as another class."),
        click.option("--wrong-class-stop/--no-wrong-class-stop", default=True, show_default=True,
                     help="The table's wrong-class stop (an image whose selected class is not its label stops after "
                          "n0); off: the rule before it (every image runs; abstentions of unknown class)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def publish(doc: dict, text: str, out: Optional[str]) -> None:
    """Prints the markdown; with `out`, writes it there and the study beside it as FILE.json."""
    click.echo(text)
    if out:
        Path(out).write_text(text)
        Path(out).with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")


@click.command()
@simulation_options
@click.option("--pilot", type=click.IntRange(1), default=PILOT_IMAGES, show_default=True, help="The pilot plan's pilot images.")
@click.option("--first-smallest/--no-first-smallest", default=True, show_default=True,
              help="The race's first runs settle the smallest radius too (engine/table/race.py initial_radii).")
def main(folder, n_max, seeds, tolerance, pilot, estimate_, warmup_s, overhead, builds, rates, images, out: Optional[str],
         selected, wrong_class_stop, first_smallest):
    """Prints the study as markdown."""
    doc = study(Path(folder), n_max, seeds, tolerance, pilot, rates, images, load_selected(selected), wrong_class_stop,
                first_smallest)
    if estimate_:
        doc["estimate"] = estimate(doc, estimate_[0], estimate_[1], warmup_s, overhead, builds)
    publish(doc, markdown(doc), out)


if __name__ == "__main__":
    main()

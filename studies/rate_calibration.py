"""MEASURED against SIMULATED: how well each vote-rate model predicts what a table's reruns did.

    python -m studies.rate_calibration FOLDER... [--out FILE]

A race folder (`diffsmooth table`, plan race) holds each sigma's first run (LINE_sSIGMA.tsv) and its
extensions (LINE_sSIGMA_toR.tsv), which rerun images from their first sample with more radii: an
extension row's first samples are the earlier row's. For every image whose earlier row had every
vote, each model predicts the chance that the rerun keeps every vote up to the samples at which a
unanimous image stops in that file; the sum is compared with the count observed. Models: Jeffreys'
estimate (the simulator's rate until now), Jeffreys' posterior, and the mixture with a point mass at
1 whose weight is fitted to the first runs' rows only (studies/rate_model.py).

    python -m studies.rate_calibration --rerun RACE_FOLDER [--later FOLDER]... \
        [--probe PROBE.json]... [--rows FOLDER]... [--models A,B] [--json FILE] [--out FILE]

compares the multi-parameter priors of studies/rate_model.py (RATE_PRIORS) on what came after a row:

- a rerun check (`--rerun`): each image's row in the race folder's first run (LINE_sSIGMA.tsv) against its
  longest row in the race folder and the `--later` folders of the same line (every table run draws the same
  samples of an image under the table's seed, so a longer row's first samples are the shorter row's: checked);
- a probe check (`--probe`, studies/rate_probe.py): each probed image's row against the votes counted beyond it.

Every check is scored two ways. *rows*: the prior is fitted to the check's rows of every image (what a simulator
fitting to a table's rows sees) and predicts what came after for every checked image. *half*: two folds of the
checked images (alternate images in index order); the prior is fitted to the rows of every image with the other
fold's rows continued by what came after them, and predicts this fold's. Scores: the log predictive likelihood of
what came after (the path's, summed; differences between models are what count) and, of the checked images
whose row had every vote, the count that kept every vote up to the horizon (a rerun check's horizon: the samples
where the later rows with every vote stop), expected against observed, with the exact two-sided p-value of the
Poisson-binomial count. `--rows FOLDER` adds each prior's parameters fitted to the folder's rows and to every
known path, per line and sigma.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Dict, List, Tuple

import click
import numpy as np
from scipy.special import betaln

from diffsmooth.engine.runs.results import read_rows
from studies.rate_model import (
    JEFFREYS,
    RATE_PRIORS,
    RatePrior,
    fit_rate_prior,
    fit_unanimous_weight,
    unanimous_posterior,
)

MODELS = ("Jeffreys' estimate", "Jeffreys' posterior", "mixture (fitted w)")


def _every_vote_chance(votes: int, drawn: int, more: int, weight: float) -> Dict[str, float]:
    """Each model's chance that an image with `votes` of `drawn` (every vote) keeps every vote for
    `more` samples."""
    estimate = (votes + JEFFREYS) / (drawn + 1)
    beta_moment = float(np.exp(betaln(votes + JEFFREYS + more, JEFFREYS) - betaln(votes + JEFFREYS, JEFFREYS)))
    one = float(unanimous_posterior([votes], [drawn], weight)[0])
    return {MODELS[0]: estimate ** more, MODELS[1]: beta_moment, MODELS[2]: one + (1 - one) * beta_moment}


def _first_runs(folder: Path):
    """(path, name match: slug and sigma, settings) of each sigma's first run (LINE_sSIGMA.tsv) of a race folder."""
    runs = folder / "runs" if (folder / "runs").is_dir() else folder
    for first in sorted(runs.glob("*_s*.tsv")):
        match = re.fullmatch(r"(.+)_s([0-9.]+)\.tsv", first.name)
        if match:
            yield first, match, json.loads(Path(f"{first}.settings.json").read_text())


def calibrate(folder: Path) -> List[dict]:
    """One entry per extension file of a race folder (its runs/ folder)."""
    settings_n0 = None
    out = []
    for first, match, settings in _first_runs(folder):
        n0 = settings_n0 = int(settings["n0"])
        earlier = {int(r["idx"]): r for r in read_rows(first)}
        votes = np.array([int(r["top_votes"]) for r in earlier.values()])
        drawn = np.array([int(r["samples"]) - n0 for r in earlier.values()])
        weight = fit_unanimous_weight(votes, drawn)
        extensions = [p for p in first.parent.glob(f"{match.group(1)}_s{match.group(2)}_*.tsv")
                      if re.fullmatch(r"(to|at)[0-9.]+", p.stem.rsplit("_", 1)[1])]     # settling radii, deciding one
        for extension in sorted(extensions, key=lambda p: (float(p.stem.rsplit("_", 1)[1][2:]), p.name)):
            rows = {int(r["idx"]): r for r in read_rows(extension)}
            unanimous = [int(r["samples"]) - n0 for r in rows.values() if int(r["top_votes"]) == int(r["samples"]) - n0]
            if unanimous:
                stop = max(set(unanimous), key=unanimous.count)       # where a unanimous image stops in this file
                entry = {"file": extension.name, "sigma": float(match.group(2)), "weight": weight, "images": 0,
                         "observed": 0, "expected": {m: 0.0 for m in MODELS}}
                for image, row in rows.items():
                    before = earlier[image]
                    k, n = int(before["top_votes"]), int(before["samples"]) - n0
                    if k != n or n <= 0 or n >= stop:
                        continue
                    entry["images"] += 1
                    entry["observed"] += int(int(row["top_votes"]) == int(row["samples"]) - n0 == stop)
                    for model, chance in _every_vote_chance(k, n, stop - n, weight).items():
                        entry["expected"][model] += chance
                out.append(entry)
            earlier.update(rows)            # a later extension reruns from these rows
    del settings_n0
    return out


def markdown(folders: List[Path]) -> str:
    lines = ["## MEASURED reruns against each rate model's prediction", "",
             "| rows | extension | w (fitted on first runs) | images with every vote before | kept every vote (measured) | "
             + " | ".join(f"{m} expects" for m in MODELS) + " |", "|---" * (5 + len(MODELS)) + "|"]
    for folder in folders:
        for e in calibrate(folder):
            lines.append(f"| {folder} | {e['file']} | {e['weight']:.3f} | {e['images']} | {e['observed']} | "
                         + " | ".join(f"{e['expected'][m]:.1f}" for m in MODELS) + " |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------------------------
# The multi-parameter priors against reruns and probes


def _rows(path: Path, n0: int) -> Dict[int, Tuple[int, int]]:
    """{image: (top_votes, drawn)} of a sequential result file."""
    return {int(r["idx"]): (int(r["top_votes"]), int(r["samples"]) - n0) for r in read_rows(path)}


def _sequential(path: Path, seed: int) -> bool:
    settings = json.loads(Path(f"{path}.settings.json").read_text())
    return bool(settings.get("sequential")) and int(settings.get("seed", -1)) == seed


def _prefix(short: Tuple[int, int], long: Tuple[int, int]) -> bool:
    """Whether a row of k votes in n samples can be the first samples of a row of K in N."""
    (k, n), (big_k, big_n) = short, long
    return big_n >= n and 0 <= big_k - k <= big_n - n and 0 <= (big_n - big_k) - (n - k) <= big_n - n


def _longest(paths: List[Path], n0: int, seed: int, also: Dict[int, Tuple[int, int]] = None) -> Dict[int, Tuple[int, int]]:
    """{image: (votes, drawn)} of its longest row in the sequential files of the seed; refuses rows (with `also`'s)
    that are not the first samples of each other (other noise or models)."""
    rows: Dict[int, List[Tuple[int, int]]] = {i: [row] for i, row in (also or {}).items()}
    for path in paths:
        if _sequential(path, seed):
            for i, row in _rows(path, n0).items():
                rows.setdefault(i, []).append(row)
    best = {}
    for i, found in rows.items():
        found.sort(key=lambda row: row[1])
        for short, long in zip(found, found[1:]):
            if not _prefix(short, long):
                raise click.ClickException(f"image {i}: {short[0]} votes of {short[1]} are no prefix of {long[0]} of "
                                           f"{long[1]} ({', '.join(str(p) for p in paths)}): other noise or models")
        best[i] = found[-1]
    return best


def _check(line: str, sigma: float, kind: str, source: str, fit: Dict[int, Tuple[int, int]],
           after: Dict[int, Tuple[int, int]], horizon: Dict[int, int], kept: Dict[int, bool]) -> dict:
    """A check: `fit` every image's row (what a fit sees), `after` {image: (votes, samples)} after the row,
    `horizon`/`kept` for the checked images whose row had every vote and whose outcome at the horizon is known."""
    idx = sorted(i for i in after if fit[i][1] > 0)
    return {"line": line, "sigma": sigma, "kind": kind, "source": source, "fit": fit, "idx": idx, "after": after,
            "horizon": horizon, "kept": kept}


def rerun_checks(race: Path, later: List[Path]) -> List[dict]:
    """One rerun check per sigma of a race folder (module docstring); refuses rows that are not prefixes of
    each other."""
    out = []
    for first, match, settings in _first_runs(race):
        n0, seed, slug, sigma = int(settings["n0"]), int(settings["seed"]), match.group(1), float(match.group(2))
        rows = _rows(first, n0)
        paths = [p for folder in [race, *later] for p in sorted(((folder / "runs") if (folder / "runs").is_dir()
                                                                   else folder).glob(f"{slug}_s{match.group(2)}*.tsv"))
                 if p != first and re.fullmatch(rf"{re.escape(slug)}_s{re.escape(match.group(2))}(_.*)?\.tsv", p.name)]
        longest = _longest(paths, n0, seed, also=rows)
        after, unanimous_stops = {}, []
        for i, (k, n) in rows.items():
            if longest[i][1] <= n:
                continue
            big_k, big_n = longest[i]
            after[i] = (big_k - k, big_n - n)
            if k == n and big_k == big_n:
                unanimous_stops.append(big_n)
        horizon, kept = {}, {}
        if unanimous_stops:
            stop = max(set(unanimous_stops), key=unanimous_stops.count)
            for i, (more_k, more_n) in after.items():
                k, n = rows[i]
                if k != n or n <= 0 or n >= stop:
                    continue
                if more_k == more_n and n + more_n != stop:
                    continue          # every vote, stopped elsewhere: the outcome at the horizon is unknown
                horizon[i], kept[i] = stop - n, more_k == more_n
        used = sorted({str(p.parent.parent if p.parent.name == "runs" else p.parent) for p in paths})
        out.append(_check(slug, sigma, "rerun", f"{race} first run -> longest of {', '.join(used)}",
                          rows, after, horizon, kept))
    return out


def probe_check(path: Path) -> dict:
    """A probe check from a studies/rate_probe.py file; the fit sees the longest row of every image of the sigma in
    the probed folder."""
    doc = json.loads(path.read_text())
    folder, sigma, n0 = Path(doc["folder"]), float(doc["sigma"]), int(doc["n0"])
    runs = folder / "runs"
    fit = _longest(sorted(runs.glob(f"*_s{sigma:g}.tsv")) + sorted(runs.glob(f"*_s{sigma:g}_*.tsv")), n0,
                   int(doc["seed"]))
    after, horizon, kept = {}, {}, {}
    for image in doc["images"]:
        i = int(image["idx"])
        if fit.get(i) != (int(image["top_votes"]), int(image["drawn"])):
            raise click.ClickException(f"{path}: image {i}'s row is not the folder's longest row")
        if image["probe_drawn"] <= 0:
            continue
        after[i] = (int(image["probe_votes"]), int(image["probe_drawn"]))
        if image["unanimous"]:
            horizon[i], kept[i] = int(image["probe_drawn"]), image["probe_votes"] == image["probe_drawn"]
    slug = next(runs.glob(f"*_s{sigma:g}.tsv")).name[:-len(f"_s{sigma:g}.tsv")]
    return dict(_check(slug, sigma, "probe", str(path), fit, after, horizon, kept), folder=str(folder), n0=n0)


def poisson_binomial_p(chances: np.ndarray, observed: int) -> float:
    """The exact two-sided p-value of `observed` successes of independent trials with these chances."""
    dist = np.zeros(len(chances) + 1)
    dist[0] = 1.0
    for c in chances:
        dist[1:] = dist[1:] * (1 - c) + dist[:-1] * c
        dist[0] *= 1 - c
    low, high = float(np.sum(dist[:observed + 1])), float(np.sum(dist[observed:]))
    return min(1.0, 2 * min(low, high))


def _arrays(pairs: Dict[int, Tuple[int, int]], idx) -> Tuple[np.ndarray, np.ndarray]:
    return (np.array([pairs[i][0] for i in idx], np.float64), np.array([pairs[i][1] for i in idx], np.float64))


def _score(prior: RatePrior, check: dict, idx: List[int]) -> dict:
    votes, drawn = _arrays(check["fit"], idx)
    more_votes, more = _arrays(check["after"], idx)
    path = (prior.log_marginal(votes + more_votes, drawn + more) - prior.log_marginal(votes, drawn))
    counted = [i for i in idx if i in check["horizon"]]
    k, n = _arrays(check["fit"], counted)
    chances = prior.keep_chance(k, n, np.array([check["horizon"][i] for i in counted], np.float64))
    return {"images": len(idx), "log_predictive": float(np.sum(path)), "unanimous": len(counted),
            "kept": int(sum(check["kept"][i] for i in counted)), "chances": chances}


def evaluate(check: dict, name: str, mode: str = "rows") -> dict:
    """One model's scores on a check: mode `rows` (fitted to the check's rows) or `half` (two folds, each fitted
    to the rows with the other fold's continuations)."""
    images = sorted(check["fit"])
    if mode == "rows":
        prior = fit_rate_prior(*_arrays(check["fit"], images), name)
        scores, params = [_score(prior, check, check["idx"])], [prior.params]
    else:
        scores, params = [], []
        for fold in (0, 1):
            test = check["idx"][fold::2]
            train = set(check["idx"][1 - fold::2])
            fit = {i: (k + check["after"][i][0], n + check["after"][i][1]) if i in train else (k, n)
                   for i, (k, n) in check["fit"].items()}
            prior = fit_rate_prior(*_arrays(fit, images), name)
            scores.append(_score(prior, check, test))
            params.append(prior.params)
    chances = np.concatenate([s["chances"] for s in scores])
    kept = sum(s["kept"] for s in scores)
    return {"model": name, "mode": mode, "images": sum(s["images"] for s in scores),
            "log_predictive": sum(s["log_predictive"] for s in scores), "unanimous": len(chances), "kept": kept,
            "expected": float(np.sum(chances)), "p_value": poisson_binomial_p(chances, kept) if len(chances) else 1.0,
            "params": params, "chances": [float(c) for c in chances]}


def compare(checks: List[dict], models=RATE_PRIORS, modes=("rows", "half")) -> List[dict]:
    out = []
    for check in checks:
        for mode in modes:
            results = [evaluate(check, name, mode) for name in models]
            base = results[0]["log_predictive"]
            for r in results:
                r["delta"] = r["log_predictive"] - base
            out.append({"line": check["line"], "sigma": check["sigma"], "kind": check["kind"],
                        "source": check["source"], "mode": mode, "results": results})
    return out


def pooled(checks: List[dict]) -> Dict[Tuple[str, float], Dict[int, Tuple[int, int]]]:
    """{(line, sigma): {image: (votes, drawn)}}: every image's longest known path over the checks (a row continued
    by what came after it), refusing paths that are not prefixes of each other."""
    found: Dict[Tuple[str, float], Dict[int, List[Tuple[int, int]]]] = {}
    for check in checks:
        paths = found.setdefault((check["line"], check["sigma"]), {})
        for i, (k, n) in check["fit"].items():
            paths.setdefault(i, []).append((k, n))
            if i in check["after"]:
                paths[i].append((k + check["after"][i][0], n + check["after"][i][1]))
    out = {}
    for key, paths in found.items():
        out[key] = {}
        for i, rows in paths.items():
            rows.sort(key=lambda row: row[1])
            for short, long in zip(rows, rows[1:]):
                if not _prefix(short, long):
                    raise click.ClickException(f"{key[0]} sigma {key[1]:g} image {i}: {short} is no prefix of {long}")
            out[key][i] = rows[-1]
    return out


def folder_rows(folder: Path) -> Dict[Tuple[str, float], Tuple[int, Dict[int, Tuple[int, int]]]]:
    """{(line, sigma): (n0, {image: its longest row})} of a table folder's sequential runs."""
    runs = folder / "runs" if (folder / "runs").is_dir() else folder
    out = {}
    for first in sorted(runs.glob("*_s*.tsv")):
        match = re.fullmatch(r"(.+)_s([0-9.]+)\.tsv", first.name)
        if match:
            settings = json.loads(Path(f"{first}.settings.json").read_text())
            paths = [p for p in sorted(runs.glob(f"{match.group(1)}_s{match.group(2)}*.tsv"))
                     if re.fullmatch(rf"{re.escape(match.group(1))}_s{re.escape(match.group(2))}(_.*)?\.tsv", p.name)]
            out[(match.group(1), float(match.group(2)))] = (int(settings["n0"]), _longest(paths, int(settings["n0"]),
                                                                                        int(settings["seed"])))
    return out


def fitted_table(checks: List[dict], folders: List[Path], models=RATE_PRIORS, horizon: int = 100_000) -> str:
    """Each prior fitted, per line and sigma, to a table folder's rows (what a simulator fitting to them gets) and to
    every image's longest known path (pooled: those rows, the checks' rows and what came after them), with the share of
    the folder's rows with every vote that the prior expects to keep every vote up to `horizon` samples (n0
    included), ESTIMATED from each fit."""
    lines = ["## Fitted priors per line and sigma", "",
             "`rows`: fitted to the folder's rows (each image's longest); `pooled`: to every image's longest known path "
             "(those rows, reruns and probes). BIC = -2 log marginal + parameters x ln(images). Last column (ESTIMATED "
             f"from the fit): of the folder's rows with every vote, the share the prior expects to keep every vote to "
             f"{horizon:,} samples.", "",
             "| line | sigma | rows | model | fitted to | parameters | log marginal (pooled paths) | BIC (pooled) | "
             f"keep every vote to {horizon:,} |", "|---" * 9 + "|"]
    everything = pooled(checks)
    for folder in folders:
        for key, (n0, rows) in folder_rows(folder).items():
            known = dict(everything.get(key, {}))
            for i, row in rows.items():
                short, long = sorted([row, known.get(i, row)], key=lambda r: r[1])
                if not _prefix(short, long):
                    raise click.ClickException(f"{folder} {key[0]} sigma {key[1]:g} image {i}: {short} is no prefix of "
                                               f"{long}")
                known[i] = long
            images = sorted(rows)
            votes, drawn = _arrays(rows, images)
            pooled_k, pooled_n = _arrays(known, sorted(known))
            every = (votes >= drawn) & (drawn > 0)
            for name in models:
                for fitted_to, (k, n) in (("rows", (votes, drawn)), ("pooled", (pooled_k, pooled_n))):
                    prior = fit_rate_prior(k, n, name)
                    keep = prior.keep_chance(votes[every], drawn[every], horizon - n0 - drawn[every])
                    log_marginal = float(np.sum(prior.log_marginal(pooled_k, pooled_n)))
                    bic = -2 * log_marginal + len(prior.params) * np.log(np.sum(pooled_n > 0))
                    lines.append(f"| {key[0]} | {key[1]:g} | {folder} | {name} | {fitted_to} | {_params([prior.params])} "
                                 f"| {log_marginal:.1f} | {bic:.1f} | {np.mean(keep):.3f} |")
    return "\n".join(lines) + "\n"


def _params(params: List[dict]) -> str:
    return " / ".join(", ".join(f"{k} {v:.3g}" for k, v in p.items()) for p in params)


def compare_markdown(entries: List[dict]) -> str:
    lines = ["## MEASURED continuations against each prior's prediction", "",
             "| line | sigma | check | fit | model | images | log pred. - first model's | rows with every vote | "
             "kept every vote (measured) | expected | p | fitted (per fold) |", "|---" * 12 + "|"]
    for e in entries:
        for r in e["results"]:
            lines.append(f"| {e['line']} | {e['sigma']:g} | {e['kind']} | {e['mode']} | {r['model']} | {r['images']} | "
                         f"{r['delta']:+.1f} | {r['unanimous']} | {r['kept']} | {r['expected']:.1f} | "
                         f"{r['p_value']:.2g} | {_params(r['params'])} |")
    lines += ["", "Summed over the sigmas (the p-value of the summed count, exact):", "",
              "| line | check | fit | model | images | log pred. - first model's | rows with every vote | "
              "kept every vote (measured) | expected | p |", "|---" * 10 + "|"]
    groups: Dict[Tuple[str, str, str, str], List[dict]] = {}
    for e in entries:
        for r in e["results"]:
            groups.setdefault((e["line"], e["kind"], e["mode"], r["model"]), []).append(r)
    for (line, kind, mode, model), results in groups.items():
        chances = np.array([c for r in results for c in r["chances"]])
        kept = sum(r["kept"] for r in results)
        p = poisson_binomial_p(chances, kept) if len(chances) else 1.0
        lines.append(f"| {line} | {kind} | {mode} | {model} | {sum(r['images'] for r in results)} | "
                     f"{sum(r['delta'] for r in results):+.1f} | {len(chances)} | {kept} | {np.sum(chances):.1f} | "
                     f"{p:.2g} |")
    sources = sorted({(e["line"], e["sigma"], e["kind"], e["source"]) for e in entries})
    lines += ["", "Sources:", ""] + [f"- {line} sigma {sigma:g} {kind}: {source}" for line, sigma, kind, source in sources]
    return "\n".join(lines) + "\n"


@click.command()
@click.argument("folders", nargs=-1, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--rerun", "races", multiple=True, type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="A race folder: its first runs' rows against the longest later rows (repeatable).")
@click.option("--later", multiple=True, type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="More table folders of the same lines whose rows continue the first runs' (repeatable).")
@click.option("--probe", "probes", multiple=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A studies/rate_probe.py file (repeatable).")
@click.option("--rows", "rows_folders", multiple=True, type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="A table folder whose rows each prior is fitted to, per sigma, alone and pooled with the checks' "
                   "(repeatable; the parameters table).")
@click.option("--models", default=",".join(RATE_PRIORS), show_default=True, help="Priors compared (the first: the "
              "baseline of the log predictive likelihood).")
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path), default=None)
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None)
def main(folders, races, later, probes, rows_folders, models, json_out, out):
    """Prints the calibration as markdown: the one-parameter models against race folders' reruns (FOLDERS), or the
    priors against reruns and probes (--rerun, --probe)."""
    if not folders and not races and not probes:
        raise click.UsageError("name race FOLDERS, or --rerun / --probe (and --rows)")
    text = markdown(list(folders)) if folders else ""
    if races or probes:
        checks = [c for race in races for c in rerun_checks(race, list(later))] + [probe_check(p) for p in probes]
        entries = compare(checks, tuple(models.split(",")))
        text += compare_markdown(entries)
        if rows_folders:
            text += "\n" + fitted_table(checks, list(rows_folders), tuple(models.split(",")))
        if json_out:
            json_out.write_text(json.dumps([{k: v for k, v in e.items()} for e in entries], indent=1) + "\n")
    click.echo(text)
    if out:
        out.write_text(text)


if __name__ == "__main__":
    main()

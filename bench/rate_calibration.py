"""MEASURED against SIMULATED: how well each vote-rate model predicts what a table's reruns did.

    python -m diffsmooth.bench.rate_calibration FOLDER... [--out FILE]

A race folder (`diffsmooth table`, plan race) holds each sigma's first run (LINE_sSIGMA.tsv) and its
extensions (LINE_sSIGMA_toR.tsv), which rerun images from their first sample with more radii: an
extension row's first samples are the earlier row's. For every image whose earlier row had every
vote, each model predicts the chance that the rerun keeps every vote up to the samples at which a
unanimous image stops in that file; the sum is compared with the count observed. Models: Jeffreys'
estimate (the simulator's rate until now), Jeffreys' posterior, and the mixture with a point mass at
1 whose weight is fitted to the first runs' rows only (engine/runs/rate_model.py).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Dict, List

import click
import numpy as np
from scipy.special import betaln

from diffsmooth.engine.runs.rate_model import JEFFREYS, fit_unanimous_weight, unanimous_posterior
from diffsmooth.engine.runs.results import read_rows

MODELS = ("Jeffreys' estimate", "Jeffreys' posterior", "mixture (fitted w)")


def _every_vote_chance(votes: int, drawn: int, more: int, weight: float) -> Dict[str, float]:
    """Each model's chance that an image with `votes` of `drawn` (every vote) keeps every vote for
    `more` samples."""
    estimate = (votes + JEFFREYS) / (drawn + 1)
    beta_moment = float(np.exp(betaln(votes + JEFFREYS + more, JEFFREYS) - betaln(votes + JEFFREYS, JEFFREYS)))
    one = float(unanimous_posterior([votes], [drawn], weight)[0])
    return {MODELS[0]: estimate ** more, MODELS[1]: beta_moment, MODELS[2]: one + (1 - one) * beta_moment}


def calibrate(folder: Path) -> List[dict]:
    """One entry per extension file of a race folder (its runs/ folder)."""
    settings_n0 = None
    runs = folder / "runs" if (folder / "runs").is_dir() else folder
    out = []
    for first in sorted(runs.glob("*_s*.tsv")):
        match = re.fullmatch(r"(.+)_s([0-9.]+)\.tsv", first.name)
        if not match:
            continue
        settings = json.loads(Path(f"{first}.settings.json").read_text())
        n0 = settings_n0 = int(settings["n0"])
        earlier = {int(r["idx"]): r for r in read_rows(first)}
        votes = np.array([int(r["top_votes"]) for r in earlier.values()])
        drawn = np.array([int(r["samples"]) - n0 for r in earlier.values()])
        weight = fit_unanimous_weight(votes, drawn)
        for extension in sorted(runs.glob(f"{match.group(1)}_s{match.group(2)}_to*.tsv"),
                                key=lambda p: float(p.stem.rsplit("_to", 1)[1])):
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


@click.command()
@click.argument("folders", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None)
def main(folders, out):
    """Prints the calibration as markdown."""
    text = markdown(list(folders))
    click.echo(text)
    if out:
        out.write_text(text)


if __name__ == "__main__":
    main()

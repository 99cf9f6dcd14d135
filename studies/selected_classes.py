"""The class each image's n0 selection samples pick, per sigma, for a demo table line: what sequential rows
record since the `selected` column exists, computed for rows written before it (a study of the wrong-class
stop replays those rows with it: studies/race_study.py --selected).

    python -m studies.selected_classes --rows rs --images 500 [--compile] --out FILE.json

The selection uses samples 0..n0-1 of each image under the table's seed, as every table run does, so the
classes are those the stored runs selected; `--check DIR` compares them with a table folder's rows (a row
that predicts a class predicts its selected class) and refuses any difference.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Dict, Optional

import click

from diffsmooth.engine.certify.cohen import top_class
from diffsmooth.engine.runs.execute import build_voter
from diffsmooth.engine.runs.request import RunRequest
from diffsmooth.engine.runs.resolve import resolve_run
from diffsmooth.engine.runs.results import read_rows
from diffsmooth.engine.table.spec import DEMO_ROWS, demo_spec


def selected_classes(row: str, images: int, compile: bool, threads: Optional[int], batch: int) -> dict:
    """{'line', 'n0', 'seed', 'labels': {idx: label}, 'selected': {sigma: {idx: class}}} of the demo line `row`."""
    spec = demo_spec(rows=(row,), images=images, threads=threads, batch=batch, compile=compile)
    line = spec.lines[0]
    out = {"line": line.name, "n0": spec.n0, "seed": spec.seed, "labels": {}, "selected": {}}
    with tempfile.TemporaryDirectory() as scratch:
        for sigma in spec.sigmas:
            request = RunRequest.parse("certify", out=str(Path(scratch) / f"s{sigma:g}.tsv"),
                                       **spec.request_options(line, sigma))
            run = resolve_run(request)
            voter = build_voter(run, lambda message: None)
            images_ = [(i, run.dataset[i][0]) for i in run.indices]
            counts = voter.count_many(images_, 0, spec.n0, run.batch)
            out["selected"][f"{sigma:g}"] = {str(i): top_class([int(c) for c in k[0]]) for (i, _), k in zip(images_, counts)}
            out["labels"].update({str(i): int(run.dataset[i][1]) for i in run.indices})
    return out


def check_against(doc: dict, folder: Path) -> Dict[str, int]:
    """{sigma: rows checked}: every row of the folder's runs that predicts a class predicts its selected class."""
    checked = {}
    for sigma, selected in doc["selected"].items():
        n = 0
        for path in sorted((folder / "runs").glob(f"*_s{sigma}*.tsv")):
            for row in read_rows(path):
                if int(row["predict"]) >= 0:
                    if selected.get(row["idx"]) != int(row["predict"]):
                        raise click.ClickException(f"{path.name} image {row['idx']}: predicts {row['predict']}, the "
                                                   f"selection picks {selected.get(row['idx'])}: other noise or models")
                    n += 1
        checked[sigma] = n
    return checked


@click.command()
@click.option("--rows", "row", type=click.Choice(DEMO_ROWS), required=True, help="The demo line.")
@click.option("--images", type=int, default=500, show_default=True)
@click.option("--compile", is_flag=True, help="Compiled stages (as the stored runs were made).")
@click.option("--threads", type=int, default=None)
@click.option("--batch", type=int, default=1000, show_default=True)
@click.option("--check", "folders", type=click.Path(exists=True, file_okay=False, path_type=Path), multiple=True,
              help="A table folder of the same line whose rows must agree (repeatable).")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True)
def main(row, images, compile, threads, batch, folders, out):
    doc = selected_classes(row, images, compile, threads, batch)
    for folder in folders:
        doc.setdefault("checked", {})[str(folder)] = check_against(doc, folder)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    wrong = {s: sum(doc["selected"][s][i] != doc["labels"][i] for i in doc["selected"][s]) for s in doc["selected"]}
    click.echo(f"{doc['line']}: images whose selection is not their label, per sigma: {wrong}; wrote {out}")


if __name__ == "__main__":
    main()

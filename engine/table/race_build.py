"""The race plan's runs (engine/table/race.py decides, this runs): each sigma's first run on every
image, then the extensions the race asks for, one line at a time, until every cell is within the
tolerance of `--plan all`'s.

DIR/runs/LINE_sSIGMA.tsv          every image, the sigma's first radii (0 and the largest r <= 2.5 sigma)
DIR/runs/LINE_sSIGMA_atR.tsv      images extended until radius R is decided: going on from their rows'
                                  states (FILE.tsv.states.jsonl: engine/runs/row_states.py) to the first
                                  look where `all` would certify R, never could, or would stop
DIR/runs/LINE_sSIGMA_toR.tsv      images extended to settle every radius up to R, from their first
                                  sample (rows without a state: tables written before states existed)
DIR/race.json                     the extensions so far, and each cell's bound

An image's row is its latest: the one with the most samples (each extension goes on from the row
before it, or reruns it whole), the later run on a tie. Every decision follows from the rows, which
follow from the noise seeds, so a rerun of the command takes the same decisions and the result files
resume.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from diffsmooth.engine.certify.sequential import SequentialRule, SequentialState, continues
from diffsmooth.engine.runs.results import read_rows
from diffsmooth.engine.runs.row_states import read_states, state_of, states_path
from diffsmooth.engine.table.race import (
    CellBound,
    Extension,
    Rows,
    cell_bounds,
    initial_radii,
    next_extension,
    prefix,
    settled_prefix,
    tolerance_images,
)
from diffsmooth.engine.table.spec import LineSpec, TableSpec

Contender = Tuple[float, str]           # (sigma, configuration name)


def extension_kind(radius: float) -> str:
    """The phase kind (and file suffix) of an extension settling the radii up to `radius`."""
    return f"to{radius:g}"


def decide_kind(radius: float) -> str:
    """The phase kind (and file suffix) of an extension deciding `radius`."""
    return f"at{radius:g}"


def decides(kind: str) -> bool:
    """The phase kind is an extension deciding its radius (decide_kind)."""
    return kind.startswith("at")


@dataclass
class LineRace:
    """One line's race: its sigma runs' rows, assembled per contender, and the decisions."""

    spec: TableSpec
    line: LineSpec
    indices: Sequence[int]                           # the table's images, in order
    rules: Dict[float, SequentialRule]               # per sigma: the rule settling every radius (`all`)
    path: Callable[[LineSpec, float, str], Path]     # (line, sigma, kind) -> the run's result file or folder

    def files(self, sigma: float) -> List[Tuple[int, int, Path]]:
        """(settled prefix, decided radius index, path) of the sigma's runs that exist, in the order an
        image can pass through them: the first run, the extensions settling radii, those deciding one."""
        radii = self.spec.radii
        out = [(settled_prefix(radii, initial_radii(radii, sigma)), -1, self.path(self.line, sigma, "main"))]
        out += [(k, -1, self.path(self.line, sigma, extension_kind(r))) for k, r in enumerate(radii)]
        out += [(-1, k, self.path(self.line, sigma, decide_kind(r))) for k, r in enumerate(radii)]
        return [entry for entry in out if entry[2].exists()]

    def latest(self, sigma: float) -> Dict[str, Dict[int, Tuple[int, int, Path, dict]]]:
        """{configuration: {image: (settled prefix, decided radius, run's path, row)}}: each image's latest
        row, the one with the most samples (the later run on a tie)."""
        out: Dict[str, Dict[int, Tuple[int, int, Path, dict]]] = {}
        rank: Dict[Tuple[str, int], Tuple[int, int]] = {}
        for order, (k, decided, path) in enumerate(self.files(sigma)):
            for config, rows in _rows_of(path).items():
                per = out.setdefault(config, {})
                for row in rows:
                    i, key = int(row["idx"]), (int(row["samples"]), order)
                    if (config, i) not in rank or rank[(config, i)] <= key:
                        rank[(config, i)] = key
                        per[i] = (k, decided, path, row)
        return out

    def contenders(self, latest=None) -> Dict[Contender, Rows]:
        """Every (sigma, configuration) with a row for each image of the table (`latest`: each sigma's
        `latest()`, when the caller has read it already)."""
        latest = latest or {sigma: self.latest(sigma) for sigma in self.spec.sigmas}
        out = {}
        for sigma in self.spec.sigmas:
            for config, per in sorted(latest[sigma].items()):
                missing = [i for i in self.indices if i not in per]
                if missing:
                    raise RuntimeError(f"{self.line.name} sigma {sigma:g}: no row for image {missing[0]} after the first run")
                chosen = [per[i] for i in self.indices]
                out[(sigma, config)] = Rows.from_rows([row for *_, row in chosen], self.spec.n0,
                                                      [k for k, *_ in chosen], [d for _, d, *_ in chosen])
        return out

    def rows_by_sigma(self) -> Dict[float, Dict[str, List[dict]]]:
        """The rows the table reports: per sigma and configuration, each image's latest row."""
        out = {}
        for sigma in self.spec.sigmas:
            latest = self.latest(sigma)
            if latest:
                out[sigma] = {config: [per[i][-1] for i in self.indices if i in per] for config, per in sorted(latest.items())}
        return out

    def next(self, tolerance: int,
             history: Sequence[Tuple[Tuple[float, str], int]] = ()) -> Tuple[Extension, Dict[str, Tuple[int, List[int]]]]:
        """The next extension (None when done) and its images by run kind: {kind: (radius index, images)}.
        An image whose rows kept their states goes on from them until the extension's radius is decided
        (decide_kind); one without (rows written before states existed) reruns from its first sample,
        settling the radii up to the larger of the extension's and its current run's largest (a rerun
        never settles less than the row it replaces)."""
        latest = {sigma: self.latest(sigma) for sigma in self.spec.sigmas}     # every file read once per decision
        rows = self.contenders(latest)
        order = sorted(rows)
        ext = next_extension({c: self.rules[c[0]] for c in order}, rows, tolerance, order, history)
        if ext is None:
            return None, {}
        sigma, radii = ext.contender[0], self.spec.radii
        images = [self.indices[position] for position in ext.images]
        going_on = set(self.starts(sigma, prefix(radii, ext.k), images, decide=True, latest=latest[sigma]))
        groups: Dict[str, Tuple[int, List[int]]] = {}
        if going_on:
            groups[decide_kind(radii[ext.k])] = (ext.k, [i for i in images if i in going_on])
        tops = self._tops(sigma, latest[sigma])
        for image in images:
            if image not in going_on:
                target = max(ext.k, tops[image])
                groups.setdefault(extension_kind(radii[target]), (target, []))[1].append(image)
        return ext, groups

    def _tops(self, sigma: float, latest: Dict[str, Dict[int, Tuple[int, int, Path, dict]]]) -> Dict[int, int]:
        """Each image's current run's largest settled radius, as an index into the table's radii."""
        radii = list(self.spec.radii)
        first = radii.index(max(initial_radii(radii, sigma)))
        out: Dict[int, int] = {}
        for config in latest.values():
            for image, (k, *_) in config.items():
                out[image] = max(out.get(image, first), k if k >= 0 else first)
        return out

    def starts(self, sigma: float, radii: Sequence[float], images: Sequence[int], decide: bool = False,
               latest=None) -> Dict[int, Dict[str, SequentialState]]:
        """{image: {configuration: state}}: where each image's latest rows stopped, for the images whose
        every row kept a state that a run settling `radii` (or, with `decide`, deciding the largest of
        them) can go on from (engine/runs/row_states.py). `latest`: the sigma's `latest()`, if read."""
        rule = dataclasses.replace(self.rules[sigma], radii=tuple(radii), decide_largest=decide)
        kept: Dict[Path, Dict[int, SequentialState]] = {}
        out: Dict[int, Dict[str, SequentialState]] = {}
        lacking = set()
        for config, per in (latest or self.latest(sigma)).items():
            for image in set(images) & set(per):
                *_, run, row = per[image]
                path = run if config == "" else run / f"{config}.tsv"
                if path not in kept:
                    kept[path] = read_states(states_path(path))
                state = state_of(row, kept[path], self.spec.n0)
                if state is not None and continues(rule, state):
                    out.setdefault(image, {})[config] = state
                else:
                    lacking.add(image)
        return {image: named for image, named in out.items() if image not in lacking}

    def bounds(self) -> List[CellBound]:
        rows = self.contenders()
        return cell_bounds({c: self.rules[c[0]] for c in rows}, rows)


def _rows_of(path: Path) -> Dict[str, List[dict]]:
    """{configuration: rows} of a run: one file, or a sweep folder of files (one per configuration)."""
    if path.is_dir():
        return {p.stem: read_rows(p, torn_tail="ignore") for p in sorted(path.glob("*.tsv"))}
    return {"": read_rows(path, torn_tail="ignore")}


def run_race(race: LineRace, tolerance_points: float, run_extension: Callable[[float, Tuple[float, ...], List[int], str], None],
             log: Callable[[str], None], record: Path, write: bool = True,
             recorded: Optional[dict] = None) -> List[CellBound]:
    """Extensions until every cell is within the tolerance; `run_extension(sigma, radii, images, kind)`
    runs one. Each decision is written to `record` (race.json) before it runs, and a rerun replays the
    recorded ones first: an interrupted table ends with the rows an uninterrupted one has (deciding
    afresh from a half-finished extension's rows could choose other images). Returns the cells' bounds.
    `write`: this process writes `record` (under torchrun every rank decides alike; rank 0 writes).
    `recorded`: `record` as read before any line's race began (one dict for every line of a table, so under
    torchrun no rank reads the file while rank 0 writes it); read here when not given."""
    tolerance = tolerance_images(tolerance_points, len(race.indices))
    done = recorded if recorded is not None else (json.loads(record.read_text()) if record.exists() else {})
    steps = list(done.get(race.line.name, {}).get("extensions", []))
    for step in steps:              # a resumed table first finishes the extensions it had decided, in order
        radii = prefix(race.spec.radii, list(race.spec.radii).index(step["radii_to"]))
        run_extension(step["sigma"], radii, step["images"], step.get("kind", extension_kind(radii[-1])))
    while True:
        radii_list = list(race.spec.radii)
        decisions = {step.get("decision", n): step for n, step in enumerate(steps)}     # one per decision
        history = [((step["sigma"], step["config"]), radii_list.index(step["radius"])) for step in decisions.values()]
        ext, groups = race.next(tolerance, history)
        if ext is None:
            break
        sigma, radius = ext.contender[0], race.spec.radii[ext.k]
        for kind, (target, images) in sorted(groups.items()):
            radii = prefix(race.spec.radii, target)
            until = "until it is decided" if decides(kind) else f"to the radii up to {radii[-1]:g}"
            log(f"table: race, {race.line.name}: sigma {sigma:g} extends {len(images)} undecided image(s) "
                f"at r = {radius:g} {until} ({ext.role})")
            steps.append({"sigma": sigma, "config": ext.contender[1], "radius": radius, "radii_to": radii[-1],
                          "kind": kind, "images": images, "decision": len(history)})
            done[race.line.name] = {"tolerance": tolerance_points, "extensions": steps}
            _write(record, done, write)
            run_extension(sigma, radii, images, kind)
    bounds = race.bounds()
    widest = max(bounds, key=lambda b: b.undecided_gap)
    log(f"table: race, {race.line.name}: done after {len(steps)} extension(s); every cell is at most "
        f"{100 * widest.undecided_gap / len(race.indices):.1f} points below --plan all's"
        + (f" (at r = {widest.radius:g})" if widest.undecided_gap else " (equal to it)"))
    done[race.line.name] = {"tolerance": tolerance_points, "extensions": steps,
                            "bounds": [{"radius": b.radius, "certified": b.certified, "undecided_gap": b.undecided_gap}
                                       for b in bounds]}
    _write(record, done, write)
    return bounds


def _write(record: Path, done: dict, write: bool) -> None:
    """race.json, replaced whole (a reader never sees half a file)."""
    if write:
        tmp = record.with_name(record.name + ".tmp")
        tmp.write_text(json.dumps(done, indent=1, allow_nan=False) + "\n")
        os.replace(tmp, record)

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
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from diffsmooth.engine.certify.sequential import SequentialRule, SequentialState, continues
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.runs.results import read_rows
from diffsmooth.engine.runs.row_states import read_states, state_of, states_path
from diffsmooth.engine.table.race import (
    CellBound,
    Extension,
    Rows,
    cell_bounds,
    extension_bound,
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


class Latest(NamedTuple):
    """An image's latest row and what the rows that stopped at its look prove (LineRace.latest)."""

    prefix_to: int              # the largest radius index a run stopping here settled with every smaller one (-1: none)
    decided: frozenset          # radius indices an extension stopping here decided
    path: Path                  # the latest row's run (a file, or a sweep's folder)
    row: dict
    upper: float                # the running upper bound of the rows' states (1: no state kept)
    decided_by: int = -1        # the radius index the latest row's own run decided (-1: none)


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

    def latest(self, sigma: float) -> Dict[str, Dict[int, "Latest"]]:
        """{configuration: {image: Latest}}: each image's latest row, the one with the most samples (the later
        run on a tie), with what every row that stopped at the same look proves (the same samples and votes
        of the same path: the same state): the largest prefix settled, the radii decided, the running upper
        bound of the rows' states (1 where none kept one)."""
        found: Dict[Tuple[str, int], List[Tuple[Tuple[int, int], int, int, Path, dict]]] = {}
        kept: Dict[Path, Dict[int, SequentialState]] = {}
        for order, (k, decided, path) in enumerate(self.files(sigma)):
            for config, rows in _rows_of(path).items():
                for row in rows:
                    i = int(row["idx"])
                    found.setdefault((config, i), []).append(((int(row["samples"]), order), k, decided, path, row))
        out: Dict[str, Dict[int, Latest]] = {}
        for (config, i), entries in found.items():
            _, k, decided, path, row = max(entries, key=lambda entry: entry[0])
            same = [e for e in entries if e[4]["samples"] == row["samples"] and e[4].get("top_votes") == row.get("top_votes")]
            upper = 1.0
            for *_, run, other in same:
                file = run if config == "" else run / f"{config}.tsv"
                if file not in kept:
                    kept[file] = read_states(states_path(file))
                state = state_of(other, kept[file], self.spec.n0)
                if state is not None:
                    upper = min(upper, float(state.upper))
            out.setdefault(config, {})[i] = Latest(max(e[1] for e in same), frozenset(e[2] for e in same if e[2] >= 0),
                                                   path, row, upper, decided)
        return out

    def contenders(self, latest=None) -> Dict[Contender, Rows]:
        """Every (sigma, configuration) with a row for each image of the table (`latest`: each sigma's
        `latest()`, when the caller has read it already)."""
        latest = latest or {sigma: self.latest(sigma) for sigma in self.spec.sigmas}
        radii = len(self.spec.radii)
        out = {}
        for sigma in self.spec.sigmas:
            for config, per in sorted(latest[sigma].items()):
                missing = [i for i in self.indices if i not in per]
                if missing:
                    raise RuntimeError(f"{self.line.name} sigma {sigma:g}: no row for image {missing[0]} after the first run")
                chosen = [per[i] for i in self.indices]
                decided = np.zeros((len(chosen), radii), dtype=bool)
                for position, entry in enumerate(chosen):
                    decided[position, sorted(entry.decided)] = True
                out[(sigma, config)] = Rows.from_rows([entry.row for entry in chosen], self.spec.n0,
                                                      [entry.prefix_to for entry in chosen],
                                                      [entry.decided_by for entry in chosen],
                                                      [entry.upper for entry in chosen], decided)
        return out

    def rows_by_sigma(self) -> Dict[float, Dict[str, List[dict]]]:
        """The rows the table reports: per sigma and configuration, each image's latest row."""
        out = {}
        for sigma in self.spec.sigmas:
            latest = self.latest(sigma)
            if latest:
                out[sigma] = {config: [per[i].row for i in self.indices if i in per] for config, per in sorted(latest.items())}
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

    def _tops(self, sigma: float, latest: Dict[str, Dict[int, "Latest"]]) -> Dict[int, int]:
        """Each image's current run's largest settled radius, as an index into the table's radii."""
        radii = list(self.spec.radii)
        first = radii.index(max(initial_radii(radii, sigma)))
        out: Dict[int, int] = {}
        for config in latest.values():
            for image, entry in config.items():
                out[image] = max(out.get(image, first), entry.prefix_to if entry.prefix_to >= 0 else first)
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
                run, row = per[image].path, per[image].row
                path = run if config == "" else run / f"{config}.tsv"
                if path not in kept:
                    kept[path] = read_states(states_path(path))
                state = state_of(row, kept[path], self.spec.n0)
                if state is not None and continues(rule, state):
                    out.setdefault(image, {})[config] = state
                else:
                    lacking.add(image)
        return {image: named for image, named in out.items() if image not in lacking}

    def held(self, sigma: float, config: str, kind: str, images: Sequence[int]) -> List[int]:
        """The images whose rows the run `kind` of the sigma already holds (for this configuration): a runner
        skips them, so an extension asking for them again would write no row."""
        path = self.path(self.line, sigma, kind)
        if not path.exists():
            return []
        rows = _rows_of(path)
        there = {int(row["idx"]) for row in rows.get(config, [])} if config in rows else set()
        return [i for i in images if i in there]

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
    replayed = len({step.get("decision", n) for n, step in enumerate(steps)})
    bound = extension_bound(len(race.indices), len(race.contenders()), len(race.spec.radii))
    while True:
        radii_list = list(race.spec.radii)
        decisions = {step.get("decision", n): step for n, step in enumerate(steps)}     # one per decision
        history = [((step["sigma"], step["config"]), radii_list.index(step["radius"])) for step in decisions.values()]
        ext, groups = race.next(tolerance, history)
        if ext is None:
            break
        sigma, radius = ext.contender[0], race.spec.radii[ext.k]
        _refuse_a_step_that_decides_nothing(race, ext, groups, len(history) - replayed, bound)
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


def _refuse_a_step_that_decides_nothing(race: LineRace, ext: Extension, groups: Dict[str, Tuple[int, List[int]]],
                                        new_steps: int, bound: int) -> None:
    """Defence in depth (the race cannot loop, docs/table.md): a step asking a run for images it already holds
    (it would write no row, and the race would ask again), or a line's race past extension_bound, stops the
    table with one line; every row written so far stays on disk and race.json keeps the steps that ran."""
    sigma, config, radius = ext.contender[0], ext.contender[1], race.spec.radii[ext.k]
    where = f"table: race, {race.line.name}, sigma {sigma:g}{f' ({config})' if config else ''}, r = {radius:g}"
    for kind, (_, images) in sorted(groups.items()):
        held = race.held(sigma, config, kind, images)
        if held:
            raise UserError(f"{where}: the race asked again for image(s) {_listed(held)} that run {kind} already "
                            f"holds (it would write no row and never end); every row so far is kept: please report it")
    if new_steps >= bound:
        raise UserError(f"{where}: the race asked for more than {bound} extensions (images x contenders x radii, each "
                        f"deciding one at least), the last for image(s) {_listed([race.indices[i] for i in ext.images])}; "
                        f"every row so far is kept: please report it")


def _listed(images: Sequence[int], most: int = 8) -> str:
    shown = ", ".join(str(i) for i in list(images)[:most])
    return shown + (f" and {len(images) - most} more" if len(images) > most else "")


def _write(record: Path, done: dict, write: bool) -> None:
    """race.json, replaced whole (a reader never sees half a file)."""
    if write:
        tmp = record.with_name(record.name + ".tmp")
        tmp.write_text(json.dumps(done, indent=1, allow_nan=False) + "\n")
        os.replace(tmp, record)

"""The race's decisions replayed on the stored race tables (bench/results/): before each recorded
extension, the folder as it stood then (the first runs and the rows of the earlier extensions, with their
states) must lead today's race to the same extension, and after the last one to none. So a change to how
the race reads its rows is shown to move no stored table (the same steps: the same rows, cells and samples),
or the first step it moves is named."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from diffsmooth.engine.runs.row_states import states_path
from diffsmooth.engine.table.build import TableBuilder, TablePlanning
from diffsmooth.engine.table.phases import Phase
from diffsmooth.engine.table.race import tolerance_images
from diffsmooth.engine.table.race_build import LineRace, extension_kind
from diffsmooth.engine.table.spec import LineSpec, TableSpec

RESULTS = Path(__file__).resolve().parents[3] / "bench" / "results"
STORED = sorted(p.parent.relative_to(RESULTS).as_posix() for p in RESULTS.glob("**/race.json")
                if (p.parent / "table.json").is_file() and (p.parent / "runs").is_dir())
# written by earlier race rules (before an extension decided one radius, before the wrong-class stop):
# today's race decides otherwise on their rows from an early step on, as the race did before the running
# upper bound was read (each step's decision compared, 2026-11-28: the same on all 285 steps of the 29 lines)
EARLIER_RULES = {"table_continuation_cpu/diffsmooth/rerun", "table_continuation_cpu/diffsmooth/went_on",
                 "table_continuation_cpu/rs/rerun", "table_continuation_cpu/rs/went_on",
                 "table_demo_diffsmooth_100x10000/race", "table_demo_rs_500x10000/race",
                 "table_demo_rs_500x10000/race_t0", "wrong_class_stop/measured_ds_100/before"}


def spec_of(recorded: dict) -> TableSpec:
    """The TableSpec a table folder recorded (table.json's `spec`, TableSpec.as_dict)."""
    per_sigma = lambda d: {float(k): tuple(v) for k, v in d.items()}     # noqa: E731
    lines = tuple(LineSpec(**dict(line, classifier=per_sigma(line["classifier"]), local_sigma=per_sigma(line["local_sigma"]),
                                  m=per_sigma(line["m"]))) for line in recorded["lines"])
    return TableSpec(**dict(recorded, sigmas=tuple(recorded["sigmas"]), radii=tuple(recorded["radii"]), lines=lines))


def _split_rows(lines, wanted):
    """The header and the data lines of a result file whose idx is in `wanted` (consumed as they are taken)."""
    header, kept = lines[0], []
    for line in lines[1:]:
        idx = int(line.split("\t", 1)[0])
        if wanted.get(idx, 0) > 0:
            wanted[idx] -= 1
            kept.append(line)
    return header, kept


class Replay:
    """A stored race folder, rebuilt up to any of its recorded decisions."""

    def __init__(self, folder: Path, scratch: Path):
        self.folder, self.scratch = folder, scratch
        table = json.loads((folder / "table.json").read_text())
        self.spec, self.tolerance = spec_of(table["spec"]), table["tolerance"]
        assert self.spec.fingerprint() == table["spec_fingerprint"], "the spec was not read back as recorded"
        self.recorded = json.loads((folder / "race.json").read_text())
        self.builder = TableBuilder(self.spec, scratch, TablePlanning("race", tolerance=self.tolerance),
                                    log=lambda line: None, progress=False)
        self.indices = self.builder.selection()

    def steps(self, line: LineSpec):
        return self.recorded[line.name]["extensions"]

    def race(self, line: LineSpec, decisions: int) -> LineRace:
        """The line's race over a copy of the folder's runs holding the first runs and the rows (and states) of
        the extensions of the first `decisions` decisions."""
        runs = self.scratch / "runs"
        shutil.rmtree(runs, ignore_errors=True)
        runs.mkdir(parents=True)
        steps = self.steps(line)
        taken = {}                                      # (sigma, kind): {image: rows taken}
        for number, step in enumerate(steps):
            if step.get("decision", number) >= decisions:
                break
            per = taken.setdefault((step["sigma"], _kind(step)), {})
            for image in step["images"]:
                per[image] = 1                          # an image asked again wrote no second row
        for sigma in self.spec.sigmas:
            self._copy(line, sigma, "main", None)
            for (s, kind), images in taken.items():
                if s == sigma:
                    self._copy(line, sigma, kind, images)
        rules = {sigma: self.builder.request(Phase(line, sigma, (), self.spec.radii, runs / "rule.tsv", "")).sequential
                 for sigma in self.spec.sigmas}
        return LineRace(self.spec, line, self.indices, rules, self.builder.phase_path)

    def _copy(self, line, sigma, kind, images):
        source = self.builder.phase_path(line, sigma, kind)
        source = self.folder / source.relative_to(self.scratch)
        target = self.builder.phase_path(line, sigma, kind)
        files = sorted(source.glob("*.tsv")) if source.is_dir() else [source]
        for file in files:
            out = target / file.name if source.is_dir() else target
            out.parent.mkdir(parents=True, exist_ok=True)
            lines = file.read_text().splitlines(keepends=True)
            if images is None:
                out.write_text("".join(lines))
                kept_rows = {}
                for line_ in lines[1:]:
                    idx = int(line_.split("\t", 1)[0])
                    kept_rows[idx] = kept_rows.get(idx, 0) + 1
            else:
                header, kept = _split_rows(lines, dict(images))
                out.write_text(header + "".join(kept))
                kept_rows = {int(k.split("\t", 1)[0]): 1 for k in kept}
            states = states_path(file)
            if states.is_file():                        # the states of the rows kept, in order
                wanted, out_states = dict(kept_rows), []
                for state in states.read_text().splitlines(keepends=True):
                    try:
                        idx = int(json.loads(state)["idx"])
                    except (ValueError, KeyError):
                        continue
                    if wanted.get(idx, 0) > 0:
                        wanted[idx] -= 1
                        out_states.append(state)
                states_path(out).write_text("".join(out_states))


def _kind(step: dict) -> str:
    """The step's run kind (tables written before decide-one-radius extensions settled every radius up to it)."""
    return step.get("kind", extension_kind(step["radii_to"]))


def _as_recorded(step: dict):
    return step["sigma"], step["config"], step["radius"], _kind(step), sorted(step["images"])


@pytest.mark.parametrize("stored", [s for s in STORED if s not in EARLIER_RULES])
def test_todays_race_takes_the_stored_tables_recorded_steps_and_ends_where_they_ended(stored, tmp_path):
    replay = Replay(RESULTS / stored, tmp_path / "replay")
    compared = 0
    for line in replay.spec.lines:
        steps = replay.steps(line)
        decisions = sorted({step.get("decision", n) for n, step in enumerate(steps)})
        radii = list(replay.spec.radii)
        for decision in decisions + [len(decisions)]:
            race = replay.race(line, decision)
            earlier = {step.get("decision", n): step for n, step in enumerate(steps) if step.get("decision", n) < decision}
            history = [((s["sigma"], s["config"]), radii.index(s["radius"])) for s in earlier.values()]
            ext, groups = race.next(_tolerance(replay), history)
            recorded = [_as_recorded(s) for n, s in enumerate(steps) if s.get("decision", n) == decision]
            if decision == len(decisions):
                assert ext is None, f"{stored}, {line.name}: today's race goes on after the last recorded step"
                continue
            assert ext is not None, f"{stored}, {line.name}: today's race ends before recorded decision {decision}"
            # the run kind follows from which rows kept states (and older tables settled every radius up to the
            # one asked): the decision is the contender, the radius and the images
            today = (ext.contender[0], ext.contender[1], replay.spec.radii[ext.k],
                     sorted(i for _, images in groups.values() for i in images))
            assert today == (*recorded[0][:3], sorted(i for *_, images in recorded for i in images)), \
                f"{stored}, {line.name}: decision {decision} moved"
            compared += 1
    assert compared > 0


def _tolerance(replay: Replay) -> int:
    return tolerance_images(replay.tolerance, len(replay.indices))


def test_the_stored_race_tables_are_found():
    assert EARLIER_RULES < set(STORED)
    assert {"wrong_class_stop/measured_ds_100/after", "h200-2026-11-27/fixes/table/0-cpu-fp32",
            "table_demo_dds_ddpm/table"} <= set(STORED) - EARLIER_RULES


def test_the_first_replayed_step_reads_a_folder_as_it_stood(tmp_path):
    """The replay is not vacuous: dropping a recorded step's rows makes today's race ask for that step again."""
    replay = Replay(RESULTS / "table_demo_rs_500x10000/race_t0", tmp_path / "replay")
    line = replay.spec.lines[0]
    first = replay.steps(line)[0]
    ext, groups = replay.race(line, 0).next(_tolerance(replay), [])
    assert (ext.contender[0], replay.spec.radii[ext.k]) == (first["sigma"], first["radius"])
    assert sorted(groups[_kind(first)][1]) == sorted(first["images"])

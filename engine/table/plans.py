"""The four plans of a table, one class each (as diffusers has one class per scheduler): which runs it
makes and in what order, what it predicts they cost, and what it records of itself in table.json.

race  (default) a pilot of each sigma's first run, the first runs on every image, then each line's
      extensions until every cell is within the tolerance of `all`'s (engine/table/race.py)
auto  a pilot settles every radius for every sigma; the other images settle the radii each sigma can
      still win (engine/table/planning.py)
all   every sigma settles every radius with the sequential rule
fixed fixed-n CERTIFY at n = n-max for every sigma (the paper's way)

`table_plan` is the one place a plan's name picks its class; each plan takes only the settings it
reads. A plan runs phases through the table's PhaseRunner and hands back an Outcome; the builder writes the
folder's outputs from it.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from diffsmooth.engine.table.cost import RunCost, Sampling, predict_race, predict_run
from diffsmooth.engine.table.phases import Phase, PhaseResult
from diffsmooth.engine.table.plan_table import PlanTable
from diffsmooth.engine.table.planning import TablePlan, pilot_indices, plan_from_pilot, plan_without_pilot
from diffsmooth.engine.table.race import CellBound, initial_radii
from diffsmooth.engine.table.race_build import LineRace, decides, run_race
from diffsmooth.engine.table.report import LineRows, certified

Settles = Callable[[float, float], bool]


@dataclass
class Outcome:
    """What a plan's runs gave: the rows the table reports and what they cost."""

    plan: TablePlan
    rows_by_line: Dict[str, LineRows]
    settles: Settles                        # settles(sigma, r): the runs whose rows count at r
    pilot_samples: int
    main_samples: int
    costs: dict
    bounds: Optional[Dict[str, List[CellBound]]] = None     # race: the most each cell can be below `all`'s


class Plan:
    """A plan: `execute` runs it on the table it sees (engine/table/plan_table.py's PlanTable: the spec, the phases
    it runs, the few records it keeps, the log)."""

    name = ""
    settings: Tuple[str, ...] = ()          # the table settings it reads (--pilot, --margin, --reach, --tolerance)
    reports_acr = False                     # the average certified radius is defined for fixed-n rows only
    keeps_states = False                    # sequential rows keep their states for later runs to go on from

    def __init__(self, **settings):
        if set(settings) != set(self.settings):
            raise TypeError(f"plan {self.name} takes {', '.join(self.settings) or 'no settings'}, got {sorted(settings)}")
        for key, value in settings.items():
            setattr(self, key, value)

    def identity(self) -> dict:
        """This plan's settings as table.json records them (a rerun with others is refused)."""
        return {"plan": self.name, "pilot": None, "margin": None, "reach": None}

    def execute(self, table: PlanTable, indices: Sequence[int], dry_run: bool) -> Optional[Outcome]:
        raise NotImplementedError

    def _fix(self, table: PlanTable, plan: TablePlan) -> TablePlan:
        table.fix_plan(plan)
        for text in self.lines(plan):
            table.log(text)
        return plan

    def lines(self, plan: TablePlan) -> List[str]:
        """The plan, printed."""
        out = [f"plan {self.name}: {len(plan.pilot)} pilot images, {len(plan.main)} main images"]
        for sigma, radii in plan.radii.items():
            out.append(f"  sigma {sigma}: settles radii {', '.join(f'{r:g}' for r in radii) or 'none (no main run)'}")
        return out

    def how(self, n_max: int) -> str:
        """How the table's runs certify, for table.md's caption."""
        raise NotImplementedError

    def how_by_config(self, n_max: int) -> str:
        """The same for table_by_config.md, where a row is one configuration at one sigma."""
        return self.how(n_max)

    def no_acr(self) -> Optional[str]:
        """Why the tables have no ACR column (None: they have one)."""
        if self.reports_acr:
            return None
        return (f"No ACR: the average certified radius needs every image's certified radius, which only fixed-n "
                f"CERTIFY (--plan fixed) gives; with --plan {self.name} a row's radius is a lower bound at its stopping "
                f"look, settled only at the table's radii.")


class AllPlan(Plan):
    """Every sigma settles every radius on every image with the sequential rule; no pilot."""

    name = "all"

    def how(self, n_max):
        return f"sequential CERTIFY (n-max {n_max:,}), every sigma settling every radius"

    def main_radii(self, plan: TablePlan, sigma: float) -> Optional[List[float]]:
        return plan.radii_for(sigma)

    def execute(self, table, indices, dry_run):
        spec = table.spec
        plan = self._fix(table, plan_without_pilot(self.name, indices, spec.sigmas, spec.radii))
        return self._main(table, plan, {}, dry_run)

    def _main(self, table: PlanTable, plan: TablePlan, pilot: Dict[tuple, PhaseResult], dry_run: bool) -> Optional[Outcome]:
        """Predict, then run the main phase (in reverse, so its first run keeps the last pilot run's models)."""
        spec = table.spec
        costs = predict_main(table, self, plan, pilot)
        if dry_run:
            return None
        pairs = [(line, sigma) for line in spec.lines for sigma in spec.sigmas]
        main = table.run([Phase(line, sigma, plan.main, self.main_radii(plan, sigma),
                                       table.phase_path(line, sigma, "main"), "main")
                                 for line, sigma in reversed(pairs) if plan.radii_for(sigma) and plan.main], costs)
        rows_by_line = {line.name: _combined(line.name, spec.sigmas, pilot, main) for line in spec.lines}
        return Outcome(plan, rows_by_line, lambda sigma, r: r in plan.radii_for(sigma), _samples(pilot), _samples(main),
                       costs)

    def run_cost(self, spec, line, sigma, plan: TablePlan, pilot: Optional[PhaseResult]) -> dict:
        """A main run's predicted cost (cost.json): unknown without a pilot."""
        return asdict_cost(RunCost(line.name, sigma, len(plan.main), float("nan"), float("nan")))


class FixedPlan(AllPlan):
    """Fixed-n CERTIFY at n = n-max for every sigma on every image (the paper's way)."""

    name = "fixed"
    reports_acr = True

    def how(self, n_max):
        return f"fixed-n CERTIFY at n = {n_max:,}"

    def main_radii(self, plan, sigma):
        return None

    def run_cost(self, spec, line, sigma, plan, pilot):
        samples = len(plan.main) * (spec.n0 + spec.n_max)
        return asdict_cost(RunCost(line.name, sigma, len(plan.main), samples, float("nan")))


class AutoPlan(AllPlan):
    """A pilot of `pilot` images settles every radius for every sigma; each radius then goes to the sigmas
    that can still win it (planning.assign_radii: `margin`, `reach`)."""

    name = "auto"
    settings = ("pilot", "margin", "reach")

    def how(self, n_max):
        return f"sequential CERTIFY (n-max {n_max:,}), each radius settled by the sigma runs a pilot assigned it"

    def how_by_config(self, n_max):
        return (f"sequential CERTIFY (n-max {n_max:,}); - : a radius the pilot did not assign to this sigma, so its run "
                f"did not settle it")

    def identity(self):
        return dict(super().identity(), pilot=self.pilot, margin=self.margin, reach=self.reach)

    def execute(self, table, indices, dry_run):
        spec = table.spec
        pilot = pilot_indices(indices, self.pilot)
        table.log(f"table: pilot of {len(pilot)} of {len(indices)} images settles every radius for every sigma")
        results = table.run([Phase(line, sigma, pilot, spec.radii, table.phase_path(line, sigma, "pilot"), "pilot")
                             for line in spec.lines for sigma in spec.sigmas])
        counts_by_line = {line.name: {sigma: {r: max(certified(rows, r) for rows in results[(line.name, sigma)].rows.values())
                                              for r in spec.radii} for sigma in spec.sigmas}
                          for line in spec.lines}
        plan = self._fix(table, plan_from_pilot(indices, pilot, counts_by_line, self.margin, self.reach))
        return self._main(table, plan, results, dry_run)

    def run_cost(self, spec, line, sigma, plan, pilot):
        if pilot is None or not (pilot.probe_rate or pilot.seconds):
            return super().run_cost(spec, line, sigma, plan, pilot)
        rate = pilot.probe_rate or pilot.samples / pilot.seconds
        cost = asdict_cost(predict_run(line.name, sigma, list(pilot.rows.values()), plan.radii_for(sigma), len(plan.main),
                                       Sampling(spec.n0, spec.alpha, spec.n_max), rate, spec.radii))
        cost.update(samples_per_second=rate, rate_from="probe" if pilot.probe_rate else "pilot",
                    pilot_samples_per_second=pilot.samples / pilot.seconds if pilot.seconds else None)
        return cost


class RacePlan(Plan):
    """The sigmas race for each radius (engine/table/race.py): a pilot of each sigma's first run (for the
    prediction), the first runs on every image, then each line's extensions until its cells are within
    `tolerance` points of `all`'s. Extensions go on from the rows' states."""

    name = "race"
    settings = ("pilot", "tolerance")
    keeps_states = True

    def identity(self):
        return dict(super().identity(), pilot=self.pilot, tolerance=self.tolerance)

    def lines(self, plan):
        out = [f"plan race: {len(plan.main)} images ({len(plan.pilot)} first as the pilot); every cell within "
               f"{plan.tolerance:g} points of --plan all's"]
        return out + [f"  sigma {sigma}: first run settles radii {', '.join(f'{r:g}' for r in radii)}; extensions "
                      "as the race asks" for sigma, radii in plan.radii.items()]

    def how(self, n_max):
        return (f"sequential CERTIFY (n-max {n_max:,}), the sigmas racing for each radius; each cell is at most "
                f"its stated bound below what every sigma settling every radius would give")

    def how_by_config(self, n_max):
        return (f"sequential CERTIFY (n-max {n_max:,}), the sigmas racing for each radius; a count is what the "
                f"configuration's rows certified, a lower bound on --plan all's: only each line's best per radius "
                f"is within the tolerance (table.md), the others were not extended")

    def execute(self, table, indices, dry_run):
        spec = table.spec
        pilot = pilot_indices(indices, self.pilot)
        first = {sigma: initial_radii(spec.radii, sigma) for sigma in spec.sigmas}
        plan = self._fix(table, TablePlan("race", pilot=tuple(pilot), main=tuple(indices),
                                          radii={f"{s:g}": list(first[s]) for s in spec.sigmas}, margin=0.0,
                                          pilot_counts={}, reach=0.0, tolerance=self.tolerance))
        pairs = [(line, sigma) for line in spec.lines for sigma in spec.sigmas]
        # the pilot's runs are the first runs of its images, in the main files
        pilot_results = table.run([Phase(line, sigma, pilot, first[sigma], table.phase_path(line, sigma, "main"),
                                         "pilot") for line, sigma in pairs])
        costs = self.predict(table, pilot, len(indices), pilot_results)
        if dry_run:
            return None
        chosen = set(pilot)
        rest = [i for i in indices if i not in chosen]
        # reversed, so the first run keeps the last pilot run's models (one compile less)
        main = table.run([Phase(line, sigma, rest, first[sigma], table.phase_path(line, sigma, "main"), "first")
                          for line, sigma in reversed(pairs)], costs)
        rows_by_line, bounds, extensions = {}, {}, 0
        record = table.race_record
        # read once, before any line's race: under torchrun rank 0 reads them and every rank replays its decisions
        recorded = table.agreed(lambda: json.loads(record.read_text()) if record.exists() else {})
        for line in spec.lines:
            rules = {sigma: table.rule(line, sigma) for sigma in spec.sigmas}
            race = LineRace(spec, line, indices, rules, table.phase_path)

            def run_extension(sigma, radii, images, kind, line=line, race=race):
                nonlocal extensions
                phase = Phase(line, sigma, images, radii, table.phase_path(line, sigma, kind), kind,
                              race.starts(sigma, radii, images, decide=decides(kind)), decides(kind))
                extensions += table.step(phase, costs).samples
            bounds[line.name] = run_race(race, self.tolerance, run_extension, table.log, record,
                                         write=table.writer, recorded=recorded)
            rows_by_line[line.name] = race.rows_by_sigma()
        return Outcome(plan, rows_by_line, lambda sigma, r: True, _samples(pilot_results),
                       _samples(main) + extensions, costs, bounds)

    def predict(self, table: PlanTable, pilot: Sequence[int], images: int, pilot_results: Dict[tuple, PhaseResult]) -> dict:
        """The race's samples and seconds after the pilot, predicted from the pilot's rows (cost.json)."""
        held = table.prediction(self.name)
        if held is not None:
            return held
        spec, chosen = table.spec, set(pilot)
        runs: Dict[str, dict] = {}
        for line in spec.lines:
            pilot_rows = {sigma: [r for r in next(iter(pilot_results[(line.name, sigma)].rows.values()))
                                  if int(r["idx"]) in chosen] for sigma in spec.sigmas}
            samples = predict_race(pilot_rows, spec.radii, images, Sampling(spec.n0, spec.alpha, spec.n_max), self.tolerance)
            for sigma in spec.sigmas:
                result = pilot_results[(line.name, sigma)]
                rate = result.probe_rate or (result.samples / result.seconds if result.seconds else None)
                left = max(samples[sigma] - result.samples, 0.0)
                runs[f"{line.name} | sigma {sigma:g}"] = {
                    "line": line.name, "sigma": sigma, "images": images, "samples": left,
                    "seconds": left / rate if rate else None, "samples_per_second": rate,
                    "rate_from": "probe" if result.probe_rate else "pilot"}
        return record_prediction(table, self.name, runs, pilot_results, "the race predicted {samples} after the pilot")


PLAN_CLASSES = {plan.name: plan for plan in (RacePlan, AutoPlan, AllPlan, FixedPlan)}
PLAN_NAMES = tuple(PLAN_CLASSES)               # `--plan`'s choices: race, auto, all, fixed


def table_plan(name: str, **table_settings) -> Plan:
    """The plan called `name` (one of PLAN_NAMES), given the table's settings it reads (its `settings`)."""
    plan = PLAN_CLASSES[name]
    return plan(**{key: table_settings[key] for key in plan.settings})


def predict_main(table: PlanTable, plan_class: AllPlan, plan: TablePlan, pilot: Dict[tuple, PhaseResult]) -> dict:
    """Predicted samples and seconds of the main phase (each run's by the plan), printed and written to cost.json."""
    held = table.prediction(plan.mode)
    if held is not None:
        return held                         # predicted before this folder's main phase began
    spec = table.spec
    runs = {f"{line.name} | sigma {sigma:g}": plan_class.run_cost(spec, line, sigma, plan, pilot.get((line.name, sigma)))
            for line in spec.lines for sigma in spec.sigmas}
    return record_prediction(table, plan.mode, runs, pilot, "main phase predicted {samples}")


def record_prediction(table: PlanTable, mode: str, runs: Dict[str, dict], pilot: Dict[tuple, PhaseResult], what: str) -> dict:
    """cost.json from each run's prediction, and one line saying it (`what`: the phrase around {samples})."""
    total = {key: _total(c[key] for c in runs.values()) for key in ("samples", "seconds")}
    pilot_samples = _samples(pilot)
    costs = {"plan": mode, "runs": runs, "predicted": total, "pilot_samples": pilot_samples,
             "pilot_seconds": sum(r.seconds for r in pilot.values())}
    table.write_costs(costs)
    samples, seconds = total["samples"], total["seconds"]
    if samples is None:
        table.log("table: no cost prediction without a pilot (--plan all); summary.json will have the measured cost")
    else:
        when = f", {seconds / 60:.1f} min on this machine" if seconds is not None else " (no rate measured yet)"
        table.log(f"table: {what.format(samples=f'{samples:,.0f} samples')}{when} (pilot: {pilot_samples:,} samples)")
    return costs


def asdict_cost(cost: RunCost) -> dict:
    """A run's cost for cost.json: strict JSON, an unknown number is null."""
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in dataclasses.asdict(cost).items()}


def _total(values) -> Optional[float]:
    """The sum, or None when any part is unknown."""
    values = list(values)
    return None if any(v is None for v in values) else float(sum(values))


def _samples(results: Dict[tuple, PhaseResult]) -> int:
    return sum(r.samples for r in results.values())


def _combined(line: str, sigmas: Sequence[float], *results: Dict[tuple, PhaseResult]) -> LineRows:
    """A line's rows per sigma and configuration, the pilot's and the main phase's together."""
    per: LineRows = {}
    for sigma in sigmas:
        combined: Dict[str, List[dict]] = {}
        for phase_results in results:
            found = phase_results.get((line, sigma))
            if found is not None:
                for config, rows in found.rows.items():
                    combined.setdefault(config, []).extend(rows)
        if combined:
            per[sigma] = combined
    return per

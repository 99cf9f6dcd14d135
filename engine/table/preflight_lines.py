"""`table SPEC --check`'s preflight: every line at every sigma (each configuration of a sweep) through the
preflight of `diffsmooth preflight` (engine/preflight/) on a small sample, and for a spec with the paper's cells
each published row's r = 0 cell beside the best measured upper bound of its lines. Nothing is written."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

from diffsmooth.engine.preflight.findings import PreflightReport
from diffsmooth.engine.preflight.run import IMAGES, SAMPLES, preflight_request
from diffsmooth.engine.runs.request import RunRequest
from diffsmooth.engine.table.runner import TableInputs
from diffsmooth.engine.table.spec import LineSpec, TableSpec


@dataclass
class LinesPreflight:
    """Each run's report ((line, sigma, configuration) -> report) and the published rows' r = 0 findings."""

    reports: Dict[Tuple[str, float, str], PreflightReport] = field(default_factory=dict)
    published: List[str] = field(default_factory=list)          # one line per published row with an r = 0 cell
    gaps: List[str] = field(default_factory=list)               # those the sample says no run can close

    @property
    def warnings(self) -> List[str]:
        found = [f"{line}, sigma {sigma:g}{f' ({config})' if config else ''}: {w.line().removeprefix('warning: ')}"
                 for (line, sigma, config), report in self.reports.items() for w in report.warnings]
        return found + self.gaps


def configurations(spec: TableSpec, line: LineSpec, sigma: float) -> List[Tuple[str, dict]]:
    """(name, RunRequest options) of each configuration the line runs at `sigma`: one, or a sweep's each."""
    options = spec.request_options(line, sigma)
    classifiers = options.get("classifier") or ((),)
    found = []
    for classifier, local_sigma, m in itertools.product(classifiers, options["local_sigma"], options["m"]):
        one = dict(options, classifier=(classifier,) if classifier else (), local_sigma=(local_sigma,), m=(m,))
        if one.get("method_options"):       # a sweepable setting with several values: its first
            one["method_options"] = tuple((k, v[0] if isinstance(v, tuple) else v) for k, v in one["method_options"])
        swept = len(classifiers) * len(options["local_sigma"]) * len(options["m"]) > 1
        name = f"classifier {classifier}, sigma' {local_sigma:g}, m {m}" if swept else ""
        found.append((name, one))
    return found


def preflight_lines(spec: TableSpec, images: int = IMAGES, samples: int = SAMPLES,
                    log: Callable[[str], None] = lambda line: None, inputs: Optional[TableInputs] = None) -> LinesPreflight:
    """The preflight of every run of the table; `log` gets one summary line per run as it finishes; `inputs`: what
    the table has opened (None: opened here, once for every run)."""
    result = LinesPreflight()
    inputs = inputs if inputs is not None else TableInputs()
    for line in spec.lines:
        for sigma in spec.sigmas:
            for name, options in configurations(spec, line, sigma):
                request = RunRequest.parse("certify", out="(preflight: nothing is written)", **options)
                report = preflight_request(request, images=images, samples=samples, inputs=inputs.of(request))
                result.reports[(line.name, sigma, name)] = report
                m = report.measured
                if "r0_upper" not in m:                 # a sigma that drowns every image: nothing measured
                    log(f"preflight: {line.name}, sigma {sigma:g}: {len(report.warnings)} warning(s)")
                    continue
                weak = f", {len(report.inconclusive)} inconclusive" if report.inconclusive else ""
                log(f"preflight: {line.name}, sigma {sigma:g}{f' ({name})' if name else ''}: clean "
                    f"{100 * m['clean_accuracy']:.1f}%, certified accuracy at r = 0 at most {100 * m['r0_upper']:.1f}% "
                    f"(95% upper bound), {len(report.warnings)} warning(s){weak} ({report.seconds:.1f} s)")
    for row in spec.published:
        paper = dict(row.cells).get(0.0)
        if paper is None:
            continue
        runs = [(key, r.measured) for key, r in result.reports.items() if key[0] in row.lines and "r0_upper" in r.measured]
        if not runs:
            continue
        (line, sigma, _), best = max(runs, key=lambda item: item[1]["r0_upper"])
        high = best["r0_upper"]
        text = (f"{row.name}: the paper's r = 0 cell {paper:.1f}% beside at most {100 * high:.1f}% here ({line} at "
                f"sigma {sigma:g}; 95% upper bound over the selection)")
        result.published.append(text)
        if paper / 100 > high:
            result.gaps.append(f"{text}: the paper's cell is above what these models reach on the sample, so the table "
                               f"cannot reproduce it; fix: check the line's checkpoint, normalisation and data "
                               f"(docs/paper-tables.md)")
    return result

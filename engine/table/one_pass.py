"""Which phases of a table can share one pass over the samples (a sweep across lines at one sigma), and
that pass as a run; engine/table/runner.py runs it.

Lines that denoise (dds, diffsmooth) at the same sigma, on the same images, settling the same radii
with the same data, denoiser and run options, differ only in what scores the denoised samples. Their
runs are then one sweep (base_classifier/configurations.py): each noisy sample is denoised once and
every line's configurations vote on it. The sweep's configurations are exactly the lines' own (each
line's run, planned on its own, names them: no cross product of one line's classifiers with another
line's methods), and each configuration's rows go to the file the line's own run would write, with
the settings file (or sweep index) that run would record. A configuration of a sweep votes on the
same samples as its single run (noise keyed by seed, image and sample index) and stops at its own
look, so every line's rows equal those of its separate run, and the race decides as it would.

Resume: a line whose file already holds every image of the phase leaves the pass (its rows are read
back); a pass left with one line is that line's ordinary run. Interrupted, the pass keeps the rows
of the images it finished (every configuration's row of an image is written together).

Only the runs a table shares in full go through here (the race's first runs, the pilot plan's pilot
and main runs); the race's extensions rerun a few images of one line and stay per line. RS lines
never join: they do not denoise, so a shared pass would save only the noise draw.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from diffsmooth.engine.base_classifier.methods import MethodConfig, method_named
from diffsmooth.engine.runs.resolve import ResolvedRun

# request options that may differ between the lines of one pass (what scores the denoised samples)
PER_LINE = ("method", "classifier", "local_sigma", "m", "out")


@dataclass(frozen=True)
class SharedPass(ResolvedRun):
    """The lines' runs as one sweep: every line's configurations, each writing to its line's file."""

    files: Tuple[Path, ...] = ()

    @property
    def is_sweep(self) -> bool:
        return True

    def result_files(self):
        return dict(zip(self.configurations, self.files))

    def recorded(self) -> dict:
        raise TypeError("a shared pass has no settings of its own: each line's run records its file's")

    def lock_targets(self):
        raise TypeError("a shared pass holds no lock of its own: each line's run locks its file")


def pass_key(request, phase) -> Optional[tuple]:
    """What phases must share to run as one pass (None: the phase runs alone); `request(phase)`: its run's request."""
    method = method_named(phase.line.method)
    if method.purifier.copies_option is not None or MethodConfig(method.name, phase.sigma).purifier.key(phase.sigma) is None:
        return None                 # a pass shares one purified sample per noisy sample, the same for every line
    options = request(phase)
    fixed = tuple((k, repr(getattr(options, k))) for k in sorted(f.name for f in dataclasses.fields(options))
                  if k not in PER_LINE)
    return phase.sigma, tuple(phase.indices), None if phase.radii is None else tuple(phase.radii), phase.kind, fixed


def groups(request, phases: Sequence) -> List[List]:
    """The phases in order, those that can share a pass gathered at the place of the first of them."""
    out: List[List] = []
    where: Dict[tuple, int] = {}
    for phase in phases:
        key = pass_key(request, phase)
        if key is not None and key in where:
            out[where[key]].append(phase)
            continue
        if key is not None:
            where[key] = len(out)
        out.append([phase])
    return out


def shared_run(runs: Sequence[ResolvedRun]) -> Optional[SharedPass]:
    """The runs as one sweep, or None when they cannot share one: other models or fast path (checked
    again on the planned runs), `--shard` runs, two configurations with one name, or one classifier name for
    two files. torchrun's ranks share a pass as they share a run (engine/table/ranks.py)."""
    first = runs[0]
    same = dataclasses.replace(first.sources, classifier=None)
    if any(dataclasses.replace(r.sources, classifier=None) != same or (r.device, r.batch, r.fast) !=
           (first.device, first.batch, first.fast) or (r.shards.num_shards > 1 and not r.shards.distributed)
           for r in runs):
        return None
    configs, files, paths = [], [], {}
    for run in runs:
        for config, path in run.result_files().items():
            configs.append(config)
            files.append(path)
        for name, path in run.classifier_paths.items():
            if paths.setdefault(name, path) != path:
                return None
    if len({c.name for c in configs}) != len(configs):
        return None
    fields = {f.name: getattr(first, f.name) for f in dataclasses.fields(ResolvedRun)}
    fields.update(configurations=tuple(configs), classifier_paths=paths, out=first.out.parent)
    return SharedPass(**fields, files=tuple(files))

"""One step from what was asked (RunRequest) to a resolved run: the dataset and selected
images, the configurations and their classifier checkpoints, this process's share, this process's device,
the batch, the fast path and the output paths. Every default is decided here (or in the one function
it calls), and the settings a result file records are derived from the resolved run."""

from __future__ import annotations

import json
import os
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import torch

from diffsmooth.engine.base_classifier.configurations import Configuration, configurations
from diffsmooth.engine.base_classifier.diffusers_denoise import check_sigma
from diffsmooth.engine.data import load_dataset
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.models import shipped
from diffsmooth.engine.models.diffusers_folder import folder_identity
from diffsmooth.engine.runs.assemble import ModelSources
from diffsmooth.engine.runs.fast_path import FastPath, default_batch
from diffsmooth.engine.runs.locks import check_unlocked, hold_lock
from diffsmooth.engine.runs.request import RunRequest
from diffsmooth.engine.runs.results import (
    RADIUS_FORMAT,
    RADIUS_FORMAT_KEY,
    check_or_record_settings,
    read_json,
    read_result,
    refuse_other_radius_format,
    shard_path,
)
from diffsmooth.engine.runs.sharding import ProcessShare, rank_device, share_from
from diffsmooth.engine.runs.sources import ModelOptions, resolve_sources

# What determines the rows of a result file, in the order settings files have always listed them.
RECORDED = ("method", "sigma", "local_sigma", "m", "local_noise", "n0", "n", "alpha", "seed",
            "dataset", "data", "split", "denoiser", "preset", "unet_config", "classifier", "arch",
            "normalization", "stats", "backend", "precision", "batch", "fast_path")
SWEEP_INDEX = "index.json"


@dataclass(frozen=True)
class ResolvedRun:
    """A run with every choice made: what the engine builds and where it writes."""

    request: RunRequest
    dataset: object
    indices: Tuple[int, ...]
    configurations: Tuple[Configuration, ...]
    classifier_paths: Dict[str, str]        # configuration classifier name -> checkpoint
    sources: ModelSources
    shards: ProcessShare
    device: str
    batch: int
    fast: FastPath
    out: Path                               # the result file or sweep folder (a `--shard`'s own file)

    @property
    def is_sweep(self) -> bool:
        return self.request.is_sweep

    @property
    def sigma(self) -> float:
        return self.request.sigma

    @property
    def window(self) -> Optional[int]:
        return self.request.window

    @property
    def progress(self) -> bool:
        return not self.request.quiet

    def result_files(self) -> Dict[Configuration, Path]:
        """Where each configuration's rows go: the result file, or one file per configuration in the sweep folder."""
        if not self.is_sweep:
            return {self.configurations[0]: self.out}
        return {c: self.out / f"{c.name}.tsv" for c in self.configurations}

    def lock_targets(self) -> List[Tuple[Path, str, bool]]:
        """(target, what, is a folder) for each lock this process holds while it runs
        (engine/runs/locks.py): its result file (a shard's own) or the sweep folder (covering index.json
        and every configuration's file). Under torchrun rank 0 writes for every rank and holds them alone."""
        if not self.shards.writes:
            return []
        if self.is_sweep:
            return [(self.out, "sweep folder", True)]
        return [(self.out, "result file", False)]

    @contextmanager
    def hold_locks(self) -> Iterator[None]:
        """Hold this run's locks (re-entrant: the command line holds them from planning on, `execute` again)."""
        with ExitStack() as stack:
            for target, what, folder in self.lock_targets():
                stack.enter_context(hold_lock(target, what, folder))
            yield

    def check_result_files(self) -> None:
        """Refuse (before any model loads) to resume a damaged result file: every line is checked
        (results.read_result, naming file:line); only a torn last line is left to the writer to cut."""
        for path in self.result_files().values():
            if path.is_file() and path.stat().st_size > 0:
                read_result(path, torn_tail="ignore")

    def check_unlocked(self) -> None:
        """Refuse (before any model loads) when another run writes this run's files; holds nothing."""
        for target, what, folder in self.lock_targets():
            check_unlocked(target, what, folder)

    def recorded(self) -> dict:
        """What determines the rows of a result file (a resumed run must match it); the format of
        every earlier release, so their result files and sweep folders keep resuming, plus the radius
        format of certify rows (`radius_format`, rounded down): files written before it (radii
        rounded to nearest) are refused instead (results.refuse_other_radius_format)."""
        r = self.request
        settings = {k: getattr(r, k) for k in RECORDED if k not in ("batch", "fast_path")}
        settings.update(batch=self.batch, fast_path=self.fast.as_dict())
        if r.image_size is not None:        # recorded only when asked, so older settings files stay equal
            settings["image_size"] = r.image_size
        if self.is_sweep:
            settings.update(method=list(r.method), local_sigma=list(r.local_sigma), m=list(r.m),
                            classifier=list(r.classifier))
        else:
            settings.update(method=r.method[0], local_sigma=r.local_sigma[0], m=r.m[0], classifier=r.classifier_path)
        # Counts repeat exactly at a fixed batch size, precision and kernel choice; across batch sizes
        # only on CPU fp32 (measured on CUDA: fp16 changed 10 of 30,000 votes): a resume must match all.
        settings["device_type"] = str(r.device).split(":")[0]
        settings["mode"] = r.mode
        if r.mode == "predict":
            settings.pop("n0")
        else:
            settings[RADIUS_FORMAT_KEY] = RADIUS_FORMAT     # how the rows print the radius (format_radius)
        rule = r.sequential
        if rule is not None:
            settings.pop("n")                       # n only sets n-max's default
            settings.update(sequential=True, radii=list(rule.radii), n_max=rule.n_max, futility=rule.describe_futility(),
                            look_growth=rule.growth, bound=rule.bound)
            if rule.bound == "reach-cp":            # its added looks and levels (split-cp files stay as they were)
                settings.update(schedule_radii=list(rule.schedule_radii), unanimity=rule.unanimity)
            if rule.decide_largest:                 # the race's extensions (other files stay as they were)
                settings["decide_largest"] = True
        if not self.is_sweep:           # a single run's settings: those its method has (the aliases' keys kept)
            config = r.method_config()
            for k in ("local_sigma", "m", "local_noise"):
                if k not in dict(config.options):
                    settings.pop(k)
            settings.update((o.name, config.option(o.name)) for o in config.method.options if o.recorded)
        if r.scheduler is not None:
            settings["scheduler"] = r.scheduler
        # a diffusers folder: its format and the sha256 of its weights and configs (checkpoint files: nothing added)
        settings.update(folder_identity(self.sources.diffusers) if self.sources.diffusers is not None else {})
        return settings

    def sweep_index(self) -> dict:
        """The sweep folder's index.json: the recorded settings and each configuration's file."""
        return {"settings": self.recorded(), "entries": [
            {"method": c.config.name, "classifier": c.classifier,
             "local_sigma": dict(c.config.options).get("local_sigma"), "m": dict(c.config.options).get("m"),
             "file": f"{c.name}.tsv"}
            for c in self.configurations]}

    def check_resumable(self, record: bool) -> None:
        """Refuse to append to results written with other settings; with `record`, write the settings
        (a new result file's sidecar, or the sweep folder's index.json)."""
        if self.shards.distributed and not self.shards.writes:
            return      # torchrun: rank 0 checks and records; the ranks prove they hold the same work by content
                        # (certify/agreement.py), never by paths, which may differ between nodes
        record = record and self.shards.writes
        if not self.is_sweep:
            check_or_record_settings(self.out, self.recorded(), record=record)
            return
        index = self.sweep_index()
        path = self.out / SWEEP_INDEX
        if path.exists():
            refuse_other_radius_format(read_json(path, "sweep index").get("settings", {}), index["settings"], self.out)
        if path.exists() and read_json(path, "sweep index") != json.loads(json.dumps(index)):
            raise UserError(f"{self.out} holds a sweep with other settings or configurations: use another `out`")
        if record:
            self.out.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".tmp")        # whole or absent: torchrun's other ranks may read it
            tmp.write_text(json.dumps(index, indent=1, allow_nan=False) + "\n")
            os.replace(tmp, path)


def set_threads(threads: Optional[int]) -> None:
    """torch's CPU threads when asked (on a shared machine use fewer)."""
    if threads:
        torch.set_num_threads(threads)


# The request's options its dataset and selection are opened from (open_run_inputs also sets the threads).
DATA_OPTIONS = ("dataset", "data", "split", "skip", "max_index", "image_size", "threads")


def open_dataset(request: RunRequest) -> Tuple[str, object, List[int]]:
    """(dataset kind, dataset, selected indices): Cohen's --skip/--max convention."""
    kind = request.dataset or ("embedded" if not request.data else None)
    if kind is None:
        raise UserError("`data` given without `dataset`: say which layout it is (cifar10, imagenet, npz, idx)")
    options = {}
    if request.image_size is not None:
        if kind != "imagenet":
            raise UserError(f"`image_size` is for ImageNet-style folders (dataset imagenet), not {kind}")
        # the standard Resize 256 + CenterCrop 224, scaled to the asked size
        options = dict(resize=max(request.image_size, round(request.image_size * 256 / 224)), crop=request.image_size)
    dataset = load_dataset(kind, request.data, split=request.split, **options)
    indices = dataset.indices_selected(request.skip, request.max_index)
    dataset.verify(indices)                 # a damaged image is refused before any row is written
    return kind, dataset, indices


def classifier_names(request: RunRequest, sources: ModelSources) -> Tuple[Dict[str, str], object]:
    """({name: checkpoint}, classifiers_for(config)): the given checkpoints by file stem, or the demo classifier
    the noise each configuration's classifier sees calls for."""
    if request.classifier:
        paths = {Path(p).stem: str(p) for p in request.classifier}
        if len(paths) != len(request.classifier):
            raise UserError("sweep classifiers need distinct file names (they name the result files)")
        return paths, lambda config: list(paths)
    paths: Dict[str, str] = {}

    def classifiers_for(config):
        if sources.preset != shipped.DEMO_PRESET:
            raise UserError("give `classifier` CHECKPOINT")
        path = config.method.demo_classifier(config)
        paths[path.stem] = str(path)
        return [path.stem]
    return paths, classifiers_for


class RunInputs(NamedTuple):
    """What a run reads, opened: the dataset's kind, the dataset, the images it runs (checked when the dataset
    was opened) and the model sources (a diffusers folder read). A table opens them once for all its runs."""

    kind: str
    dataset: object
    indices: Sequence[int]
    sources: ModelSources


def open_run_inputs(request: RunRequest) -> RunInputs:
    """A request's inputs (its selected images), its threads set: what a run and a preflight both start from;
    no images selected is refused."""
    set_threads(request.threads)
    kind, dataset, indices = open_dataset(request)
    if not indices:
        raise UserError("no images selected (check `skip` / `max`)")
    return RunInputs(kind, dataset, indices, resolve_sources(ModelOptions.of(request), kind))


def resolve_run(request: RunRequest, inputs: Optional[RunInputs] = None) -> ResolvedRun:
    """Resolve a request on its `inputs` (None: opened here from the request); refuses (before any model loads) a
    result file or sweep folder that another run is writing (its lock is held: checked, not taken;
    `ResolvedRun.hold_locks` takes it) or that was written with other settings."""
    kind, dataset, indices, sources = inputs if inputs is not None else open_run_inputs(request)
    paths, classifiers_for = classifier_names(request, sources)
    configs = configurations(request.method, request.sigma, request.options_for, classifiers_for)
    if sources.diffusers is not None and any(c.config.purifier.denoises for c in configs):
        check_sigma(sources.diffusers, request.sigma)     # before any file is touched
    shards = share_from(request.shard, request.device)
    device = rank_device(shards, request.device)
    fast = FastPath.asked_by(request, device, request.backend)
    batch = request.batch or default_batch(device, tuple(dataset.image_shape))
    out = Path(request.out)
    if shards.num_shards > 1 and not shards.distributed:
        out = shard_path(request.out, shards.shard, shards.num_shards)
    run = ResolvedRun(request, dataset, tuple(indices), tuple(configs), paths, sources, shards, device, batch, fast, out)
    run.check_unlocked()
    run.check_resumable(record=False)
    run.check_result_files()
    return run

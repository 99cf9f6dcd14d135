"""`diffsmooth table SPEC --check`: are the files a table names in place, before any sample is drawn?

Every checkpoint the spec names must exist, load with torch.load(weights_only=True) and, where its line
names a `source` (or the denoiser is an official file), hold the official tensor names and shapes
(the reference models' key lists, tests/data/keys/, equal the engine's architectures: the tests check
it, so the check builds them on the meta device instead of shipping the lists twice). The data folder
must open as the named dataset, the selection must hold the spec's `images` and every selected image
must decode. A line's normalisation must be its source's. Each problem is one line; a missing file's
line says where the reference repository says it comes from (engine/table/sources.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch

from diffsmooth.engine.base_classifier.methods import method_named
from diffsmooth.engine.data import load_dataset
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.models.checkpoints import extract_state_dict, read_checkpoint
from diffsmooth.engine.models.diffusers_folder import is_diffusers_folder, read_diffusers_folder
from diffsmooth.engine.models.diffusers_unet import load_diffusers_unet
from diffsmooth.engine.models.resnet import ARCHITECTURES, DEFAULT_NORMALIZATION, build_classifier_net
from diffsmooth.engine.models.timm_models import adapt_timm_state_dict, create_timm_net, is_timm_arch
from diffsmooth.engine.models.unet import UNetModel, unet_config
from diffsmooth.engine.table.sources import CLASSIFIER_KEYS, DATASETS, DENOISERS, SOURCES, UNET_KEYS
from diffsmooth.engine.table.spec import TableSpec

_SHOW = 2                                   # offending keys named per kind in a mismatch line
ARCH_DATASET = {"cifar_resnet110": "cifar10", "cifar_resnet20": "cifar10", "resnet50": "imagenet"}


@dataclass
class CheckReport:
    """What the table will run (lines to print) and the problems found (one line each)."""

    plan: List[str] = field(default_factory=list)
    problems: List[str] = field(default_factory=list)


@dataclass
class FileUse:
    """A checkpoint and who uses it."""

    kind: str                               # "denoiser" | "classifier"
    users: List[str] = field(default_factory=list)
    source: Optional[str] = None            # the line's source (classifiers)
    settings: Dict[str, object] = field(default_factory=dict)   # how a denoiser is read: [models]' or a line's own

    def who(self) -> str:
        more = f" and {len(self.users) - 1} more" if len(self.users) > 1 else ""
        return f"{self.kind} of {self.users[0]}{more}" if self.users else self.kind


@lru_cache(maxsize=None)
def official_shapes(name: str) -> Dict[str, Tuple[int, ...]]:
    """The official key list `name` (prefixes `1.` / `1.module.` stripped, as the loader strips them):
    tensor name -> shape, from the engine's architecture built on the meta device."""
    with torch.device("meta"):
        presets = {v: k for k, v in UNET_KEYS.items()}
        if name in presets:
            model = UNetModel(unet_config(presets[name]))
        else:
            arch = {v: k for k, v in CLASSIFIER_KEYS.items()}[name]
            model = build_classifier_net(arch, ARCHITECTURES[arch][1], 3)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def _shape(shape) -> str:
    return "[" + ", ".join(str(int(s)) for s in shape) + "]"


@lru_cache(maxsize=None)
def timm_net(arch: str):
    """A timm classifier on the meta device (no weights, no memory): its state dict names the tensors a
    checkpoint of `arch` must hold for the timm version installed."""
    return create_timm_net(arch, device="meta")


def compare_keys(state_dict, name: str, expected: Optional[Dict[str, Tuple[int, ...]]] = None) -> Optional[str]:
    """None when the state dict has the official names and shapes (`expected`, else the key list `name`),
    else what differs (one line)."""
    expected = official_shapes(name) if expected is None else expected
    got = {k: tuple(v.shape) for k, v in state_dict.items() if isinstance(v, torch.Tensor)}
    missing = [k for k in expected if k not in got and not k.endswith("num_batches_tracked")]
    unexpected = [k for k in got if k not in expected]
    wrong = [k for k in expected if k in got and got[k] != expected[k]]
    if not (missing or unexpected or wrong):
        return None
    parts = [f"{len(missing)} missing, {len(unexpected)} unexpected, {len(wrong)} mis-shaped"]
    if missing:
        parts.append("missing " + ", ".join(f"{k} {_shape(expected[k])}" for k in missing[:_SHOW]))
    if unexpected:
        parts.append("unexpected " + ", ".join(f"{k} {_shape(got[k])}" for k in unexpected[:_SHOW]))
    if wrong:
        parts.append("mis-shaped " + ", ".join(f"{k} {_shape(got[k])} (official {_shape(expected[k])})"
                                              for k in wrong[:_SHOW]))
    return f"does not match the {'official ' if name in CLASSIFIER_KEYS.values() or name in UNET_KEYS.values() else ''}" \
           f"{name} key list: " + "; ".join(parts)


def named_files(spec: TableSpec) -> Dict[str, FileUse]:
    """Every checkpoint the spec names, with its users ("line L at sigma s")."""
    files: Dict[str, FileUse] = {}
    denoiser = spec.models.get("denoiser")
    if denoiser and any(line.denoiser is None and method_named(line.method).purifier.denoises for line in spec.lines):
        files[str(denoiser)] = FileUse("denoiser", ["[models]"], settings=dict(spec.models))
    for line in spec.lines:
        if line.denoiser is not None:
            use = files.setdefault(str(line.denoiser), FileUse("denoiser", settings={"scheduler": line.scheduler}))
            use.users.append(f"line {line.name!r}")
        for sigma in spec.sigmas:
            for path in line.classifier.get(sigma, ()):
                use = files.setdefault(str(path), FileUse("classifier", source=line.source))
                use.users.append(f"line {line.name!r} at sigma {sigma:g}")
    return files


def _where(path: str, use: FileUse) -> str:
    if use.kind == "denoiser":
        return DENOISERS.get(Path(path).name, ("", "the denoiser the spec names"))[1]
    if use.source is not None:
        return SOURCES[use.source].where
    return "the classifier checkpoint the spec names"


def check_file(path: str, use: FileUse, spec: TableSpec) -> Tuple[Optional[str], str]:
    """(problem or None, what was checked) for one checkpoint."""
    if not os.path.exists(path):
        return f"missing {use.who()}: {path}; get it from {_where(path, use)}", ""
    if use.kind == "denoiser" and is_diffusers_folder(path):
        try:        # configs read, kind detected, weights loaded strictly against the config's shapes
            folder = read_diffusers_folder(path, use.settings.get("scheduler"))
            load_diffusers_unet(folder)
        except UserError as exc:
            return f"{use.who()}: {exc}", ""
        return None, f"a diffusers folder ({folder.kind}); its weights match its config"
    try:
        state_dict, arch = extract_state_dict(read_checkpoint(path, mmap=True))
    except UserError as exc:
        return f"{use.who()}: {exc}", ""
    if use.kind == "denoiser":
        official = DENOISERS.get(Path(path).name)
        settings = use.settings
        preset = settings.get("preset") or (None if settings.get("unet_config") else "cifar10")
        if official and preset != official[0]:
            return f"{use.who()}: {path} is the official {official[0]} model, but [models] preset is {preset!r}", ""
        if preset not in UNET_KEYS or settings.get("unet_config"):
            return None, "loads (no official key list for this UNet)"
        name = UNET_KEYS[preset]
    else:
        if use.source is None:
            return None, "loads (name the line's source to compare it with the official key list)"
        arch = spec.models.get("arch") or arch
        if SOURCES[use.source].normalization is None:       # a timm model (BEiT): no official key list
            if not is_timm_arch(arch):
                return f"{use.who()}: {path} records architecture {arch!r}, not a timm model such as " \
                       f"beit_large_patch16_224", ""
            try:
                net = timm_net(arch)
                state_dict = adapt_timm_state_dict(net, state_dict)
            except UserError as exc:
                return f"{use.who()}: {path}: {exc}", ""
            expected = {k: tuple(v.shape) for k, v in net.state_dict().items()}
            mismatch = compare_keys(state_dict, f"timm {arch}", expected)
            return (f"{use.who()}: {path} {mismatch}", "") if mismatch else \
                (None, f"matches the timm {arch} key list (no official list ships)")
        if arch not in CLASSIFIER_KEYS:
            return f"{use.who()}: {path} records architecture {arch!r}; official checkpoints of this source are " \
                   f"{', '.join(CLASSIFIER_KEYS)}", ""
        dataset = spec.data.get("dataset")
        if dataset in ARCH_DATASET.values() and ARCH_DATASET[arch] != dataset:
            return f"{use.who()}: {path} is a {arch} ({ARCH_DATASET[arch]}) but the table certifies {dataset}", ""
        name = CLASSIFIER_KEYS[arch]
    mismatch = compare_keys(state_dict, name)
    if mismatch:
        return f"{use.who()}: {path} {mismatch}", ""
    return None, f"matches the official {name} key list"


def check_normalization(spec: TableSpec) -> List[str]:
    """A line whose normalisation is not its source's (the checkpoints cannot say; a wrong layer
    silently costs accuracy)."""
    problems = []
    for line in spec.lines:
        if line.source is None or line.normalization is None:
            continue
        wanted = SOURCES[line.source].normalization
        if line.normalization != wanted:
            want = wanted or "the timm model's own statistics (leave normalization out)"
            problems.append(f"line {line.name!r}: normalization {line.normalization!r}, but {SOURCES[line.source].title} "
                            f"checkpoints were trained behind {want}")
    return problems


def check_data(spec: TableSpec) -> Tuple[List[str], List[str]]:
    """(plan lines, problems) of the data: the folder opens as the dataset, the selection holds the
    spec's `images`, every selected image decodes."""
    selection = spec.selection()            # [data] with the run's defaults, as the runs read it
    kind, path = selection["dataset"], selection["data"]
    skip, stop, images = selection["skip"], selection["max_index"], spec.data.get("images")
    where = DATASETS.get(kind, "the data set the spec names")
    if path and not os.path.exists(os.path.expanduser(str(path))):
        return [], [f"missing data folder {path} ({kind}); get it from {where}"]
    try:
        dataset = load_dataset(kind or "embedded", path, split=selection["split"])
        indices = dataset.indices_selected(skip, stop)
    except UserError as exc:
        return [], [f"data: {exc}"]
    plan = [f"data: {kind or 'embedded'}{f' {path}' if path else ''} ({len(dataset):,} images): indices divisible by "
            f"{skip}{f' below {stop}' if stop else ''}, {len(indices)} images"]
    if images is not None and len(indices) != images:
        return plan, [f"data: the selection holds {len(indices)} images of {path}, the spec expects {images} "
                      f"(every {skip}th of {images * skip:,}); is it the whole {kind} test set? ({where})"]
    try:
        dataset.verify(indices)
    except UserError as exc:
        return plan, [f"data: {exc}"]
    return plan, []


def describe_runs(spec: TableSpec) -> List[str]:
    """One line per line and sigma: what the table will run."""
    out = [f"table: {spec.title}: {len(spec.lines)} line(s) x sigma {', '.join(f'{s:g}' for s in spec.sigmas)}; "
           f"radii up to {max(spec.radii):g}; n0 {spec.n0}, n-max {spec.n_max:,}, alpha {spec.alpha:g}"]
    default = DEFAULT_NORMALIZATION.get(str(spec.data.get("dataset")), "normalize")
    for line in spec.lines:
        layer = line.input_layer or spec.models.get("normalization") or \
            ("the model's own" if line.source else f"{default} (default)")
        for sigma in spec.sigmas:
            what = [line.method, f"classifier {', '.join(line.classifier.get(sigma, ())) or 'demo'}"]
            declared = {o.name for o in method_named(line.method).options}
            if "local_sigma" in declared:
                what.append(f"sigma' {', '.join(f'{v:g}' for v in line.local_sigmas(sigma))}")
            if "m" in declared:
                what.append(f"m {', '.join(str(v) for v in line.local_noises(sigma))}")
            out.append(f"run: {line.name}, sigma {sigma:g}: {'; '.join(what)}; normalization {layer}")
    return out


def check_table(spec: TableSpec, folders: Optional[Dict[str, Optional[str]]] = None) -> CheckReport:
    """Everything the table needs, checked without drawing a sample; `folders` ({"models": DIR, "data": DIR})
    name the folders in the download hints."""
    folders = folders or {}
    report = CheckReport(describe_runs(spec))
    for name, folder in folders.items():
        if folder and not os.path.isdir(os.path.expanduser(folder)):
            report.problems.append(f"--{name} {folder}: no such folder")
    problems = []
    for path, use in named_files(spec).items():
        problem, checked = check_file(path, use, spec)
        if problem:
            problems.append(problem)
        else:
            report.plan.append(f"file: {path}: {checked}")
    problems += check_normalization(spec)
    plan, data_problems = check_data(spec)
    report.plan += plan
    for line in problems + data_problems:           # the download hints name the user's folders
        head, hint, where = line.partition("; get it from ")
        for name, word in (("models", "MODELS"), ("data", "DATA")):
            if folders.get(name):
                where = where.replace(word, folders[name].rstrip("/") or "/")
        report.problems.append(head + hint + where)
    return report

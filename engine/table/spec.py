"""What a table asks for: a TOML spec (standard library `tomllib`) or the embedded demo, checked once.

    title = "Fashion-MNIST demo"
    sigmas = [0.25, 0.5, 1.0]
    radii = [0.0, 0.25, 0.5, 0.75, 1.0]          # radius 0 is always added
    n0 = 100
    n_max = 10000
    alpha = 0.001
    seed = 0
    [data]   dataset, data, split, skip, max      (as `certify`)
    [models] denoiser (a checkpoint or a diffusers folder), scheduler, preset, unet_config, schedule,
             diffusion_steps, arch, normalization, stats
    [run]    device, precision, batch, compile, cuda_graphs, streams, fused_attention, backend, onnx_dir,
             threads, window
    [[line]] name, method (rs | dds | diffsmooth), classifier, local_sigma, m, local_noise, source, normalization,
             group, denoiser, scheduler
    [[published]] name, lines, cells, acr    (the paper's own row: engine/table/published.py)

Paths may start with `{models}` or `{data}`: the folders given on the command line (`--models DIR`,
`--data DIR`), so a shipped spec (specs/paper/) needs no editing. `[data] images` is the number of
images the selection must hold (checked by `diffsmooth table --check`). A line's `source` (cohen,
smoothadv, beit: engine/table/sources.py) names where its classifiers come from, which fixes their
normalisation unless the line names one (`normalization`, overriding [models]). A line's `group` names
the block it belongs to in the per-configuration layout (table_by_config.md: the best per group and sigma
in bold; engine/table/by_config.py); it changes no run. A line's `denoiser` (a diffusers folder or a
checkpoint; `scheduler` for a diffusers UNet folder) replaces [models]' denoiser and its settings (preset,
unet_config, schedule, diffusion_steps, scheduler) for that line only: DDS with two denoisers side by side.

A `[[published]]` row holds the paper's cells of one of its rows (certified accuracy in percent, keyed by radius,
and its ACR where the paper gives one) and the spec's `lines` it is the best of in each column (default: the line
of its own name); it changes no run and is not part of the spec's fingerprint.

A line's classifier / local_sigma / m is one value, a list (a one-pass sweep; the cell takes the best
configuration), or a table keyed by sigma ("0.25" = ...); so is a list of a method's sweepable setting (DensePure's
reverse_runs: its configurations share the first runs' chains). No classifier: the demo classifier for the
method's noise level.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from diffsmooth.engine.base_classifier.methods import MethodConfig, method_named, method_names
from diffsmooth.engine.base_classifier.methods.config import OPTION_ALIASES, checked_options
from diffsmooth.engine.choices import (
    DEFAULT_ALPHA,
    DEFAULT_LOCAL_NOISE,
    DEFAULT_N,
    DEFAULT_N0,
    DEFAULT_SEED,
    DEFAULT_SKIP,
    DEFAULT_SPLIT,
    MAX_SAMPLES,
    MAX_SEED,
)
from diffsmooth.engine.errors import UserError, check_alpha
from diffsmooth.engine.models import shipped
from diffsmooth.engine.models.resnet import NORMALIZATION_MODES
from diffsmooth.engine.models.shipped import DEMO_TRAINING_SIGMAS
from diffsmooth.engine.runs.request import RunRequest
from diffsmooth.engine.table.defaults import RADII, SIGMAS, TITLE, local_noises, local_sigmas
from diffsmooth.engine.table.sources import SOURCES

TOP_KEYS = {"title", "sigmas", "radii", "n0", "n_max", "alpha", "seed", "data", "models", "run", "line", "published"}
PUBLISHED_KEYS = {"name", "lines", "cells", "acr"}
DATA_KEYS = {"dataset", "data", "split", "skip", "max", "images", "image_size"}
MODEL_KEYS = {"denoiser", "scheduler", "preset", "unet_config", "schedule", "diffusion_steps", "arch", "normalization",
              "stats"}
RUN_KEYS = {"device", "precision", "batch", "compile", "cuda_graphs", "streams", "fused_attention", "backend",
            "onnx_dir", "threads", "window"}
LINE_KEYS = {"name", "method", "classifier", "local_sigma", "m", "local_noise", "source", "normalization", "group",
             "denoiser", "scheduler"}
# [models] keys that describe its denoiser: a line with a denoiser of its own takes none of them
DENOISER_SETTINGS = ("denoiser", "preset", "unet_config", "schedule", "diffusion_steps", "scheduler")
FOLDERS = ("models", "data")                    # the {models} / {data} placeholders of a spec's paths
LINE_PATHS = ("classifier", "denoiser", "scheduler")      # a line's keys that hold paths

DEMO_SIGMAS = tuple(s for s in DEMO_TRAINING_SIGMAS if s > 0)
# --rows of the demo table: a built-in method's line, or DDS with the demo's diffusers DDPM as its denoiser
DEMO_ROWS = {**{m: m for m in method_names()}, "dds-ddpm": "dds"}      # every method registered at import
DEMO_ROW_NAMES = {"dds-ddpm": "DDS (diffusers DDPM)"}


@dataclass(frozen=True)
class LineSpec:
    """One line of the table: a method and, per sigma, its configurations (several: a sweep)."""

    name: str
    method: str
    classifier: Dict[float, Tuple[str, ...]]
    local_sigma: Dict[float, Tuple[float, ...]]
    m: Dict[float, Tuple[int, ...]]
    local_noise: str = DEFAULT_LOCAL_NOISE
    source: Optional[str] = None            # engine/table/sources.py: where the classifiers come from
    normalization: Optional[str] = None     # the classifiers' input layer; None: the source's, else [models]'
    group: Optional[str] = None             # the per-configuration layout's block (None: one block for the table)
    denoiser: Optional[str] = None          # this line's own denoiser (None: [models]')
    scheduler: Optional[str] = None         # the scheduler folder of this line's diffusers UNet folder
    options: Tuple[Tuple[str, object], ...] = ()    # the method's own settings the line gives (its keys)

    @property
    def input_layer(self) -> Optional[str]:
        """The normalisation this line asks for (its own, else its source's; None: [models] decides)."""
        if self.normalization is not None:
            return self.normalization
        return SOURCES[self.source].normalization if self.source is not None else None

    def local_sigmas(self, sigma: float) -> Tuple[float, ...]:
        """sigma' at `sigma`: the spec's, else the default (engine/table/defaults.py)."""
        return self.local_sigma.get(sigma) or local_sigmas(sigma)

    def local_noises(self, sigma: float) -> Tuple[int, ...]:
        """m at `sigma`: the spec's, else the default (engine/table/defaults.py)."""
        return self.m.get(sigma) or local_noises(sigma)

    @property
    def slug(self) -> str:
        """The line's name as a file name."""
        text = "".join(c if c.isalnum() else "-" for c in self.name.lower()).strip("-")
        return "-".join(part for part in text.split("-") if part) or self.method


@dataclass(frozen=True)
class PublishedRow:
    """A row of the paper's table: its name, the spec's lines whose best cell per column it reports (a DiffSmooth
    row of Table 1 is the better of its two sigma' lines), its cells (radius, certified accuracy in percent) and
    its ACR where the paper gives one."""

    name: str
    lines: Tuple[str, ...]
    cells: Tuple[Tuple[float, float], ...]
    acr: Optional[float] = None

    def as_dict(self) -> dict:
        return {"name": self.name, "lines": list(self.lines), "cells": {f"{r:g}": v for r, v in self.cells},
                "acr": self.acr}


@dataclass(frozen=True)
class TableSpec:
    """Every setting of a table; `fingerprint` identifies it (a table folder holds one spec)."""

    title: str
    sigmas: Tuple[float, ...]
    radii: Tuple[float, ...]
    lines: Tuple[LineSpec, ...]
    n0: int = DEFAULT_N0
    n_max: int = DEFAULT_N
    alpha: float = DEFAULT_ALPHA
    seed: int = DEFAULT_SEED
    data: Dict[str, object] = field(default_factory=dict)
    models: Dict[str, object] = field(default_factory=dict)
    run: Dict[str, object] = field(default_factory=dict)
    published: Tuple[PublishedRow, ...] = ()        # the paper's cells: shown beside the table's, never run

    def as_dict(self) -> dict:
        """Every setting that decides the runs (the fingerprint's; `published` is not one of them)."""
        d = asdict(self)
        d.pop("published")
        d["lines"] = [dict(asdict(line), classifier={f"{k:g}": list(v) for k, v in line.classifier.items()},
                           local_sigma={f"{k:g}": list(v) for k, v in line.local_sigma.items()},
                           m={f"{k:g}": list(v) for k, v in line.m.items()}) for line in self.lines]
        for line in d["lines"]:                 # not given: left out, so older specs keep their fingerprint
            for key in ("source", "normalization", "group", "denoiser", "scheduler"):
                if line[key] is None:
                    del line[key]
            options = line.pop("options")
            line.update({name: value for name, value in options})
        return d

    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps(self.as_dict(), sort_keys=True).encode()).hexdigest()[:16]

    def selection(self) -> dict:
        """[data] as the run's options, what it leaves out at its defaults (dataset, data, split, skip,
        max_index, image_size); `--check` reads the same."""
        data = self.data
        return dict(dataset=data.get("dataset"), data=data.get("data"), split=data.get("split", DEFAULT_SPLIT),
                    skip=data.get("skip", DEFAULT_SKIP), max_index=data.get("max"), image_size=data.get("image_size"))

    def request_options(self, line: LineSpec, sigma: float) -> dict:
        """`RunRequest.parse` keyword arguments of the line's run at `sigma` (sequential options aside)."""
        options = dict(method=(line.method,), sigma=sigma, classifier=line.classifier.get(sigma, ()),
                       local_sigma=line.local_sigmas(sigma), m=line.local_noises(sigma),
                       local_noise=line.local_noise, n0=self.n0, n=self.n_max, alpha=self.alpha, seed=self.seed,
                       **self.selection(), quiet=True)
        if line.options:
            options["method_options"] = tuple(line.options)
        options.update(self.models)
        if line.denoiser is not None:
            for key in DENOISER_SETTINGS:
                options.pop(key, None)
            options.update(denoiser=line.denoiser, scheduler=line.scheduler)
        options.update(self.run)
        if line.input_layer is not None:
            options["normalization"] = line.input_layer
        elif line.source is not None:           # a timm source: the model's own input statistics
            options.pop("normalization", None)
        return options


def _number(where: str, value, kind=float, low: Optional[float] = None, strict: bool = False,
            high: Optional[int] = None):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
        raise UserError(f"{where} must be {'an integer' if kind is int else 'a number'}, got {value!r}")
    if not math.isfinite(value) or (low is not None and (value <= low if strict else value < low)):
        bound = f"> {low:g}" if strict else f">= {low:g}"
        raise UserError(f"{where} must be finite and {bound}, got {value!r}")
    if high is not None and value > high:
        raise UserError(f"{where} must be <= {high:,}, got {value!r}")
    return kind(value) + (0.0 if kind is float else 0)        # -0.0 -> 0.0


def _alpha(where: str, value) -> float:
    """A finite number in (0, 1): the range engine/errors.py's check_alpha defines (RunRequest applies the same)."""
    alpha = _number(where, value, float, 0.0, strict=True)
    try:
        check_alpha(alpha)
    except UserError:
        raise UserError(f"{where} must be in (0, 1), got {value!r}") from None
    return alpha


def _unknown(where: str, table: dict, allowed: set) -> None:
    extra = sorted(set(table) - allowed)
    if extra:
        raise UserError(f"{where}: unknown key{'s' if len(extra) > 1 else ''} {', '.join(extra)} "
                        f"(known: {', '.join(sorted(allowed))})")


def _per_sigma(where: str, value, sigmas: Tuple[float, ...], convert) -> Dict[float, tuple]:
    """One value / a list (for every sigma) or a table keyed by sigma -> {sigma: tuple}."""
    if value is None:
        return {}
    if isinstance(value, dict):
        if not value:
            raise UserError(f"{where}: a table keyed by sigma must name at least one sigma, e.g. \"0.25\" = ...")
        out = {}
        for key, item in value.items():
            sigma = _listed_key(where, key, sigmas, ("sigma", "sigmas", "`sigmas`"))
            out[sigma] = _values(f"{where}.\"{key}\"", item, convert)
        return out
    values = _values(where, value, convert)
    return {s: values for s in sigmas}


def _values(where: str, value, convert) -> tuple:
    items = value if isinstance(value, list) else [value]
    if not items:
        raise UserError(f"{where} must not be empty")
    out = tuple(convert(f"{where}", v) for v in items)
    if len(set(out)) != len(out):
        raise UserError(f"{where} lists a value twice: {list(out)}")
    return out


def _path(where: str, value) -> str:
    if not isinstance(value, str) or not value:
        raise UserError(f"{where} must be a checkpoint path, got {value!r}")
    return value


def _sorted_unique(where: str, values, low: float, strict: bool) -> Tuple[float, ...]:
    if not isinstance(values, list) or not values:
        raise UserError(f"{where} must be a non-empty list of numbers, got {values!r}")
    numbers = [_number(f"{where}", v, float, low, strict) for v in values]
    if len(set(numbers)) != len(numbers):
        raise UserError(f"{where} lists a value twice: {values}")
    return tuple(sorted(numbers))


def parse_spec(doc: dict, where: str = "spec") -> TableSpec:
    """A TableSpec from a parsed TOML document; one UserError line for the first problem."""
    if not isinstance(doc, dict):
        raise UserError(f"{where}: not a table")
    _unknown(where, doc, TOP_KEYS)
    sigmas = _sorted_unique(f"{where}: sigmas", doc.get("sigmas", list(SIGMAS)), 0.0, strict=True)
    radii = tuple(sorted({0.0, *_sorted_unique(f"{where}: radii", doc.get("radii", list(RADII)), 0.0, False)}))
    sections = {}
    for name, allowed in (("data", DATA_KEYS), ("models", MODEL_KEYS), ("run", RUN_KEYS)):
        table = doc.get(name, {})
        if not isinstance(table, dict):
            raise UserError(f"{where}: [{name}] must be a table")
        _unknown(f"{where}: [{name}]", table, allowed)
        sections[name] = dict(table)
    for key in ("skip", "max", "images", "image_size"):
        if key in sections["data"]:
            _number(f"{where}: data.{key}", sections["data"][key], int, 1)
    raw_lines = doc.get("line")
    if not isinstance(raw_lines, list) or not raw_lines:
        raise UserError(f"{where}: needs at least one [[line]] (name, method, ...)")
    lines, names = [], set()
    for k, raw in enumerate(raw_lines, 1):
        at = f"{where}: line {k}"
        if not isinstance(raw, dict):
            raise UserError(f"{at} must be a table")
        method = raw.get("method")
        if not isinstance(method, str) or method not in method_names():
            _unknown(at, raw, LINE_KEYS)
            raise UserError(f"{at}: method must be one of {', '.join(method_names())}, got {method!r}")
        kind = method_named(method)
        declared = {o.name for o in kind.options}
        own = declared - set(OPTION_ALIASES)                # the aliases are line keys (per sigma, as before)
        _unknown(at, raw, LINE_KEYS | own)
        try:
            options = checked_options(kind, [(k, v) for k, v in raw.items() if k in own])    # a list: a sweep
        except UserError as exc:
            raise UserError(f"{at}: {exc}") from None
        name = raw.get("name", kind.line_name or method)
        if not isinstance(name, str) or not name.strip() or name in names:
            raise UserError(f"{at}: name must be a new non-empty string, got {name!r}")
        names.add(name)
        if ({"local_sigma", "m"} & set(raw)) - declared:
            having = [n for n in method_names() if {"local_sigma", "m"} <= {o.name for o in method_named(n).options}]
            raise UserError(f"{at}: local_sigma and m belong to {' and '.join(having)} lines")
        source, layer = raw.get("source"), raw.get("normalization")
        if source is not None and source not in SOURCES:
            raise UserError(f"{at}: source must be one of {', '.join(SOURCES)}, got {source!r}")
        if layer is not None and layer not in NORMALIZATION_MODES:
            raise UserError(f"{at}: normalization must be one of {', '.join(NORMALIZATION_MODES)}, got {layer!r}")
        group = raw.get("group")
        if group is not None and (not isinstance(group, str) or not group.strip()):
            raise UserError(f"{at}: group must be a non-empty string, got {group!r}")
        if not kind.purifier.denoises and ({"denoiser", "scheduler"} & set(raw)):
            denoising = [n for n in method_names() if method_named(n).purifier.denoises]
            raise UserError(f"{at}: an {method} line does not denoise: denoiser and scheduler belong to "
                            f"{' and '.join(denoising)} lines")
        if "scheduler" in raw and "denoiser" not in raw:
            raise UserError(f"{at}: scheduler goes with the line's own denoiser (a diffusers UNet folder)")
        denoiser = _path(f"{at}.denoiser", raw["denoiser"]) if "denoiser" in raw else None
        scheduler = _path(f"{at}.scheduler", raw["scheduler"]) if "scheduler" in raw else None
        lines.append(LineSpec(
            name, method, _per_sigma(f"{at}.classifier", raw.get("classifier"), sigmas, _path),
            _per_sigma(f"{at}.local_sigma", raw.get("local_sigma"), sigmas,
                       lambda w, v: _number(w, v, float, 0.0, strict=True)),
            _per_sigma(f"{at}.m", raw.get("m"), sigmas, lambda w, v: _number(w, v, int, 1)),
            str(raw.get("local_noise", DEFAULT_LOCAL_NOISE)), source, layer, group, denoiser, scheduler, options))
    title = doc.get("title", TITLE)
    if not isinstance(title, str):
        raise UserError(f"{where}: title must be a string, got {title!r}")
    published = parse_published(doc.get("published", []), {line.name for line in lines}, radii, where)
    spec = TableSpec(title, sigmas, radii, tuple(lines), published=published,
                     n0=_number(f"{where}: n0", doc.get("n0", DEFAULT_N0), int, 1, high=MAX_SAMPLES),
                     n_max=_number(f"{where}: n_max", doc.get("n_max", DEFAULT_N), int, 1, high=MAX_SAMPLES),
                     alpha=_alpha(f"{where}: alpha", doc.get("alpha", DEFAULT_ALPHA)),
                     seed=_number(f"{where}: seed", doc.get("seed", DEFAULT_SEED), int, 0, high=MAX_SEED), **sections)
    check_requests(spec, where)
    return spec


def parse_published(raw, line_names, radii: Tuple[float, ...], where: str = "spec") -> Tuple[PublishedRow, ...]:
    """[[published]] rows: a name, the lines they are the best of (names of the spec's lines), cells keyed by a
    radius of the spec ("0.25" = 60.0, percent) and an optional ACR; one UserError line for the first problem."""
    if not isinstance(raw, list):
        raise UserError(f"{where}: published must be an array of tables ([[published]])")
    rows, names = [], set()
    for k, item in enumerate(raw, 1):
        at = f"{where}: published {k}"
        if not isinstance(item, dict):
            raise UserError(f"{at} must be a table")
        _unknown(at, item, PUBLISHED_KEYS)
        name = item.get("name")
        if not isinstance(name, str) or not name.strip() or name in names:
            raise UserError(f"{at}: name must be a new non-empty string, got {name!r}")
        names.add(name)
        lines = item.get("lines", [name])
        if not isinstance(lines, list) or not lines or not all(isinstance(n, str) for n in lines) \
                or len(set(lines)) != len(lines):
            raise UserError(f"{at}.lines must be a non-empty list of line names, each once, got {lines!r}")
        unknown = [n for n in lines if n not in line_names]
        if unknown:
            raise UserError(f"{at}.lines: no line named {unknown[0]!r} (lines: {', '.join(sorted(line_names))})")
        cells = item.get("cells")
        if not isinstance(cells, dict) or not cells:
            raise UserError(f"{at}.cells must be a table of radius = percent, e.g. \"0.25\" = 60.0")
        parsed = []
        for key, value in cells.items():
            radius = _listed_key(f"{at}.cells", key, radii, ("radius", "radii", "the spec's radii"))
            percent = _number(f"{at}.cells.\"{key}\"", value, float, 0.0)
            if percent > 100:
                raise UserError(f"{at}.cells.\"{key}\" is a percentage (0 to 100), got {value!r}")
            parsed.append((radius, percent))
        acr = _number(f"{at}.acr", item["acr"], float, 0.0) if "acr" in item else None
        rows.append(PublishedRow(name, tuple(lines), tuple(sorted(parsed)), acr))
    return tuple(rows)


def check_requests(spec: TableSpec, where: str = "spec") -> None:
    """Every run of the table as a certify request (RunRequest.parse checks each option), so a bad
    [data] / [models] / [run] value is refused before the table's folder is touched."""
    for line in spec.lines:
        for sigma in spec.sigmas:
            try:
                RunRequest.parse("certify", out="table-check.tsv", **spec.request_options(line, sigma))
            except (UserError, TypeError) as exc:       # TypeError: a value of a type no option takes
                raise UserError(f"{where}: line {line.name!r} at sigma {sigma:g}: {exc}") from None


def resolve_folders(doc, folders: Dict[str, Optional[str]], where: str = "spec"):
    """The document with `{models}` / `{data}` in its [data], [models], [run] values and a line's paths
    (classifier, denoiser, scheduler) replaced by the folders given (`--models`, `--data`); one UserError
    line for a placeholder whose folder was not given."""
    def fill(value, at: str):
        if isinstance(value, str):
            for name in FOLDERS:
                token = "{" + name + "}"
                if token in value:
                    folder = folders.get(name)
                    if not folder:
                        raise UserError(f"{where}: {at} uses {token}: give --{name} DIR")
                    value = value.replace(token, os.path.expanduser(str(folder)).rstrip("/") or "/")
            return value
        if isinstance(value, list):
            return [fill(v, at) for v in value]
        if isinstance(value, dict):
            return {k: fill(v, f"{at}.{k}") for k, v in value.items()}
        return value
    if not isinstance(doc, dict):
        return doc
    out = dict(doc)
    for section in ("data", "models", "run"):
        if isinstance(doc.get(section), dict):
            out[section] = fill(doc[section], f"[{section}]")
    if isinstance(doc.get("line"), list):
        out["line"] = [dict(raw, **{key: fill(raw[key], f"line {k} {key}") for key in LINE_PATHS if key in raw})
                       if isinstance(raw, dict) else raw for k, raw in enumerate(doc["line"], 1)]
    return out


def load_spec(path, folders: Optional[Dict[str, Optional[str]]] = None) -> TableSpec:
    """Read and check a TOML spec file; `folders` fill its {models} / {data} placeholders."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise UserError(f"no such spec file: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read spec file {path}: {exc}") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{path}: not valid TOML ({exc})") from None
    return parse_spec(resolve_folders(doc, folders or {}, str(path)), str(path))


DEMO_IMAGES = 16
DEMO_N_MAX = 500


def demo_local_sigma(sigma: float) -> float:
    """DiffSmooth's sigma' in the demo: the largest shipped classifier level at or below a spec's default
    sigma' (sigma / 2: engine/table/defaults.py; sigma' <= sigma, as in the paper), else the smallest shipped one."""
    below = [s for s in DEMO_SIGMAS if s <= local_sigmas(sigma)[0] + 1e-12]
    return max(below) if below else min(DEMO_SIGMAS)


def _demo_line(row: str) -> LineSpec:
    """One line of the demo table (a --rows name)."""
    method = DEMO_ROWS[row]
    kind = method_named(method)
    name = DEMO_ROW_NAMES.get(row, kind.line_name)
    if row == "dds-ddpm":
        if not shipped.DEMO_DDPM.exists():
            raise UserError(f"--rows dds-ddpm: the demo's diffusers denoiser is missing ({shipped.DEMO_DDPM}); "
                            f"run `diffsmooth train-demo --only-missing` to create it")
        clean = (str(kind.demo_classifier(MethodConfig(method, DEMO_SIGMAS[0]))),)  # DDS's, as the demo's dds line
        return LineSpec(name, method, {s: clean for s in DEMO_SIGMAS}, {}, {}, denoiser=str(shipped.DEMO_DDPM))
    local = {s: (demo_local_sigma(s),) for s in DEMO_SIGMAS} if "local_sigma" in {o.name for o in kind.options} else {}
    return LineSpec(name, method, {}, local, {s: (1,) for s in DEMO_SIGMAS} if local else {})


def demo_spec(rows=("rs", "dds", "diffsmooth"), images: Optional[int] = None, n_max: Optional[int] = None,
              device: str = "cpu", threads: Optional[int] = None, batch: Optional[int] = None,
              compile: Optional[bool] = None, precision: Optional[str] = None) -> TableSpec:
    """The embedded demo table: Fashion-MNIST demo models, three sigmas, radii 0 to 2.0; DiffSmooth
    with m = 1 and sigma' from `demo_local_sigma` keeps the default size near ten minutes on 2 CPU cores."""
    images = DEMO_IMAGES if images is None else images
    lines = []
    for row in rows:
        if row not in DEMO_ROWS:
            raise UserError(f"--rows: unknown line {row!r} ({', '.join(DEMO_ROWS)})")
        lines.append(_demo_line(row))
    if len(set(rows)) != len(rows) or not rows:
        raise UserError(f"--rows: name each of {', '.join(DEMO_ROWS)} at most once, got {','.join(rows)}")
    skip = max(1, 500 // images)
    run = {"device": device}
    for key, value in (("threads", threads), ("batch", batch), ("compile", compile), ("precision", precision)):
        if value is not None:
            run[key] = value
    spec = TableSpec("Fashion-MNIST demo", DEMO_SIGMAS, RADII, tuple(lines),
                     n_max=DEMO_N_MAX if n_max is None else n_max,
                     data={"dataset": "embedded", "skip": skip, "max": skip * images}, run=run)
    check_requests(spec, "--demo")
    return spec


SMOKE_IMAGES = 2
SMOKE_N0 = 1
SMOKE_N = 1
SMOKE_BATCH = SMOKE_N0 + SMOKE_N       # one image's samples: a larger batch would compute (and pad) samples no run needs
CPU_RUN_KEYS = ("threads", "batch", "window")     # the [run] keys a smoke run on the CPU keeps
# An ImageNet smoke run on the CPU crops its images to this size: the official UNet and ResNet-50 take any
# size a multiple of 32 (their downsampling), and at 224 one UNet sample costs about a minute on 2 cores.
# BEiT-L/16's position tables fix its input at 224, so specs with a BEiT line keep 224.
SMOKE_IMAGENET_SIZE = 32


def smoke_spec(spec: TableSpec, cuda: bool) -> Tuple[TableSpec, List[str]]:
    """The spec at a smoke size, and what changed: the first SMOKE_IMAGES images of its selection,
    n0 SMOKE_N0, n / n-max SMOKE_N and batch SMOKE_BATCH, every line, sigma, configuration and file as the spec names
    them. Where the spec asks for CUDA and the machine has none (`cuda` False), the runs go to the CPU
    in fp32 without the compiled path. A smoke table checks the files, models and outputs end to end;
    its numbers mean nothing (at n = 1 no image certifies at alpha 0.001)."""
    data = dict(spec.data)
    skip = int(data.get("skip", 1))
    stop = data.get("max")
    data["max"] = min(int(stop), skip * SMOKE_IMAGES) if stop not in (None, -1) else skip * SMOKE_IMAGES
    data["images"] = SMOKE_IMAGES
    run = dict(spec.run, batch=SMOKE_BATCH)
    notes = [f"smoke: {SMOKE_IMAGES} images, n0 {SMOKE_N0}, n {SMOKE_N}: every run end to end; the numbers mean nothing"]
    if str(run.get("device", "cpu")).startswith("cuda") and not cuda:
        run = {k: v for k, v in run.items() if k in CPU_RUN_KEYS}
        run["device"] = "cpu"
        notes.append(f"smoke: no CUDA device here, so the runs go to the CPU (fp32, eager) instead of "
                     f"{spec.run.get('device')}")
    if (data.get("dataset") == "imagenet" and run["device"] == "cpu" and "image_size" not in data
            and not any(line.source == "beit" for line in spec.lines)):
        data["image_size"] = SMOKE_IMAGENET_SIZE
        notes.append(f"smoke: ImageNet images cropped to {SMOKE_IMAGENET_SIZE}x{SMOKE_IMAGENET_SIZE} on the CPU "
                     f"(the same models and weights; 224 costs about a minute per UNet sample here)")
    title = f"{spec.title} [smoke: {SMOKE_IMAGES} images, n {SMOKE_N}; not the paper's numbers]"
    smoke = dataclasses.replace(spec, title=title, n0=SMOKE_N0, n_max=SMOKE_N, data=data, run=run)
    check_requests(smoke, "--smoke")
    return smoke, notes


def _listed_key(where: str, key: str, listed, names: Tuple[str, str, str]) -> float:
    """A table's key read as a number that `listed` holds (a sigma, a radius); `names`: (one, many, the list's
    name) for the one line that refuses it."""
    one, many, listing = names
    try:
        value = float(key)
    except ValueError:
        raise UserError(f"{where}: keys are {many} such as \"0.25\", got {key!r}") from None
    if value not in listed:
        raise UserError(f"{where}: {one} {key} is not in {listing} {list(listed)}")
    return value

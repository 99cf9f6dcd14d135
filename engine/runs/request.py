"""What a certify / predict run was asked to do (from the command line or Python): one frozen record,
parsed and validated once at the boundary, so nothing downstream re-checks or re-parses an option.
engine/runs/resolve.py resolves it into a run (device, batch, fast path, shards, output paths)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple, Union

from diffsmooth.engine.base_classifier.methods import MethodConfig, method_named
from diffsmooth.engine.base_classifier.methods.config import OPTION_ALIASES, option_variants
from diffsmooth.engine.certify.sequential import BOUNDS, DEFAULT_BOUND, DEFAULT_FUTILITY_RULE, FUTILITY_RULES, SequentialRule
from diffsmooth.engine.choices import (
    BACKENDS,
    DEFAULT_ALPHA,
    DEFAULT_LOCAL_NOISE,
    DEFAULT_LOCAL_SIGMA,
    DEFAULT_M,
    DEFAULT_METHOD,
    DEFAULT_N,
    DEFAULT_N0,
    DEFAULT_SEED,
    DEFAULT_SIGMA,
    DEFAULT_SKIP,
    DEFAULT_SPLIT,
    MAX_BATCH,
    MAX_DIFFUSION_STEPS,
    MAX_SAMPLES,
    MAX_SEED,
    MAX_THREADS,
    MAX_WINDOW,
    RUN_PRECISIONS,
)
from diffsmooth.engine.errors import UserError, check_alpha
from diffsmooth.engine.runs.fast_path_options import ASKED, FAST_PATH_OPTIONS, AskedFastPath

MODES = ("certify", "predict")


def parse_radii(text: Union[str, Sequence[float]]) -> Tuple[float, ...]:
    """'0.25,0.5,0.75,1.0' (or the numbers themselves, as a table hands them) -> (0.25, 0.5, 0.75, 1.0):
    finite radii >= 0."""
    try:
        if isinstance(text, str):
            radii = tuple(float(r) for r in text.split(",") if r.strip())
        elif any(isinstance(r, (bool, str)) for r in text):
            raise ValueError("not numbers")
        else:
            radii = tuple(float(r) for r in text)
    except (TypeError, ValueError):
        raise UserError(f"`radii` must be comma-separated numbers, got {text!r}") from None
    if not radii:
        raise UserError("`radii` must name at least one radius")
    if not all(math.isfinite(r) and r >= 0 for r in radii):
        raise UserError(f"`radii` must be finite numbers >= 0, got {text!r}")
    if len(set(radii)) != len(radii):
        raise UserError(f"`radii` names a radius twice, got {text!r}")
    return tuple(r + 0.0 for r in radii)            # -0.0 -> 0.0


def parse_futility(text: Optional[str]) -> Tuple[Optional[str], Optional[float]]:
    """`futility` -> (rule, margin). Not given -> the default rule (pace-floor) at its default margin
    (None); 'off' -> no futility stop (rule None); 'M' -> the default rule at margin M; 'RULE:M' (pace-floor,
    pace, projection) -> that rule at M; 'RULE' alone -> that rule at its default."""
    if text is None:
        return DEFAULT_FUTILITY_RULE, None
    spec = str(text).strip().lower()
    if spec in ("off", "none", "no"):
        return None, None
    if spec in FUTILITY_RULES:
        return spec, None
    rule, _, value = spec.rpartition(":")           # no colon: ("", "", spec), the default rule
    rule = rule or DEFAULT_FUTILITY_RULE
    usage = f"`futility` must be 'off', a margin >= 0, or RULE:MARGIN with RULE in {', '.join(FUTILITY_RULES)}"
    try:
        margin = float(value)
    except ValueError:
        raise UserError(f"{usage}, got {text!r}") from None
    if rule not in FUTILITY_RULES or not (math.isfinite(margin) and margin >= 0):
        raise UserError(f"{usage}, got {text!r}")
    return rule, margin


def parse_bound(text: Optional[str]) -> str:
    """'reach-cp' | 'split-cp' | 'mixture'; not given -> the default bound."""
    if text is None:
        return DEFAULT_BOUND
    bound = str(text).strip().lower()
    if bound not in BOUNDS:
        raise UserError(f"`bound` must be one of {', '.join(BOUNDS)}, got {text!r}")
    return bound


def sequential_rule(radii, sigma: float, alpha: float, n_max: int, futility: Optional[str] = None,
                    bound: Optional[str] = None, schedule_radii=None, decide_largest: bool = False) -> SequentialRule:
    """The rule of a sequential run from its options (radii required; as text or numbers). `schedule_radii` (reach-cp):
    the radii its added looks are placed for, when a run settles only some of them (a table's runs);
    `decide_largest`: stop once the largest radius is decided (the race's extensions)."""
    if not radii:
        raise UserError("`sequential` needs `radii`, e.g. 0.25,0.5,0.75,1.0")
    rule, margin = parse_futility(futility)
    schedule = parse_radii(schedule_radii) if schedule_radii else None
    return SequentialRule(parse_radii(radii), float(sigma), float(alpha), int(n_max), margin,
                          bound=parse_bound(bound), futility_rule=rule, schedule_radii=schedule,
                          decide_largest=bool(decide_largest))


def _positive(name: str, value, allow_none: bool = False, high: Optional[int] = None, low: int = 1) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise UserError(f"`{name}` must be an integer >= {low}, got {value!r}")
    if high is not None and value > high:
        raise UserError(f"`{name}` must be <= {high:,}, got {value!r}")


def _finite(name: str, value, low: float, low_open: bool = False, high: Optional[float] = None) -> None:
    """UserError unless value is a finite number (not a bool) > / >= low (and <= high)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        and (value > low if low_open else value >= low) and (high is None or value <= high)
    if not ok:
        bound = f"{'>' if low_open else '>='} {low:g}" + (f" and <= {high:g}" if high is not None else "")
        raise UserError(f"`{name}` must be a finite number {bound}, got {value!r}")


def _distinct(name: str, values: tuple) -> None:
    if len(set(values)) != len(values):
        raise UserError(f"`{name}` names a value twice: {list(values)}")


# Options holding a name or a path: a string, or None where not given.
_TEXT = ("out", "denoiser", "scheduler", "preset", "unet_config", "schedule", "arch", "normalization", "stats", "dataset",
         "data", "split", "onnx_dir", "device", "shard")
MAX_IMAGE_SIZE = 4096


@dataclass(frozen=True)
class RunRequest:
    """Every option of `certify` / `predict`, as asked; the repeatable ones (a sweep) are tuples and
    `sequential` is the parsed rule (None: fixed-n); the fast path's settings are one AskedFastPath. Build it with
    `RunRequest.parse`."""

    mode: str
    out: str
    # models
    denoiser: Optional[str] = None
    preset: Optional[str] = None
    unet_config: Optional[str] = None
    schedule: Optional[str] = None
    diffusion_steps: Optional[int] = None
    scheduler: Optional[str] = None                # a diffusers UNet folder's scheduler folder
    classifier: Tuple[str, ...] = ()
    arch: Optional[str] = None
    normalization: Optional[str] = None
    stats: Optional[str] = None
    # method
    method: Tuple[str, ...] = (DEFAULT_METHOD,)
    sigma: float = DEFAULT_SIGMA
    local_sigma: Tuple[float, ...] = (DEFAULT_LOCAL_SIGMA,)
    m: Tuple[int, ...] = (DEFAULT_M,)
    local_noise: str = DEFAULT_LOCAL_NOISE
    method_options: Tuple[Tuple[str, str], ...] = ()    # (name, value) settings a method adds (`--option NAME=VALUE`)
    # data and Monte Carlo
    dataset: Optional[str] = None
    data: Optional[str] = None
    split: str = DEFAULT_SPLIT
    n0: int = DEFAULT_N0
    n: int = DEFAULT_N
    alpha: float = DEFAULT_ALPHA
    batch: Optional[int] = None
    skip: int = DEFAULT_SKIP
    max_index: Optional[int] = None
    image_size: Optional[int] = None               # ImageNet-style folders: crop to this size (smoke runs)
    seed: int = DEFAULT_SEED
    # execution
    backend: str = "torch"
    onnx_dir: Optional[str] = None
    device: str = "cpu"
    precision: str = "fp32"
    asked_fast_path: AskedFastPath = AskedFastPath()    # compile, cuda_graphs, ... (fast_path_options.py's table)
    validate_samples: int = 500
    validate_images: int = 4
    expected_flip_rate: Optional[float] = None      # None: the measured rate of the run's methods and precision
    shard: Optional[str] = None
    window: Optional[int] = None
    threads: Optional[int] = None
    quiet: bool = False
    sequential: Optional[SequentialRule] = None

    @classmethod
    def parse(cls, mode: str, *, sequential: bool = False, radii=None, n_max: Optional[int] = None,
              futility: Optional[str] = None, bound: Optional[str] = None, schedule_radii=None,
              decide_largest: bool = False, **options) -> "RunRequest":
        """From option values (click's keyword arguments, or a Python caller's): lists become tuples,
        the sequential options become a SequentialRule, the fast path's (`compile`, ...: fast_path_options.ASKED)
        one AskedFastPath, and everything is checked once."""
        for key in ("classifier", "method", "local_sigma", "m"):
            value = options.get(key)
            if value is not None and not isinstance(value, (list, tuple)):
                value = (value,)
            options[key] = tuple(value) if value is not None else ()
        for key in ("method", "local_sigma", "m"):
            options[key] = options[key] or cls.__dataclass_fields__[key].default
        options["asked_fast_path"] = AskedFastPath(**{k: options.pop(k) for k in ASKED if k in options})
        rule = None
        if sequential:
            if mode != "certify":
                raise UserError("`sequential` belongs to certify")
            rule = sequential_rule(radii, options.get("sigma", DEFAULT_SIGMA), options.get("alpha", DEFAULT_ALPHA),
                                   n_max or options.get("n", DEFAULT_N), futility, bound, schedule_radii,
                                   decide_largest)
        elif radii or n_max or futility or bound or schedule_radii or decide_largest:
            raise UserError("`radii`, `n_max`, `futility`, `bound`, `schedule_radii` and `decide_largest` belong to "
                            "`sequential`")
        return cls(mode=mode, sequential=rule, **options)

    def __post_init__(self):
        if self.mode not in MODES:
            raise UserError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if isinstance(self.sigma, bool) or not (isinstance(self.sigma, (int, float)) and math.isfinite(self.sigma)
                                                and self.sigma > 0):
            raise UserError(f"sigma must be > 0 and finite, got {self.sigma!r}")
        check_alpha(self.alpha)
        for name in _TEXT:
            value = getattr(self, name)
            if not (isinstance(value, str) or (value is None and name != "out")):
                raise UserError(f"`{name}` must be a {'path' if name in ('out', 'data', 'onnx_dir') else 'name'}, "
                                f"got {value!r}")
        if not self.out:
            raise UserError("`out` must name a result file")
        for name in ("n0", "n", "skip"):
            _positive(name, getattr(self, name))
        for name, high in (("batch", MAX_BATCH), ("window", MAX_WINDOW), ("threads", MAX_THREADS), ("max_index", None),
                           ("image_size", MAX_IMAGE_SIZE),
                           ("diffusion_steps", MAX_DIFFUSION_STEPS), ("validate_images", None)):
            _positive(name, getattr(self, name), allow_none=name != "validate_images", high=high)
        _positive("seed", self.seed, low=0, high=MAX_SEED)
        _positive("validate_samples", self.validate_samples, low=0, high=MAX_SAMPLES)
        if self.expected_flip_rate is not None:
            _finite("expected_flip_rate", self.expected_flip_rate, 0.0, low_open=True, high=1.0)
        samples = self.n if self.mode == "predict" else self.n0 + (self.n if self.sequential is None
                                                                   else self.sequential.n_max)
        if samples > MAX_SAMPLES:
            raise UserError(f"{'`n`' if self.mode == 'predict' else '`n0` + `n`'} must be <= {MAX_SAMPLES:,} samples "
                            f"per image (Monte Carlo sample indices are 32-bit), got {samples:,}")
        if not isinstance(self.quiet, bool):
            raise UserError(f"`quiet` must be true or false, got {self.quiet!r}")
        if not isinstance(self.asked_fast_path, AskedFastPath):
            raise UserError(f"`asked_fast_path` must be an AskedFastPath, got {self.asked_fast_path!r}")
        if self.backend not in BACKENDS:
            raise UserError(f"unknown backend {self.backend!r}: choose one of {', '.join(BACKENDS)}")
        if self.precision not in RUN_PRECISIONS:
            raise UserError(f"`precision` must be one of {', '.join(RUN_PRECISIONS)}, got {self.precision!r}")
        if not all(isinstance(c, str) and c for c in self.classifier):
            raise UserError(f"`classifier` must name checkpoint files, got {list(self.classifier)!r}")
        for name in ("method", "local_sigma", "m", "classifier"):
            _distinct(name, getattr(self, name))
        self.options_for(self.method[0])        # every option named belongs to a method of the run
        for method in self.method:              # every configuration asked for is valid (its settings checked)
            for own in self.option_variants(method):
                MethodConfig(method, self.sigma, options=own)
        if self.is_sweep:
            if self.mode == "predict":
                raise UserError("predict takes one configuration: give each of `method` / `classifier` / "
                                "`local_sigma` / `m` once")
            if self.shard:
                raise UserError("a sweep runs in one process (no `shard`)")
            changed = next((o.name for o in FAST_PATH_OPTIONS if o.single and getattr(self.asked_fast_path, o.name)),
                           None)
            if changed:
                raise UserError(f"`{changed}` is for single configurations; sweeps run the classifiers as they are")

    def replace(self, **changes) -> "RunRequest":
        return dataclasses.replace(self, **changes)

    @property
    def is_sweep(self) -> bool:
        return any(len(v) > 1 for v in (self.method, self.local_sigma, self.m, self.classifier)) or \
            any(len(self.option_variants(method)) > 1 for method in self.method)

    def option_variants(self, method: str):
        """The settings of each of `method`'s configurations: several where a sweepable setting has several
        values (`--option reverse_runs=1,3,5`)."""
        return option_variants(method_named(method), self.options_for(method))

    @property
    def classifier_path(self) -> Optional[str]:
        """The single run's classifier checkpoint (None: the demo classifier)."""
        return self.classifier[0] if self.classifier else None

    def options_for(self, method: str) -> Tuple[Tuple[str, str], ...]:
        """The `method_options` that belong to `method` (a sweep's methods each take their own); an option no
        method of the run has is refused in one line."""
        given = dict(self.method_options)
        if len(given) != len(self.method_options):
            raise UserError("each method option is given once (`--option NAME=VALUE`)")
        has = {o.name for name in self.method for o in method_named(name).options}
        unknown = sorted(set(given) - has)
        if unknown:
            where = f"method {self.method[0]} has" if len(self.method) == 1 else f"methods {', '.join(self.method)} have"
            known = f": the settings there are {', '.join(sorted(has))}" if has else " (no settings of its own)"
            raise UserError(f"{where} no setting {', '.join(map(repr, unknown))}{known}")
        mine = {o.name for o in method_named(method).options}
        own = {name: self.aliased(name) for name in OPTION_ALIASES if name in mine and hasattr(self, name)}
        own.update((k, v) for k, v in self.method_options if k in mine)
        return tuple(own.items())

    def aliased(self, name: str):
        """The value of an option given by its alias (`--m`, `--local-sigma`, `--local-noise`: OPTION_ALIASES):
        one value, or a list of several (a sweep)."""
        value = getattr(self, name)
        return (list(value) if len(value) > 1 else value[0]) if isinstance(value, tuple) else value

    def method_config(self) -> MethodConfig:
        """The single run's method."""
        return MethodConfig(self.method[0], self.sigma, options=self.options_for(self.method[0]))

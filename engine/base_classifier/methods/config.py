"""MethodConfig: which method the base classifier is, at which sigma, with its settings: the options its purifier
and head declare (MethodOption), declared once and checked here for the command line, a spec and the API."""

from __future__ import annotations

import itertools
import math
import numbers
from dataclasses import InitVar, dataclass
from functools import cached_property
from typing import Any, List, Optional, Tuple

from diffsmooth.engine.base_classifier.methods.registry import method_named
from diffsmooth.engine.errors import UserError


@dataclass(frozen=True)
class MethodOption:
    """A setting of a method's purifier or head (DiffSmooth's m, DensePure's reverse runs): its name (`--option
    NAME=VALUE`, a spec line's key, a Python keyword), its type (int, float, or str with `choices`), default,
    smallest and largest value, and help. `sweepable`: several values (`NAME=1,3,5`, a list) make a sweep whose
    configurations share one purify stage. `recorded`: a run's settings file records it (False: an API-only
    setting a run keeps at its default, so files written before it existed still resume). `preview`: the value the
    preflight's variants use where it is cheaper (DiffSmooth's m = 1)."""

    name: str
    kind: type
    default: Any
    low: Optional[float] = None
    high: Optional[float] = None
    help: str = ""
    sweepable: bool = False
    choices: Tuple[str, ...] = ()
    recorded: bool = True
    label: str = ""                     # how reports name it (default: its name)
    preview: Any = None                 # the value a quick look (the preflight's variants) takes, where cheaper

    @property
    def shown(self) -> str:
        return self.label or self.name

    def value(self, given, method: str):
        """`given` (a number, or the text of `--option`) as this option's type, or one line saying why not."""
        what = f"{method} setting {self.name}"
        if self.choices:
            if given not in self.choices:
                raise UserError(f"{what} must be one of {', '.join(self.choices)}, got {given!r}")
            return given
        if isinstance(given, str):
            try:
                given = self.kind(given.strip())
            except ValueError:
                raise UserError(f"{what} must be {'an integer' if self.kind is int else 'a number'}, "
                                f"got {given!r}") from None
        if isinstance(given, bool) or not isinstance(given, numbers.Real) or not math.isfinite(given) or (
                self.kind is int and not isinstance(given, numbers.Integral)):
            raise UserError(f"{what} must be {'an integer' if self.kind is int else 'a finite number'}, got {given!r}")
        if (self.low is not None and given < self.low) or (self.high is not None and given > self.high):
            bounds = f"{self.low:g}..{self.high:g}" if self.high is not None else f">= {self.low:g}"
            raise UserError(f"{what} must be {bounds}, got {given}")
        return self.kind(given)


def option_variants(method, given) -> List[Tuple[Tuple[str, Any], ...]]:
    """The settings of each configuration `given` asks for: one, unless a sweepable option has several values
    (`1,3,5` or a list), whose every combination is one; several values of another option are refused in one line."""
    given = dict(given or ())
    declared = {o.name: o for o in method.options}
    choices = []
    for name, value in given.items():
        values = value.split(",") if isinstance(value, str) else value
        values = list(values) if isinstance(values, (list, tuple)) else [values]
        if len(values) > 1 and not (name in declared and declared[name].sweepable):
            raise UserError(f"{method.name} setting {name} takes one value, got {value!r}")
        if len(set(map(str, values))) != len(values):
            raise UserError(f"{method.name} setting {name} repeats a value: {value!r}")
        choices.append([(name, v) for v in values])
    return [tuple(combination) for combination in itertools.product(*choices)]


def checked_options(method, given) -> Tuple[Tuple[str, Any], ...]:
    """`given` with each value checked and of the method's type, a sweepable setting's several values as a tuple
    (a spec line's settings); a wrong one refused in one line."""
    variants = [dict(resolve_options(method, variant)) for variant in option_variants(method, given)]
    return tuple((name, tuple(dict.fromkeys(v[name] for v in variants)) if isinstance(value, (list, tuple))
                  else variants[0][name]) for name, value in dict(given or ()).items())


def resolve_options(method, given) -> Tuple[Tuple[str, Any], ...]:
    """The method's options, as (name, value) pairs in its own order: those `given` (a dict or pairs) checked,
    the rest at their defaults; a name the method does not have is refused in one line."""
    given = dict(given or ())
    declared = {o.name: o for o in method.options}
    unknown = sorted(set(given) - set(declared))
    if unknown:
        has = f"its settings are {', '.join(declared)}" if declared else "it has no settings of its own"
        raise UserError(f"method {method.name} has no setting {', '.join(map(repr, unknown))}: {has}")
    return tuple((o.name, o.value(given[o.name], method.name) if o.name in given else o.default) for o in method.options)


# The keywords DiffSmooth's settings had before they were its head's options (`MethodConfig(..., m=5)`, `--m`,
# a spec's `m` key): each sets the option of that name where the method has one, and is ignored where it has not
# (as the command line's --m is for rs): docs/extending.md.
OPTION_ALIASES = ("local_sigma", "m", "local_noise", "local_noise_seed")


@dataclass(frozen=True)
class MethodConfig:
    """What the base classifier is: `name` (a registered method's), smoothing sigma, and `options`: the settings its
    purifier and head declare, as (name, value) pairs in their order, checked, defaults filled in. `m`,
    `local_sigma`, `local_noise`, `local_noise_seed` are aliases of the options of those names (OPTION_ALIASES)."""

    name: str
    sigma: float
    m: InitVar[Optional[int]] = None
    local_sigma: InitVar[Optional[float]] = None
    local_noise: InitVar[Optional[str]] = None
    local_noise_seed: InitVar[Optional[int]] = None
    options: Tuple[Tuple[str, Any], ...] = ()

    def __post_init__(self, m, local_sigma, local_noise, local_noise_seed):
        method = method_named(self.name)            # an unknown method: one line
        declared = {o.name for o in method.options}
        given = dict(m=m, local_sigma=local_sigma, local_noise=local_noise, local_noise_seed=local_noise_seed)
        aliased = {name: given[name] for name in OPTION_ALIASES if given[name] is not None and name in declared}
        object.__setattr__(self, "options", resolve_options(method, {**dict(self.options or ()), **aliased}))
        if not (isinstance(self.sigma, numbers.Real) and math.isfinite(self.sigma) and self.sigma > 0):
            raise UserError(f"sigma must be > 0 and finite, got {self.sigma}")

    @property
    def method(self):
        """The registered Method that runs this config (engine/base_classifier/methods/)."""
        return method_named(self.name)

    @cached_property
    def purifier(self):
        """Its method's purifier, configured with its settings (a Part)."""
        return self.method.purifier(**self._own(self.method.purifier))

    @cached_property
    def head(self):
        """Its method's head, configured with its settings (a Part)."""
        return self.method.head(**self._own(self.method.head))

    def _own(self, part) -> dict:
        names = {o.name for o in part.options}
        return {name: value for name, value in self.options if name in names}

    def option(self, name: str):
        """The value of one of its settings (its purifier's and head's MethodOptions)."""
        return dict(self.options)[name]

    def replace(self, **settings) -> "MethodConfig":
        """This config with some settings changed (sigma, or option values by name)."""
        sigma = settings.pop("sigma", self.sigma)
        return MethodConfig(self.name, sigma, options={**dict(self.options), **settings})

    def as_dict(self) -> dict:
        """The method, sigma and every setting (what result files record)."""
        return {"method": self.name, "sigma": self.sigma, **dict(self.options)}

"""The one place a method's name becomes its class: every method registers here, and an unknown name is
refused in one line on every path (the command line, a table spec, the Python API, a manifest)."""

from __future__ import annotations

from typing import Dict, Tuple

from diffsmooth.engine.errors import UserError

_METHODS: Dict[str, object] = {}           # name -> the Method subclass's one instance (methods/base.py)
FLIP_PRECISIONS = ("fp16", "bf16")          # the reduced precisions whose vote flips the run-time check expects


def register(cls: type) -> type:
    """Make `cls` (a Method subclass with a new `name`) a method of the engine; returns it (a class decorator)."""
    if not cls.name or not isinstance(cls.name, str):
        raise ValueError(f"{cls.__name__} needs a `name`")
    if cls.name in _METHODS and type(_METHODS[cls.name]) is not cls:
        raise ValueError(f"method {cls.name!r} is registered already ({type(_METHODS[cls.name]).__name__})")
    rates = getattr(cls, "flip_rates", None) or {}
    missing = [bits for bits in FLIP_PRECISIONS if not isinstance(rates.get(bits), float) or not 0 < rates[bits] < 1]
    if missing:     # an fp16 / bf16 run checks its votes against eager fp32 at this rate (engine/runs/vote_agreement.py)
        raise UserError(f"method {cls.name!r} needs `flip_rates` for {' and '.join(missing)} (per-sample vote flips "
                        f"of a correct reduced-precision path against eager fp32, in (0, 1); docs/extending.md)")
    _METHODS[cls.name] = cls()
    return cls


def unregister(name: str) -> None:
    """Forget a method registered with `register` (a plug-in's or a test's)."""
    _METHODS.pop(name, None)


def method_named(name):
    """The registered method called `name`; an unknown one is refused in one line."""
    found = _METHODS.get(name) if isinstance(name, str) else None
    if found is None:
        raise UserError(f"unknown method {name!r}: choose one of {', '.join(_METHODS)}")
    return found


def method_names() -> Tuple[str, ...]:
    """Every registered method's name, the built-in ones first (rs, dds, diffsmooth)."""
    return tuple(_METHODS)

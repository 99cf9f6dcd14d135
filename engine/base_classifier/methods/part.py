"""What a purifier and a head share: each is configured by its constructor (`LocalSmoothingHead(m=5, local_sigma=0.25)`,
`ReverseChainsPurifier(reverse_runs=10, steps=2)`, `OneShotPurifier()`), its settings the keywords its class declares once
as `options` (MethodOption: type, range, default, help), checked here and read back as attributes (`head.m`). A
MethodConfig configures its method's two parts from its options; the Python API may hand configured parts itself."""

from __future__ import annotations

from typing import Any, ClassVar, Dict, Tuple

from diffsmooth.engine.base_classifier.methods.config import MethodOption
from diffsmooth.engine.errors import UserError


class Part:
    """A configured purifier or head: `settings` in the order its class declares them, defaults filled in."""

    options: ClassVar[Tuple[MethodOption, ...]] = ()

    def __init__(self, **settings):
        declared = {o.name: o for o in self.options}
        unknown = sorted(set(settings) - set(declared))
        name = type(self).__name__
        if unknown:
            has = f"its settings are {', '.join(declared)}" if declared else "it has no settings"
            raise UserError(f"{name} has no setting {', '.join(map(repr, unknown))}: {has}")
        self._settings = tuple((o.name, o.value(settings[o.name], name) if o.name in settings else o.default)
                               for o in self.options)

    @property
    def settings(self) -> Dict[str, Any]:
        """Its settings by name (what a MethodConfig records of it)."""
        return dict(self._settings)

    def __getattr__(self, name: str):
        for key, value in self.__dict__.get("_settings", ()):       # a declared setting, by its name
            if key == name:
                return value
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def __eq__(self, other) -> bool:
        return type(other) is type(self) and other._settings == self._settings

    def __hash__(self) -> int:
        return hash((type(self), self._settings))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self._settings)})"

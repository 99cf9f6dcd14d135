"""The base classifiers, one class each in its own file here (docs/extending.md, docs/methods.md): `rs` (no
denoiser), `dds` (one-shot denoise, plain classifier), `diffsmooth` (one-shot denoise + local smoothing over m noises
of std sigma'), and every other name of engine/choices.py's METHODS, the one list of the built-in methods: each is
imported from NAME.py and registered here, in that order. `MethodConfig` names one and carries its settings;
`method_named` turns a name into its class."""

import importlib

from diffsmooth.engine.base_classifier.methods.base import Method
from diffsmooth.engine.base_classifier.methods.config import MethodConfig
from diffsmooth.engine.base_classifier.methods.registry import method_named, method_names, register, unregister
from diffsmooth.engine.choices import METHODS


def _built_in(name: str) -> type:
    """The Method subclass called `name` that methods/NAME.py defines."""
    module = importlib.import_module(f"{__name__}.{name}")
    found = [v for v in vars(module).values()
             if isinstance(v, type) and issubclass(v, Method) and v.__module__ == module.__name__ and v.name == name]
    if len(found) != 1:
        raise ImportError(f"{module.__name__} must define one Method subclass named {name!r}, found {len(found)}")
    return found[0]


BUILT_IN = tuple(_built_in(name) for name in METHODS)
for _method in BUILT_IN:
    register(_method)

__all__ = ["BUILT_IN", "Method", "MethodConfig", "method_named", "method_names", "register", "unregister"]

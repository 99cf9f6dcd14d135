"""The base classifiers, one class each, registered here in one place (docs/extending.md): `rs` (no denoiser),
`dds` (one-shot denoise, plain classifier), `diffsmooth` (one-shot denoise + local smoothing over m noises of
std sigma'). `MethodConfig` names one and carries its settings; `method_named` turns a name into its class."""

from diffsmooth.engine.base_classifier.methods.base import Method
from diffsmooth.engine.base_classifier.methods.config import MethodConfig
from diffsmooth.engine.base_classifier.methods.dds import DenoisedSmoothingMethod
from diffsmooth.engine.base_classifier.methods.diffsmooth import DiffSmoothMethod
from diffsmooth.engine.base_classifier.methods.registry import method_named, method_names, register, unregister
from diffsmooth.engine.base_classifier.methods.rs import RandomizedSmoothingMethod

BUILT_IN = (RandomizedSmoothingMethod, DenoisedSmoothingMethod, DiffSmoothMethod)
for _method in BUILT_IN:
    register(_method)

__all__ = ["BUILT_IN", "Method", "MethodConfig", "method_named", "method_names", "register", "unregister"]

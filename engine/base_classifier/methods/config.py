"""MethodConfig: which method the base classifier is, at which sigma, with the settings the method reads."""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass

from diffsmooth.engine.base_classifier.methods.registry import method_named
from diffsmooth.engine.choices import DEFAULT_LOCAL_NOISE, DEFAULT_LOCAL_SIGMA, DEFAULT_M, FIXED_LOCAL_NOISE_SEED
from diffsmooth.engine.errors import UserError


@dataclass(frozen=True)
class MethodConfig:
    """What the base classifier is: method (a registered name), smoothing sigma, and the settings methods read
    (DiffSmooth's m, sigma' and local noises); each method validates its own."""

    method: str
    sigma: float
    m: int = DEFAULT_M
    local_sigma: float = DEFAULT_LOCAL_SIGMA
    local_noise: str = DEFAULT_LOCAL_NOISE
    local_noise_seed: int = FIXED_LOCAL_NOISE_SEED

    def __post_init__(self):
        kind = method_named(self.method)            # an unknown method: one line
        if not (isinstance(self.sigma, numbers.Real) and math.isfinite(self.sigma) and self.sigma > 0):
            raise UserError(f"sigma must be > 0 and finite, got {self.sigma}")
        kind.validate(self)

    @property
    def kind(self):
        """The registered Method that runs this config (engine/base_classifier/methods/)."""
        return method_named(self.method)

    @property
    def uses_denoiser(self) -> bool:
        return self.kind.denoises

    def as_dict(self) -> dict:
        """The method, sigma and the settings its method reads (what result files record)."""
        keep = {"method", "sigma", *self.kind.settings}
        return {k: v for k, v in asdict(self).items() if k in keep}

"""What a certify/predict/sweep run was asked to do: one typed record of every option, and the
part of it a result file records (a resumed run must match it)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from diffsmooth.engine.base_classifier.methods import MethodConfig
from diffsmooth.engine.certify.sequential import SequentialRule, rule_from_options
from diffsmooth.engine.errors import UserError

# What determines the rows of a result file, in the order the settings file has always listed them.
RECORDED = ("method", "sigma", "local_sigma", "m", "local_noise", "n0", "n", "alpha", "seed",
            "dataset", "data", "split", "denoiser", "preset", "unet_config", "classifier", "arch",
            "normalization", "stats", "backend", "precision", "batch", "fast_path")


@dataclass(frozen=True)
class RunSettings:
    """Every option of `certify` / `predict`; the repeatable ones (a sweep) are tuples."""

    out: str
    # models
    denoiser: str | None = None
    preset: str | None = None
    unet_config: str | None = None
    schedule: str | None = None
    diffusion_steps: int | None = None
    classifier: tuple[str, ...] = ()
    arch: str | None = None
    normalization: str | None = None
    stats: str | None = None
    # method
    method: tuple[str, ...] = ("diffsmooth",)
    sigma: float = 0.5
    local_sigma: tuple[float, ...] = (0.25,)
    m: tuple[int, ...] = (5,)
    local_noise: str = "fixed"
    # data and Monte Carlo
    dataset: str | None = None
    data: str | None = None
    split: str = "test"
    n0: int = 100
    n: int = 10000
    alpha: float = 0.001
    batch: int | None = None
    skip: int = 1
    max_index: int | None = None
    seed: int = 0
    # execution
    backend: str = "torch"
    onnx_dir: str | None = None
    device: str = "cpu"
    precision: str = "fp32"
    compile: bool | None = None
    cuda_graphs: bool | None = None
    streams: int | None = None
    fused_attention: bool | None = None
    fused_conv: bool = False
    validate_samples: int = 500
    validate_images: int = 4
    expected_flip_rate: float = 1.3e-4
    shard: str | None = None
    window: int | None = None
    threads: int | None = None
    quiet: bool = False
    # sequential stopping
    sequential: bool = False
    radii: str | None = None
    n_max: int | None = None
    futility: str | None = None
    bound: str | None = None
    # resolved when the run is prepared
    fast_path: dict | None = field(default=None, compare=False)

    @classmethod
    def from_options(cls, **options) -> RunSettings:
        """From click's keyword arguments (lists become tuples)."""
        for key in ("classifier", "method", "local_sigma", "m"):
            value = options.get(key)
            options[key] = tuple(value) if value is not None else ()
        return cls(**options)

    def replace(self, **changes) -> RunSettings:
        return dataclasses.replace(self, **changes)

    @property
    def is_sweep(self) -> bool:
        return any(len(v) > 1 for v in (self.method, self.local_sigma, self.m, self.classifier))

    @property
    def classifier_path(self) -> str | None:
        """The single run's classifier checkpoint (None: the demo classifier)."""
        return self.classifier[0] if self.classifier else None

    def method_config(self) -> MethodConfig:
        """The single run's method (validates sigma, sigma' and m)."""
        return MethodConfig(self.method[0], self.sigma, self.m[0], self.local_sigma[0], self.local_noise)

    def sequential_rule(self) -> SequentialRule | None:
        """The SequentialRule of a --sequential run, else None."""
        if not self.sequential:
            if self.radii or self.n_max or self.futility or self.bound:
                raise UserError("`radii`, `n_max`, `futility` and `bound` belong to `sequential`")
            return None
        return rule_from_options(self.radii, self.sigma, self.alpha, self.n_max or self.n, self.futility,
                                 self.bound)

    def recorded(self, mode: str) -> dict:
        """What determines the rows of a result file (a resumed run must match it)."""
        settings = {k: getattr(self, k) for k in RECORDED}
        if self.is_sweep:
            settings.update(method=list(self.method), local_sigma=list(self.local_sigma), m=list(self.m),
                            classifier=list(self.classifier))
        else:
            settings.update(method=self.method[0], local_sigma=self.local_sigma[0], m=self.m[0],
                            classifier=self.classifier_path)
        # Counts repeat exactly at a fixed batch size, precision and kernel choice; across batch sizes
        # only on CPU fp32 (measured on CUDA: fp16 changed 10 of 30,000 votes): a resume must match all.
        settings["device_type"] = str(self.device).split(":")[0]
        settings["mode"] = mode
        if mode == "predict":
            settings.pop("n0")
        rule = self.sequential_rule()
        if rule is not None:
            settings.pop("n")                       # n only sets n-max's default
            settings.update(sequential=True, radii=list(rule.radii), n_max=rule.n_max, futility=rule.describe_futility(),
                            look_growth=rule.growth, bound=rule.bound)
        if not self.is_sweep and self.method[0] != "diffsmooth":
            for k in ("local_sigma", "m", "local_noise"):
                settings.pop(k)
        return settings

"""The models a server serves: the shipped demo models (`--demo`: rs, dds, diffsmooth) or a folder of small TOML
files, one per model (its method, sigma, checkpoints and settings), each a smoothed classifier of the Python API, on
eager fp32 or on the fast path (compiled, fp16 / bf16), which is checked against eager fp32 before the server is
ready, as every offline run is."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from diffsmooth.engine.base_classifier.denoise import load_denoiser
from diffsmooth.engine.base_classifier.methods import method_named
from diffsmooth.engine.data import load_dataset
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.hashing import sha256_path
from diffsmooth.engine.models import shipped
from diffsmooth.engine.models.checkpoints import load_classifier
from diffsmooth.engine.pipelines import SmoothedClassifier, method_config, smoothed_classifier
from diffsmooth.engine.runs.fast_path import VALIDATE_IMAGES

DEMO_MODELS = (("rs", {}), ("dds", {}), ("diffsmooth", {"m": 5}))
DEMO_SIGMA = 0.5
DEFAULT_BATCH = 200
KEYS = {"method", "sigma", "classifier", "denoiser", "stats", "arch", "preset", "image_shape", "batch", "settings",
        "check_dataset", "check_data"}


@dataclass(frozen=True)
class Execution:
    """How every served model runs: the device, the precision and whether the stages compile (None: on for CUDA)."""

    device: str = "cpu"
    precision: str = "fp32"
    compile: Optional[bool] = False


@dataclass
class ServedModel:
    """One served model: its name, the smoothed classifier, the image shape it takes, its files' digests, the batch
    of its scheduler and the settings its metadata shows."""

    name: str
    smoothed: SmoothedClassifier
    image_shape: Tuple[int, ...]
    digests: Dict[str, str]
    batch: int = DEFAULT_BATCH
    settings: Dict = field(default_factory=dict)
    check: Optional[Tuple[str, Optional[str]]] = None     # the agreement check's dataset (kind, path), if given

    @property
    def method(self) -> str:
        return self.smoothed.config.name

    @property
    def sigma(self) -> float:
        return self.smoothed.sigma

    def pipeline(self):
        """The model's Monte Carlo voter, built once (the Python API's own, for its image shape)."""
        return self.smoothed.smooth_for(self.image_shape).pipeline

    def check_fast_path(self) -> int:
        """On a compiled or fp16 / bf16 path, the Python API's agreement check against eager fp32 on the first
        VALIDATE_IMAGES images of the check dataset (a path that disagrees is refused in one line); how many were
        checked (0 on eager fp32, which needs none)."""
        if not self.smoothed.checks_against_eager:
            return 0
        if self.check is None:
            raise UserError(f"model {self.name}: its fast path (compiled, or fp16 / bf16) is checked against eager fp32 "
                            f"before serving: give `check_dataset` (and `check_data`) in its file, or serve with "
                            f"--no-compile --precision fp32")
        dataset = load_dataset(*self.check)
        if tuple(dataset.image_shape) != self.image_shape:
            raise UserError(f"model {self.name}: the check dataset's images are {tuple(dataset.image_shape)}, the "
                            f"model takes {self.image_shape}")
        images = [(index, dataset[index][0]) for index in range(min(VALIDATE_IMAGES, len(dataset)))]
        for first in images:
            self.smoothed.smooth_for(self.image_shape, first)
        return len(images)


def _build(name: str, entry: dict, seed: int, execution: Execution, folder: Optional[Path]) -> ServedModel:
    """A ServedModel from one model's entries (a TOML file's, or a demo model's); "demo" names a shipped file."""
    unknown = sorted(set(entry) - KEYS)
    if unknown:
        raise UserError(f"model {name}: unknown key `{unknown[0]}`; known: {', '.join(sorted(KEYS))}")
    for key in ("method", "sigma", "classifier"):
        if key not in entry:
            raise UserError(f"model {name}: `{key}` is required")
    settings = dict(entry.get("settings", {}))
    config = method_config(str(entry["method"]), float(entry["sigma"]), settings)
    demo = entry["classifier"] == "demo"
    classifier_path = method_named(config.name).demo_classifier(config) if demo else _path(entry["classifier"], folder)
    classifier = load_classifier(classifier_path, arch=entry.get("arch"),
                                 dataset=entry.get("stats", shipped.DEMO_STATS if demo else "cifar10"))
    digests = {"classifier": sha256_path(classifier_path)}
    denoiser = None
    if config.purifier.denoises:
        if "denoiser" not in entry:
            raise UserError(f"model {name}: method {config.name} needs `denoiser`")
        denoiser_path = shipped.DEMO_UNET if entry["denoiser"] == "demo" else _path(entry["denoiser"], folder)
        preset = entry.get("preset", shipped.DEMO_PRESET if entry["denoiser"] == "demo" else "cifar10")
        denoiser = load_denoiser(denoiser_path, preset)
        digests["denoiser"] = sha256_path(denoiser_path)
    shape = tuple(int(d) for d in entry.get("image_shape", (1, 32, 32) if demo else ()))
    if len(shape) != 3 or min(shape) < 1:
        raise UserError(f"model {name}: `image_shape` must be [C, H, W], got {list(shape)}")
    batch = int(entry.get("batch", DEFAULT_BATCH))
    smoothed = smoothed_classifier(config.name, classifier=classifier, denoiser=denoiser, sigma=config.sigma,
                                   seed=seed, device=execution.device, precision=execution.precision,
                                   compile=execution.compile, batch=batch, **settings)
    check = ("embedded", None) if demo else None
    if "check_dataset" in entry:
        data = entry.get("check_data")
        check = (str(entry["check_dataset"]), None if data is None else str(_path(data, folder)))
    return ServedModel(name, smoothed, shape, digests, batch, config.as_dict(), check)


def _path(text, folder: Optional[Path]) -> Path:
    path = Path(str(text)).expanduser()
    path = path if path.is_absolute() or folder is None else folder / path
    if not path.exists():
        raise UserError(f"no such model file: {path}")
    return path


def demo_models(seed: int, execution: Execution = Execution(), batch: int = DEFAULT_BATCH) -> List[ServedModel]:
    """The shipped demo models as rs, dds and diffsmooth (sigma 0.5; DiffSmooth m = 5; checked on the embedded set)."""
    shipped.require_demo_assets()
    return [_build(name, {"method": name, "sigma": DEMO_SIGMA, "classifier": "demo", "denoiser": "demo",
                          "batch": batch, "settings": settings}, seed, execution, None)
            for name, settings in DEMO_MODELS]


def folder_models(folder, seed: int, execution: Execution = Execution()) -> List[ServedModel]:
    """One model per `NAME.toml` in `folder` (docs/serving.md shows one)."""
    folder = Path(folder)
    files = sorted(folder.glob("*.toml")) if folder.is_dir() else []
    if not files:
        raise UserError(f"no model files (*.toml) in {folder}")
    models = []
    for file in files:
        try:
            entry = tomllib.loads(file.read_text())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise UserError(f"{file}: not a TOML file ({str(exc).splitlines()[0]})") from None
        models.append(_build(file.stem, entry, seed, execution, folder))
    return models

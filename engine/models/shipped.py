"""Where the shipped demo models live (package data in engine/demo/assets/) and which demo classifier
serves which method: the one trained at the noise level the method feeds it (sigma for RS, sigma'
for DiffSmooth, clean for DDS). Facts about model files, so runs/ can name them without the demo."""

from __future__ import annotations

from pathlib import Path

from diffsmooth.engine.errors import UserError

ASSETS = Path(__file__).resolve().parent.parent / "demo" / "assets"
DEMO_UNET = ASSETS / "demo_unet.pt"
DEMO_MANIFEST = ASSETS / "MODELS.json"
DEMO_PRESET = "demo"
DEMO_DATASET = "embedded"
DEMO_STATS = "fashion-mnist"
DEMO_TRAINING_SIGMAS = (0.0, 0.25, 0.5)


def demo_classifier_path(noise_sigma: float) -> Path:
    """The demo classifier trained with Gaussian augmentation of std `noise_sigma` (0 = clean)."""
    return ASSETS / f"demo_classifier_s{noise_sigma:.2f}.pt"


def demo_classifier_for(method: str, sigma: float, local_sigma: float) -> Path:
    """The demo classifier matching the noise level the method's classifier sees."""
    level = {"rs": sigma, "dds": 0.0, "diffsmooth": local_sigma}[method]
    path = demo_classifier_path(level)
    if not path.exists():
        have = ", ".join(f"{s:g}" for s in DEMO_TRAINING_SIGMAS)
        raise UserError(f"no embedded demo classifier for noise level {level:g} (method {method}); "
                        f"the demo ships {have}: pick one of those or pass `classifier`")
    return path


def require_demo_assets() -> None:
    if not DEMO_UNET.exists():
        raise UserError(f"the embedded demo models are missing ({DEMO_UNET}); "
                        f"run `diffsmooth train-demo` to create them")

"""Where the shipped demo models live (package data in engine/demo/assets/) and which demo classifier
serves which method: the one trained at the noise level the method feeds it (sigma for RS, sigma'
for DiffSmooth, clean for DDS). Facts about model files, so runs/ can name them without the demo.

DEMO_TRAINING_SIGMAS is the one list of the demo classifiers' noise levels: training (engine/demo/training.py,
`diffsmooth train-demo`), the choice of classifier here and in pipelines.load_demo_classifier, and the help
texts all derive from it. Only append to it: a classifier's seed is `seed + 1 + its index` in this list."""

from __future__ import annotations

from pathlib import Path

from diffsmooth.engine.errors import UserError

ASSETS = Path(__file__).resolve().parent.parent / "demo" / "assets"
DEMO_UNET = ASSETS / "demo_unet.pt"
DEMO_DDPM = ASSETS / "demo_ddpm_diffusers"     # a diffusers DDPM pipeline folder (train-demo)
DEMO_MANIFEST = ASSETS / "MODELS.json"
DEMO_PRESET = "demo"
DEMO_DATASET = "embedded"
DEMO_STATS = "fashion-mnist"
DEMO_TRAINING_SIGMAS = (0.0, 0.25, 0.5, 1.0)


def demo_sigmas_text(sigmas=DEMO_TRAINING_SIGMAS) -> str:
    """'0, 0.25, 0.5, 1': the noise levels as help texts and messages list them."""
    return ", ".join(f"{s:g}" for s in sigmas)


def demo_classifier_name(noise_sigma: float) -> str:
    """'demo_classifier_s0.25.pt': the file name of the demo classifier trained at `noise_sigma`."""
    return f"demo_classifier_s{noise_sigma:.2f}.pt"


def demo_classifier_path(noise_sigma: float) -> Path:
    """The demo classifier trained with Gaussian augmentation of std `noise_sigma` (0 = clean)."""
    return ASSETS / demo_classifier_name(noise_sigma)


def demo_training_sigma(noise_level: float) -> float | None:
    """The entry of DEMO_TRAINING_SIGMAS equal to `noise_level` (up to float rounding), else None."""
    return next((s for s in DEMO_TRAINING_SIGMAS if abs(s - float(noise_level)) <= 1e-9), None)


def demo_classifier_at(noise_level: float, method: str | None = None) -> Path:
    """The shipped demo classifier trained at `noise_level`: one of DEMO_TRAINING_SIGMAS, and its file present."""
    sigma = demo_training_sigma(noise_level)
    what = f"noise level {noise_level:g}" + (f" (method {method})" if method else "")
    if sigma is None:
        raise UserError(f"no embedded demo classifier for {what}; the demo ships "
                        f"{demo_sigmas_text()}: pick one of those or pass `classifier`")
    path = demo_classifier_path(sigma)
    if not path.exists():
        raise UserError(f"the embedded demo classifier for {what} is missing ({path}); "
                        f"run `diffsmooth train-demo --only-missing` to create it")
    return path


def require_demo_assets() -> None:
    if not DEMO_UNET.exists():
        raise UserError(f"the embedded demo models are missing ({DEMO_UNET}); "
                        f"run `diffsmooth train-demo` to create them")

"""The shipped demo models' facts under the demo's name; they live in models/shipped.py."""

from diffsmooth.engine.models.shipped import (  # noqa: F401
    ASSETS,
    DEMO_DATASET,
    DEMO_DDPM,
    DEMO_MANIFEST,
    DEMO_PRESET,
    DEMO_STATS,
    DEMO_TRAINING_SIGMAS,
    DEMO_UNET,
    demo_classifier_at,
    demo_classifier_name,
    demo_classifier_path,
    demo_sigmas_text,
    demo_training_sigma,
    require_demo_assets,
)

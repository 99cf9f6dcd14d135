"""diffsmooth-engine: fast, reference-exact DiffSmooth certification.

The public Python API is re-exported here lazily, so `import diffsmooth` needs neither CUDA,
TensorRT nor onnxruntime (nor, until an attribute is used, torch).
"""

import importlib

__version__ = "0.1.0"

_API = {
    # smoothed classifiers built from modules (engine/pipelines.py)
    "DiffSmooth": "diffsmooth.engine.pipelines",
    "DenoisedSmoothing": "diffsmooth.engine.pipelines",
    "RandomizedSmoothing": "diffsmooth.engine.pipelines",
    "SmoothedClassifier": "diffsmooth.engine.pipelines",
    "smoothed_classifier": "diffsmooth.engine.pipelines",
    "load_demo_denoiser": "diffsmooth.engine.pipelines",
    "load_demo_classifier": "diffsmooth.engine.pipelines",
    # the configured parts a SmoothedClassifier may be composed of (engine/base_classifier/methods/)
    "NoPurifier": "diffsmooth.engine.base_classifier.methods.no_purifier",
    "OneShotPurifier": "diffsmooth.engine.base_classifier.methods.one_shot_purifier",
    "ReverseChainsPurifier": "diffsmooth.engine.base_classifier.methods.reverse_chains_purifier",
    "LogitsHead": "diffsmooth.engine.base_classifier.methods.logits_head",
    "LocalSmoothingHead": "diffsmooth.engine.base_classifier.methods.local_smoothing_head",
    "MajorityVoteHead": "diffsmooth.engine.base_classifier.methods.majority_vote_head",
    # the preflight: do the models and data behave as a table needs? (engine/preflight/)
    "PreflightReport": "diffsmooth.engine.preflight.findings",
    # loaders of the official checkpoints and datasets
    "load_denoiser": "diffsmooth.engine.base_classifier.denoise",
    "DiffusionDenoiser": "diffsmooth.engine.base_classifier.denoise",
    "load_classifier": "diffsmooth.engine.models.checkpoints",
    "load_dataset": "diffsmooth.engine.data",
    # the certification math and Cohen's Smooth on a voter
    "Certificate": "diffsmooth.engine.certify.cohen",
    "ABSTAIN": "diffsmooth.engine.certify.cohen",
    "lower_confidence_bound": "diffsmooth.engine.certify.cohen",
    "certified_radius": "diffsmooth.engine.certify.cohen",
    "Smooth": "diffsmooth.engine.certify.smooth",
    "SequentialRule": "diffsmooth.engine.certify.sequential",
}

__all__ = sorted(_API) + ["__version__"]


def __getattr__(name):
    if name in _API:
        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'diffsmooth' has no attribute {name!r}")

"""diffsmooth-engine: fast, reference-exact DiffSmooth certification.

The public Python API is re-exported here lazily, so `import diffsmooth` needs neither CUDA,
TensorRT nor onnxruntime (nor, until an attribute is used, torch).
"""

__version__ = "0.1.0"

_API = {
    "load_denoiser": "diffsmooth.engine.base_classifier.denoise",
    "DiffusionDenoiser": "diffsmooth.engine.base_classifier.denoise",
    "load_classifier": "diffsmooth.engine.models.checkpoints",
    "lower_confidence_bound": "diffsmooth.engine.certify.core",
    "certified_radius": "diffsmooth.engine.certify.core",
    "Smooth": "diffsmooth.engine.certify.core",
    "load_dataset": "diffsmooth.engine.data",
}

__all__ = sorted(_API) + ["__version__"]


def __getattr__(name):
    if name in _API:
        import importlib
        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'diffsmooth' has no attribute {name!r}")

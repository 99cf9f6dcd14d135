"""`import diffsmooth` (and the CLI's import) must not pull in torch, onnxruntime or TensorRT;
the package installs under one namespace, never as top-level `engine`/`export`/`bench`."""

import json
import subprocess
import sys


def _modules_after(statement):
    code = f"import sys, json; {statement}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout))


def test_import_is_light():
    for statement in ("import diffsmooth", "import diffsmooth.cli", "import diffsmooth.engine.certify.cohen"):
        loaded = _modules_after(statement)
        for heavy in ("torch", "onnxruntime", "onnx", "tensorrt", "pycuda"):
            assert heavy not in loaded, f"{statement} imported {heavy}"


def test_public_api_resolves_lazily():
    import diffsmooth
    assert callable(diffsmooth.load_denoiser) and callable(diffsmooth.certified_radius)
    assert diffsmooth.lower_confidence_bound(100, 100, 0.001) > 0.93


def test_one_namespace():
    import importlib.util
    assert importlib.util.find_spec("diffsmooth.engine") is not None
    for generic in ("engine", "export", "bench"):
        spec = importlib.util.find_spec(generic)
        assert spec is None or "site-packages" not in (spec.origin or ""), generic

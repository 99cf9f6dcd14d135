"""The backends, one folder each (torch/, onnxruntime/, tensorrt/): a backend's class (backend.py: its stages for a
run, its fast path's defaults), a method's stages on it (stages.py) and its low-level runner (runner.py, with what
only it uses); registry.py is the one place a backend's name becomes its class. What every backend shares, the
Stage / StageBackend contract, stays in engine/stages/. Nothing here imports a backend library at import time."""

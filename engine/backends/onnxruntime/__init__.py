"""The onnxruntime backend: the graphs of `diffsmooth export`, run by ONNX Runtime (backend.py, stages.py, runner.py)."""

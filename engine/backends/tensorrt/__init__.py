"""The tensorrt backend: the plans of `diffsmooth build-engine`, run by TensorRT (backend.py, stages.py, runner.py,
plans.py)."""

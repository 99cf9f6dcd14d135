"""The tensorrt backend: the engine files of `diffsmooth build-engine`, run by TensorRT (backend.py, stages.py,
runner.py, engine_files.py)."""

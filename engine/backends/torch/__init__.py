"""The torch backend: the models as torch modules, eager or compiled (backend.py, stages.py, runner.py)."""

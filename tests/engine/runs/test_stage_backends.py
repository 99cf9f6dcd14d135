"""A backend is a class in its own folder (engine/backends/, picked by name in registry.py): the command
line's names are the registered ones, an unknown name is refused in one line, only the torch backend's fast path is
checked against eager fp32 per run, and each backend decides its own fast path's defaults."""

import pytest

from diffsmooth.engine.backends.exported import ExportedBackend
from diffsmooth.engine.backends.registry import STAGE_BACKENDS, stage_backend
from diffsmooth.engine.backends.torch.backend import TorchBackend
from diffsmooth.engine.choices import BACKENDS
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.runs.stage_build import StageBuild


def test_the_backends_are_the_command_lines_in_its_order():
    assert tuple(STAGE_BACKENDS) == BACKENDS
    assert [type(stage_backend(name)).__name__ for name in BACKENDS] == ["TorchBackend", "OnnxRuntimeBackend",
                                                                         "TensorRTBackend"]
    assert isinstance(stage_backend("torch"), TorchBackend) and stage_backend("torch").runs_modules
    assert all(isinstance(stage_backend(n), ExportedBackend) and not stage_backend(n).runs_modules
               for n in ("onnxruntime", "tensorrt"))


def test_an_unknown_backend_and_an_exported_one_without_graphs_are_refused_in_one_line():
    with pytest.raises(UserError, match="unknown backend 'tvm': choose one of torch, onnxruntime, tensorrt"):
        stage_backend("tvm")
    for name, needs in (("onnxruntime", "graphs from `diffsmooth export`"),
                        ("tensorrt", "engine files from `diffsmooth build-engine`")):
        with pytest.raises(UserError, match=f"`backend` {name} needs `onnx_dir`") as info:
            stage_backend(name).stages(None, None, (1, 32, 32), 10, StageBuild())
        assert needs in str(info.value) and "\n" not in str(info.value)

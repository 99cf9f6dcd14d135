"""A stage's uncompiled, uncaptured form for a shape the run was not built for (the smaller chunks
after an out-of-memory error): no new compile, no new CUDA graph and pool at a moment when memory is
short; the captured graphs are released first.
"""

from __future__ import annotations

from typing import Callable


def eager_fallback(stage, log: Callable[[str], None], reason: str):
    """The stage to use from now on: `stage.eager` (its graphs released) when the stage has a
    distinct eager form, else the stage itself; says which, once."""
    eager = getattr(stage, "eager", None)
    if eager is None or eager is stage:
        return stage
    release = getattr(stage, "release", None)
    if release is not None:
        release()
    log(f"# {stage.name}: {reason}; it runs uncompiled and uncaptured from now on (no new compile or CUDA "
        f"graph at the smaller shape; the agreement check covered the compiled path only)")
    return eager

"""Dynamo's recompile limit, sized to the run: every compiled stage of a process adds guarded
entries to the same forward code (a sweep compiles one per classifier and sigma', 11 on the paper's
grid), and past the limit (8 by default) dynamo silently runs the stage eager. The limit is raised
with each compiled stage, and hitting it anyway raises, so the stage can say it falls back.
"""

from __future__ import annotations

__all__ = ["reserve_compiled_stage", "is_recompile_limit_hit", "compiled_stages", "compiled_graphs"]

BASE_LIMIT = 8           # dynamo's default
ENTRIES_PER_STAGE = 2    # a stage's static shape, plus one retrace (grad mode, a probe) to spare

_STAGES = {"count": 0}


def compiled_stages() -> int:
    """Compiled stages built in this process so far."""
    return _STAGES["count"]


def compiled_graphs() -> int:
    """Graphs dynamo has compiled in this process (its unique_graphs counter: a recompilation or a
    graph break counts); 0 before anything was compiled."""
    import sys
    utils = sys.modules.get("torch._dynamo.utils")         # not imported: nothing was compiled
    return int(utils.counters["stats"]["unique_graphs"]) if utils is not None else 0


def reserve_compiled_stage() -> int:
    """Count one more compiled stage and keep dynamo's recompile limits above what all of them need;
    make hitting the limit an exception instead of a silent eager fallback. Returns the limit."""
    import torch._dynamo.config as config
    _STAGES["count"] += 1
    need = BASE_LIMIT + ENTRIES_PER_STAGE * _STAGES["count"]
    config.recompile_limit = max(int(config.recompile_limit), need)
    if hasattr(config, "accumulated_recompile_limit"):
        config.accumulated_recompile_limit = max(int(config.accumulated_recompile_limit), need)
    if hasattr(config, "fail_on_recompile_limit_hit"):
        config.fail_on_recompile_limit_hit = True
    return int(config.recompile_limit)


def is_recompile_limit_hit(exc: BaseException) -> bool:
    """Whether `exc` is dynamo refusing to compile another entry (the limit was hit)."""
    try:
        from torch._dynamo.exc import FailOnRecompileLimitHit
    except ImportError:         # older torch: no hard failure, nothing to catch
        return False
    return isinstance(exc, FailOnRecompileLimitHit)

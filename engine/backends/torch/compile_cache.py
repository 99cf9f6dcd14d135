"""Where torch.compile (inductor) keeps its compiled kernels, so compiled runs start warm next time.

`TORCHINDUCTOR_CACHE_DIR` wins when set (inductor reads it itself); otherwise the engine uses a user
cache folder, `$XDG_CACHE_HOME/diffsmooth/inductor` (default `~/.cache/diffsmooth/inductor`), instead of
inductor's per-user folder under /tmp, which is wiped on reboot.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["ENV_VAR", "compile_cache_dir", "compile_cache_source", "use_compile_cache"]

ENV_VAR = "TORCHINDUCTOR_CACHE_DIR"


def compile_cache_dir() -> Path:
    """The inductor cache folder the engine uses (not created here)."""
    configured = os.environ.get(ENV_VAR)
    if configured:
        return Path(configured).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "diffsmooth" / "inductor"


def compile_cache_source() -> str:
    """Why that folder: the environment variable, or the engine's default."""
    return ENV_VAR if os.environ.get(ENV_VAR) else "default (set TORCHINDUCTOR_CACHE_DIR to change)"


def use_compile_cache() -> Path:
    """Point inductor at compile_cache_dir() (sets TORCHINDUCTOR_CACHE_DIR if unset) and create it.

    Call before the first torch.compile of the process: inductor reads the variable when it starts.
    """
    path = compile_cache_dir()
    os.environ.setdefault(ENV_VAR, str(path))
    os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")      # compiled graphs survive the process
    path.mkdir(parents=True, exist_ok=True)
    return path

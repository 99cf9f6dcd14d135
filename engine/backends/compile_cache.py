"""Where torch.compile keeps its on-disk caches, so a second run skips the 50-70 s compile.

TORCHINDUCTOR_CACHE_DIR wins when set; else `$XDG_CACHE_HOME/diffsmooth/inductor` (~/.cache/...).
"""

from __future__ import annotations

import os
from pathlib import Path


def compile_cache_dir() -> Path:
    """The inductor cache directory this engine uses (not created here)."""
    given = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if given:
        return Path(given)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "diffsmooth" / "inductor"


def enable_compile_cache() -> Path:
    """Point inductor's FX-graph and autotuning caches at compile_cache_dir(); returns it.

    Must run before the first torch.compile call of the process (inductor reads the variable then).
    """
    path = compile_cache_dir()
    path.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(path))
    os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")
    os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "1")
    return path

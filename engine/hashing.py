"""sha256 of files: checkpoints, exported graphs and data files are recorded and checked by it."""

from __future__ import annotations

import hashlib


def sha256_file(path, chunk: int = 1 << 22) -> str:
    """Hex sha256 of a file's bytes, read in chunks (graphs and checkpoints can be GiBs)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()

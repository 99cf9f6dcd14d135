"""sha256 of files and folders: checkpoints, exported graphs and data files are recorded and checked by it."""

from __future__ import annotations

import hashlib


def sha256_file(path, chunk: int = 1 << 22) -> str:
    """Hex sha256 of a file's bytes, read in chunks (graphs and checkpoints can be GiBs)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def sha256_path(path) -> str:
    """sha256_file of a file; of a folder (a diffusers pipeline), the sha256 over each file's relative
    path and sha256, in sorted order."""
    from pathlib import Path
    path = Path(path)
    if path.is_file():
        return sha256_file(path)
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(f"{file.relative_to(path).as_posix()}\0{sha256_file(file)}\n".encode())
    return digest.hexdigest()

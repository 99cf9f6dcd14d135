"""One writer per result file: an exclusive lock on a sidecar lock file, held while a run writes.

`hold_lock(target, what)` locks `TARGET.lock` next to a result file (`folder=True`: `TARGET/.lock`
inside a sweep or table folder) with `flock(LOCK_EX | LOCK_NB)`. The kernel drops the lock when the
holder dies (a SIGKILLed run never blocks its own resume), and the lock file is never replaced, so
files the engine replaces by rename (the settings sidecar, `merge`'s output) stay covered. The
holder writes its pid, host and start time into the lock file once it holds the lock; a failed
attempt opens it without truncating and changes nothing, so its refusal names the holder. A lock
file left behind after a run is harmless: only a held lock refuses.

Within one process (and thread) the lock is re-entrant: the command line may hold it from planning
on and the engine take it again where it writes. Where the file system has no working locks, it
warns once and goes on (rows are still single appends, and the readers refuse duplicates).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import threading
import time
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, Iterator, Optional, Tuple

from diffsmooth.engine.errors import UserError

LOCK_SUFFIX = ".lock"
FOLDER_LOCK = ".lock"
# flock errors meaning "this file system cannot lock", not "someone holds it"
_NO_LOCKS = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EINVAL}

_held: Dict[Tuple[str, int], list] = {}         # (lock file, thread) -> [fd or None, depth]
_registry = threading.Lock()
_warned = False


class LockHeld(UserError):
    """Another run holds the lock: one line naming the file and the holder (exit code 2 from the CLI)."""


def lock_file(target, folder: bool = False) -> Path:
    """The lock file of a result file (`TARGET.lock`) or of a folder (`TARGET/.lock`)."""
    target = Path(target)
    return target / FOLDER_LOCK if folder else target.with_name(target.name + LOCK_SUFFIX)


def _key(path: Path) -> Tuple[str, int]:
    return os.path.realpath(path), threading.get_ident()


def _holder(fd: int) -> str:
    """Who holds the lock, from the lock file (the holder writes it just after locking)."""
    for _ in range(20):
        try:
            text = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
            info = json.loads(text) if text else None
        except (OSError, ValueError):
            info = None
        if isinstance(info, dict) and "pid" in info:
            return f"pid {info.get('pid')} on host {info.get('host', '?')}, since {info.get('started', '?')}"
        time.sleep(0.05)                        # locked a moment ago, not yet written
    return "pid unknown"


def _refusal(target: Path, what: str, path: Path, holder: str) -> LockHeld:
    return LockHeld(f"{what} {target} is being written by another run ({holder}): one writer per result file; "
                    f"wait for it or stop it (lock file {path})")


def _no_locks(path: Path, exc: OSError) -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(f"{path}: this file system gives no working file locks ({exc.strerror}); going on without "
                      f"them: two runs on one result file would not be refused (readers still refuse duplicates)",
                      RuntimeWarning, stacklevel=3)


def _try_lock(fd: int, path: Path, mode: int = fcntl.LOCK_EX) -> bool:
    """True: locked (or the file system cannot lock: warned once); False: another run holds it."""
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
        return True
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        if exc.errno in _NO_LOCKS:
            _no_locks(path, exc)
            return True
        raise


def _acquire(target: Path, what: str, path: Path) -> Optional[int]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)       # never truncate before holding the lock
    try:
        if not _try_lock(fd, path):
            raise _refusal(target, what, path, _holder(fd))
        os.ftruncate(fd, 0)
        info = {"pid": os.getpid(), "host": socket.gethostname(),
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "what": f"{what} {target}"}
        os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        return fd
    except BaseException:
        os.close(fd)
        raise


@contextmanager
def hold_lock(target, what: str = "result file", folder: bool = False) -> Iterator[Path]:
    """Hold the exclusive lock of `target` (a result file, or with `folder` a folder) for the block;
    LockHeld (a UserError naming the file and the holder's pid and host) when another run holds it.
    Yields the lock file's path."""
    target = Path(target)
    path = lock_file(target, folder)
    key = _key(path)
    with _registry:
        entry = _held.get(key)
        if entry is not None:
            entry[1] += 1
    if entry is None:
        fd = _acquire(target, what, path)
        with _registry:
            entry = _held[key] = [fd, 1]
    try:
        yield path
    finally:
        with _registry:
            entry[1] -= 1
            last = entry[1] == 0
            if last:
                del _held[key]
        if last:
            os.close(entry[0])                  # closing drops the lock; the lock file stays (harmless)


def check_unlocked(target, what: str = "result file", folder: bool = False) -> None:
    """Refuse (LockHeld) if another run holds `target`'s lock; creates nothing (a missing lock file
    is no lock), holds nothing. For a check before models load; the writer then takes the lock."""
    path = lock_file(target, folder)
    if _key(path) in _held:
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        if not _try_lock(fd, path, fcntl.LOCK_SH):     # shared: two checks never refuse each other
            raise _refusal(Path(target), what, path, _holder(fd))
    finally:
        os.close(fd)                            # also drops the lock just taken

"""Freed host memory kept for reuse: a freed 256 MiB block, from the main thread or a worker thread (a server's),
stays in the heap (glibc's counters say so) with the setting, and goes back to the system without it; every command
sets it."""

import json
import os
import platform
import subprocess
import sys

import pytest
from click.testing import CliRunner

from diffsmooth.engine.host_memory import OPT_OUT

pytestmark = pytest.mark.skipif(sys.platform != "linux" or platform.libc_ver()[0] != "glibc",
                                reason="glibc's malloc thresholds: Linux with glibc only")

FREED_IN_HEAP = """
import ctypes, json, sys, threading
from diffsmooth.engine.host_memory import keep_freed_memory
took = keep_freed_memory()
libc = ctypes.CDLL("libc.so.6")
class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc.mallinfo2.restype = Info
libc.malloc.restype = ctypes.c_void_p
def allocate_and_free():
    block = libc.malloc(256 << 20)
    ctypes.memset(block, 1, 256 << 20)
    libc.free(ctypes.c_void_p(block))
if sys.argv[1] == "thread":
    worker = threading.Thread(target=allocate_and_free)
    worker.start()
    worker.join()
else:
    allocate_and_free()
print(json.dumps({"took": took, "free_in_heap": libc.mallinfo2().fordblks}))
"""


def _freed(opt_out: bool, where: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}      # the suite's own setting off
    env[OPT_OUT] = "0" if opt_out else "1"
    out = subprocess.run([sys.executable, "-c", FREED_IN_HEAP, where], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


@pytest.mark.parametrize("where", ["main", "thread"])
def test_a_freed_large_block_stays_in_the_heap_only_with_the_setting(where):
    kept, default = _freed(opt_out=False, where=where), _freed(opt_out=True, where=where)
    assert kept["took"] and kept["free_in_heap"] >= 256 << 20, kept
    assert not default["took"] and default["free_in_heap"] < 256 << 20, default


def test_every_command_keeps_freed_memory(monkeypatch):
    from diffsmooth.cli import main

    calls = []
    monkeypatch.setattr("diffsmooth.cli.group.keep_freed_memory", lambda: calls.append(1))
    result = CliRunner().invoke(main, ["env"])
    assert result.exit_code == 0 and calls == [1], result.output

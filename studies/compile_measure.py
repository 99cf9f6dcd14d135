"""Runs the `diffsmooth` command line given as arguments, as a child process, and at its exit prints one
JSON line (stderr) with torch.compile's work in that process: graphs compiled (dynamo's unique_graphs),
frames compiled and the seconds dynamo spent compiling (its `_compile.compile_inner` timer: tracing
plus inductor).

    python -m studies.compile_measure table --demo ...

The child is `python -c CHILD ARGS...`: CHILD registers the report at exit, then runs the command line
as `python -m diffsmooth.cli` would; this study imports nothing of diffsmooth."""

import subprocess
import sys

CHILD = """
import atexit, json, runpy, sys, time

import torch._dynamo.utils as dynamo_utils

START = time.perf_counter()


def report():
    metrics = dynamo_utils.compilation_time_metrics
    print("MEASURE " + json.dumps({
        "wall_seconds": round(time.perf_counter() - START, 1),
        "compiled_graphs": int(dynamo_utils.counters["stats"]["unique_graphs"]),
        "frames_compiled": int(dynamo_utils.counters["frames"]["ok"]),
        "compile_seconds": round(sum(metrics.get("_compile.compile_inner", [])), 1),
        "timers": sorted(metrics)[:40],
    }), file=sys.stderr, flush=True)


atexit.register(report)
sys.argv = ["diffsmooth", *sys.argv[1:]]
runpy.run_module("diffsmooth.cli", run_name="__main__")
"""

if __name__ == "__main__":
    sys.exit(subprocess.run([sys.executable, "-c", CHILD, *sys.argv[1:]]).returncode)

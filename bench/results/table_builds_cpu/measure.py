"""Runs the `diffsmooth` command line given as arguments and, at exit, prints one JSON line with
torch.compile's work in the process: graphs compiled (dynamo's unique_graphs), frames compiled and
the seconds dynamo spent compiling (its `_compile.compile_inner` timer: tracing plus inductor)."""

import atexit
import json
import sys
import time

import torch._dynamo.utils as dynamo_utils

START = time.perf_counter()


def report() -> None:
    metrics = dynamo_utils.compilation_time_metrics
    print("MEASURE " + json.dumps({
        "wall_seconds": round(time.perf_counter() - START, 1),
        "compiled_graphs": int(dynamo_utils.counters["stats"]["unique_graphs"]),
        "frames_compiled": int(dynamo_utils.counters["frames"]["ok"]),
        "compile_seconds": round(sum(metrics.get("_compile.compile_inner", [])), 1),
        "timers": sorted(metrics)[:40],
    }), file=sys.stderr, flush=True)


atexit.register(report)
from diffsmooth.cli import main  # noqa: E402

sys.argv = ["diffsmooth", *sys.argv[1:]]
main()

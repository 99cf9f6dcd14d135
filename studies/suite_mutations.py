"""Does the test suite catch planted bugs? Each mutation below is planted in a checkout, the suite runs (stopping
at its first failure), and the checkout is restored: a mutation the suite passes with is a hole.

    python -m studies.suite_mutations --checkout . --out mutations.json [--only NAME ...] [-- PYTEST ARGS]

The mutations are the bugs the equality tests exist for: a wrong noise index, a batch offset, a resumed run
re-certifying finished images, the race reading an image's earliest row instead of its latest, and DensePure's
reverse runs drawing the same step noise.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

MUTATIONS = {
    "noise-index-by-batch-place": (
        "engine/certify/scheduler.py",
        "block[2, at:at + rows] = np.arange(first, first + rows)",
        "block[2, at:at + rows] = np.arange(first, first + rows) + at"),
    "batch-offset-image-key": (
        "engine/certify/scheduler.py",
        "block[1, at:at + rows] = slot.work.index",
        "block[1, at:at + rows] = slot.work.index + (1 if at else 0)"),
    "resume-recertifies-finished": (
        "engine/runs/results.py",
        'self.done = {int(row["idx"]) for row in read_rows(self.path)}',
        "self.done = set()"),
    "race-reads-earliest-row": (
        "engine/table/race_build.py",
        "_, k, decided, path, row = max(entries, key=lambda entry: entry[0])",
        "_, k, decided, path, row = min(entries, key=lambda entry: entry[0])"),
    "densepure-runs-share-step-noise": (
        "engine/base_classifier/methods/densepure.py",
        "return noise.normal(run * MAX_STEPS + step, shape)",
        "return noise.normal(step, shape)"),
}
OLD_RACE_LINE = ("if (config, i) not in rank or rank[(config, i)] <= key:",
                 "if (config, i) not in rank or rank[(config, i)] >= key:")


def plant(checkout: Path, name: str) -> tuple:
    """Apply mutation `name`; returns (path, original text) to restore."""
    file, old, new = MUTATIONS[name]
    path = checkout / file
    text = path.read_text()
    if old not in text and name == "race-reads-earliest-row":       # the race's reading before 2026-11-28
        old, new = OLD_RACE_LINE
    if text.count(old) != 1:
        raise SystemExit(f"{name}: the line to mutate is not in {file} exactly once")
    path.write_text(text.replace(old, new))
    return path, text


def run_suite(checkout: Path, pytest_args: list, timeout: float) -> dict:
    start = time.time()
    try:
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *pytest_args],
                              cwd=checkout, capture_output=True, text=True, timeout=timeout)
        out, code = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        out, code = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or ""), None
    failed = re.findall(r"^FAILED (\S+)", out, flags=re.M)
    return {"caught": code not in (0, None), "exit_code": code, "first_failure": failed[0] if failed else None,
            "seconds": round(time.time() - start, 1), "summary": (out.strip().splitlines() or [""])[-1][:300]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkout", type=Path, default=Path("."))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--timeout", type=float, default=3600)
    args, pytest_args = parser.parse_known_args(argv)
    pytest_args = [a for a in pytest_args if a != "--"]
    results = {}
    for name in args.only or MUTATIONS:
        path, original = plant(args.checkout, name)
        try:
            results[name] = run_suite(args.checkout, pytest_args, args.timeout)
        finally:
            path.write_text(original)
        print(name, json.dumps(results[name]), flush=True)
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    return 0 if all(r["caught"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

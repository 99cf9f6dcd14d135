"""The demo table in one process and on N torchrun ranks (gloo, one thread each), side by side: wall time,
samples drawn, each rank's computed samples and the busiest rank's over the mean, and whether the two
folders hold the same rows. Runs the command line as child processes.

    python -m studies.table_ranks --out DIR [--ranks 2] [--images 16] [--n-max 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def run(cmd, env) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    return time.perf_counter() - start


def rows(folder: Path) -> dict:
    """Every result file's rows by index, without the time column."""
    out = {}
    for path in sorted((folder / "runs").rglob("*.tsv")):
        lines = path.read_text().splitlines()
        keep = [k for k, c in enumerate(lines[0].split("\t")) if c != "time"]
        out[str(path.relative_to(folder))] = sorted("\t".join(line.split("\t")[k] for k in keep) for line in lines[1:])
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--images", type=int, default=16)
    parser.add_argument("--n-max", type=int, default=2000)
    args = parser.parse_args(argv)
    table = ["table", "--demo", "--images", str(args.images), "--n-max", str(args.n_max), "--threads", "1", "--quiet"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    one, many = args.out / "one", args.out / f"ranks{args.ranks}"
    seconds = {"one": run([sys.executable, "-m", "diffsmooth.cli", *table, "--out", str(one)], env)}
    seconds["ranks"] = run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(args.ranks),
                            "--master_port", str(29400 + os.getpid() % 500), "-m", "diffsmooth.cli", *table,
                            "--out", str(many)], env)
    summaries = {k: json.loads((p / "summary.json").read_text()) for k, p in (("one", one), ("ranks", many))}
    doc = {"images": args.images, "n_max": args.n_max, "ranks": args.ranks, "seconds": seconds,
           "samples": {k: s["samples"]["total"] for k, s in summaries.items()},
           "computed_per_rank": summaries["ranks"]["ranks"]["computed_samples"],
           "busiest_over_mean": summaries["ranks"]["ranks"]["busiest_over_mean"],
           "same_rows": rows(one) == rows(many), "cpu_count": os.cpu_count()}
    (args.out / "table_ranks.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"one process: {seconds['one']:.0f} s; {args.ranks} ranks: {seconds['ranks']:.0f} s "
          f"({seconds['one'] / seconds['ranks']:.2f}x); samples {doc['samples']['one']:,} / {doc['samples']['ranks']:,}; "
          f"computed per rank {doc['computed_per_rank']} (busiest / mean {doc['busiest_over_mean']:.3f}); "
          f"same rows: {doc['same_rows']} (measured, {os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()

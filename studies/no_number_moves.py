"""Does a refactor move a number? The same small runs on the demo models in two checkouts, compared file by file:
`certify` rows of every method (fixed and fresh local noise), `predict`, sweeps over methods, m, sigma' and
DensePure's K, the demo table (race and all),
the ONNX export (manifests, and `certify` on the exported graphs through ONNX Runtime) and `bench`'s counted
quantities (FLOPs, stages, the reference-equivalent baseline's agreement).

    python -m studies.no_number_moves run --checkout CHECKOUT --out DIR
    python -m studies.no_number_moves compare DIR_BEFORE DIR_AFTER

Each run is `python -m diffsmooth.cli ...` with the checkout as its working directory (so the checkout's own code
runs). Wall times, paths and machine facts are left out of the comparison; everything else must be equal.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

CERTIFY = ["--dataset", "embedded", "--skip", "13", "--max", "100", "--n0", "20", "--n", "120", "--batch", "60",
           "--quiet"]
DENSEPURE = ["--option", "reverse_runs=3", "--option", "steps=2"]
RUNS = {
    "certify_rs": ["certify", "--method", "rs", *CERTIFY],
    "certify_dds": ["certify", "--method", "dds", *CERTIFY],
    "certify_diffsmooth": ["certify", "--method", "diffsmooth", "--m", "3", *CERTIFY],
    "certify_diffsmooth_fresh": ["certify", "--method", "diffsmooth", "--m", "2", "--local-noise", "fresh", *CERTIFY],
    "predict_diffsmooth": ["predict", "--method", "diffsmooth", "--m", "3", *CERTIFY],
    "sweep": ["certify", "--method", "rs", "--method", "dds", "--method", "diffsmooth", "--m", "1", "--m", "3",
              "--local-sigma", "0.25", "--local-sigma", "0.5", *CERTIFY],
    "certify_densepure": ["certify", "--method", "densepure", *DENSEPURE, *CERTIFY],
    "sweep_densepure": ["certify", "--method", "densepure", "--option", "reverse_runs=1,3", "--option", "steps=2",
                        *CERTIFY],
    "table_race": ["table", "--demo", "--images", "4", "--n-max", "300", "--threads", "1", "--quiet"],
    "table_all": ["table", "--demo", "--images", "4", "--n-max", "300", "--plan", "all", "--threads", "1", "--quiet"],
}
EXPORTS = {
    "rs": ["--method", "rs"],
    "dds": ["--method", "dds"],
    "diffsmooth": ["--method", "diffsmooth", "--m", "3"],
    "diffsmooth_fresh": ["--method", "diffsmooth", "--m", "2", "--local-noise", "fresh"],
    "densepure": ["--method", "densepure", *DENSEPURE],
}
BENCH = ["bench", "--models", "demo", "--n0", "10", "--n", "100", "--measure-n", "40", "--batch", "20", "--images", "1",
         "--json", "--quiet", "--threads", "1"]
VOLATILE = {"time", "seconds", "per_second", "elapsed", "wall_s", "created", "path", "command", "machine", "host",
            "load_average", "torch", "onnxruntime", "onnx", "python", "platform", "versions", "written_at", "date"}
BENCH_KEPT = ("flops", "stages", "model_info", "method", "m", "batch", "reference_equivalent")


def _cli(checkout: Path, args, out_file=None) -> str:
    proc = subprocess.run([sys.executable, "-m", "diffsmooth.cli", *map(str, args)], cwd=checkout, capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, args))}: exit {proc.returncode}\n{proc.stderr[-2000:]}{proc.stdout[-2000:]}")
    return proc.stdout


def run(checkout: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, args in RUNS.items():
        target = out / name if name.startswith(("table", "sweep")) else out / f"{name}.tsv"
        _cli(checkout, [*args, "--out", target.resolve()])
        print("ran", name, flush=True)
    for name, args in EXPORTS.items():
        graphs = (out / f"onnx_{name}").resolve()
        _cli(checkout, ["export", *args, "--out", graphs])
        _cli(checkout, ["certify", *args, *CERTIFY, "--backend", "onnxruntime", "--onnx-dir", graphs,
                        "--out", (out / f"onnx_certify_{name}.tsv").resolve()])
        print("exported", name, flush=True)
    (out / "bench.json").write_text(_cli(checkout, BENCH))


def _clean(value):
    """`value` without volatile keys (times, paths, versions, machine facts)."""
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()
                if not any(word in k.lower() for word in VOLATILE) and not k.lower().endswith(("_s", "speedup"))}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def _tsv(path: Path) -> list:
    lines = path.read_text().splitlines()
    head = lines[0].split("\t")
    keep = [i for i, h in enumerate(head) if h != "time"]
    return [[line.split("\t")[i] for i in keep] for line in lines]


def _bench(path: Path) -> dict:
    doc = json.loads(path.read_text())
    runs = doc.get("runs", [doc]) if isinstance(doc, dict) else doc
    return [_clean({k: r.get(k) for k in BENCH_KEPT if k in r}) for r in runs]


def _comparable(path: Path):
    if path.suffix == ".tsv":
        return _tsv(path)
    if path.suffix == ".json" and path.name == "bench.json":
        return _bench(path)
    if path.suffix == ".json":
        return _clean(json.loads(path.read_text()))
    if path.suffix in (".md", ".tex", ".txt", ".jsonl"):
        return path.read_text()
    return None                     # images, graphs: their outputs are compared through the rows above


def compare(before: Path, after: Path) -> int:
    files = sorted({p.relative_to(before) for p in before.rglob("*") if p.is_file()}
                   | {p.relative_to(after) for p in after.rglob("*") if p.is_file()})
    moved, compared = [], 0
    for rel in files:
        a, b = before / rel, after / rel
        if not (a.exists() and b.exists()):
            moved.append(f"{rel}: only in {'after' if b.exists() else 'before'}")
            continue
        left = _comparable(a)
        if left is None:
            continue
        compared += 1
        if left != _comparable(b):
            moved.append(f"{rel}: differs")
    print(f"{compared} files compared, {len(moved)} moved")
    for line in moved:
        print("  " + line)
    return 1 if moved else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--checkout", type=Path, default=Path("."))
    r.add_argument("--out", type=Path, required=True)
    c = sub.add_parser("compare")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    args = parser.parse_args(argv)
    if args.command == "run":
        run(args.checkout.resolve(), args.out.resolve())
        return 0
    return compare(args.before, args.after)


if __name__ == "__main__":
    sys.exit(main())

"""MEASURED: `diffsmooth serve --demo` under load on the loopback address, beside the Python API offline.

A real server process (port 0); for each case (PREDICT n, or sequential CERTIFY n0 + n-max) and concurrency,
max(requests, concurrency) one-image requests sent by that many client threads: throughput, p50 / p95 / p99 latency
and how many requests share a batch (the server's own histogram, per level); beside serial (concurrency 1) and the
same images and jobs through the Python API in this process (packed into shared batches, as a dataset run packs
them), with the same threads. The load average is recorded with the numbers. Bounded in requests and seconds.

    python -m studies.serve_load --model diffsmooth --cases predict:100,predict:1000:4,certify:1000:4 --batch 100
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from diffsmooth.engine.certify.cohen import predict_job
from diffsmooth.engine.certify.scheduler import Work
from diffsmooth.engine.certify.sequential import sequential_job
from diffsmooth.engine.data import load_dataset
from diffsmooth.engine.host_memory import keep_freed_memory
from diffsmooth.engine.runs.request import sequential_rule
from diffsmooth.engine.serve.model_registry import Execution, demo_models

ROOT = Path(__file__).resolve().parents[1]


def start_server(args) -> tuple:
    """(process, port, seconds to ready) of `diffsmooth serve --demo`."""
    started = time.perf_counter()
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    log = open(args.server_log, "w") if args.server_log else subprocess.DEVNULL       # noqa: SIM115 - the server's life
    proc = subprocess.Popen([sys.executable, "-m", "diffsmooth.cli", "serve", "--demo", "--seed", "0", "--port", "0",
                             "--host", "127.0.0.1", "--device", args.device, "--threads", str(args.threads),
                             "--batch", str(args.batch), "--max-queue", "4096"],
                            stdout=subprocess.PIPE, stderr=log, text=True, cwd=ROOT,
                            env=dict(os.environ, PYTHONPATH=path))
    found = re.search(r"port=(\d+)", proc.stdout.readline())
    if not found:
        raise SystemExit(f"the server did not start (exit {proc.wait(60)}; --server-log keeps its output)")
    port = int(found.group(1))
    while proc.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=5) as answer:
                if answer.status == 200:
                    break
        except OSError:
            time.sleep(0.05)
    if proc.poll() is not None:
        raise SystemExit(f"the server stopped before it was ready (exit {proc.returncode})")
    return proc, port, time.perf_counter() - started


def parameters(args) -> dict:
    if args.mode == "predict":
        return {"mode": "predict", "n": args.n}
    return {"mode": "certify", "n0": args.n0, "n": args.n, "radii": args.radii}


def cases(args) -> list:
    """(mode, n, requests per level) of each case: `--cases mode:n[:requests],...`, or --mode/--n/--requests."""
    if not args.cases:
        return [(args.mode, args.n, args.requests)]
    parsed = []
    for case in args.cases.split(","):
        mode, n, *requests = case.split(":")
        parsed.append((mode, int(n), int(requests[0]) if requests else args.requests))
    return parsed


def infer(port: int, model: str, image: np.ndarray, params: dict) -> float:
    """Seconds one request took."""
    body = json.dumps({"inputs": [{"name": "images", "shape": [1, *image.shape], "datatype": "FP32",
                                   "data": image.reshape(-1).tolist()}], "parameters": params}).encode()
    started = time.perf_counter()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/{model}/infer", data=body, method="POST")
    with urllib.request.urlopen(request, timeout=3600) as answer:
        answer.read()
    return time.perf_counter() - started


def batch_sharing(port: int, model: str) -> tuple:
    """(sum, count) of the server's requests-per-batch histogram."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    pick = lambda what: float(re.search(rf'diffsmooth_batch_requests_{what}{{model="{model}"}} (\S+)', text).group(1))
    return pick("sum"), pick("count")


def level(args, port: int, images: np.ndarray, concurrency: int) -> dict:
    """One concurrency level: its requests, wall time, latencies and batch sharing."""
    before = batch_sharing(port, args.model)
    count = max(args.requests, concurrency)
    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        latencies = list(pool.map(lambda k: infer(port, args.model, images[k % len(images)], parameters(args)),
                                  range(count)))
    wall = time.perf_counter() - started
    after = batch_sharing(port, args.model)
    return {"concurrency": concurrency, "requests": count, "wall": wall, "rate": count / wall,
            "p50": float(np.percentile(latencies, 50)), "p95": float(np.percentile(latencies, 95)),
            "p99": float(np.percentile(latencies, 99)),
            "sharing": (after[0] - before[0]) / max(1.0, after[1] - before[1])}


def offline(args, images: np.ndarray) -> float:
    """Requests per second of the same images and jobs through the Python API's pipeline, packed (no server), run as
    the server runs it (compiled on CUDA)."""
    torch.set_num_threads(args.threads)
    keep_freed_memory()             # as the server (every command) does
    model = next(m for m in demo_models(0, Execution(args.device, compile=None), args.batch) if m.name == args.model)
    pipeline = model.pipeline()
    radii = [float(r) for r in args.radii.split(",")]
    rule = sequential_rule(radii, model.sigma, 0.001, args.n) if args.mode == "certify" else None
    job = (lambda: predict_job(args.n, 0.001)) if rule is None else (lambda: sequential_job(args.n0, rule))
    pipeline.scheduler(args.batch).run([Work(2 * 10 ** 6, torch.from_numpy(images[0]), predict_job(args.batch, 0.001))],
                                       lambda done: None)          # warm-up, as the server's first request
    works = [Work(10 ** 6 + k, torch.from_numpy(images[k % len(images)]), job()) for k in range(args.requests)]
    started = time.perf_counter()
    pipeline.scheduler(args.batch).run(works, lambda done: None)
    return args.requests / (time.perf_counter() - started)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="diffsmooth", choices=("rs", "dds", "diffsmooth"))
    parser.add_argument("--mode", default="predict", choices=("predict", "certify"))
    parser.add_argument("--n", type=int, default=100, help="PREDICT's n, or sequential CERTIFY's n-max")
    parser.add_argument("--n0", type=int, default=100)
    parser.add_argument("--radii", default="0.25,0.5")
    parser.add_argument("--cases", default=None, help="mode:n[:requests],... (overrides --mode, --n)")
    parser.add_argument("--concurrency", default="1,2,4,8,16")
    parser.add_argument("--requests", type=int, default=16, help="requests per concurrency level (at least the level)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--max-seconds", type=float, default=600, help="per case: no further level starts after this")
    parser.add_argument("--device", default="cpu", help="the server's and the offline run's device (cpu, cuda)")
    parser.add_argument("--server-log", default=None, help="a file for the server's stderr (one line per request)")
    parser.add_argument("--out", default=None, help="a markdown file for the tables")
    parser.add_argument("--premise", action="store_true", help="no server: 8 PREDICTs of n apart vs one of 8 x n")
    parser.add_argument("--premise-child", default=None, choices=("default", "kept"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.premise or args.premise_child:
        return premise(args)
    data = load_dataset("embedded")
    images = np.stack([data[k][0].numpy() for k in range(0, len(data), max(1, len(data) // 16))][:16]).astype(np.float32)
    command = " ".join(["python -m studies.serve_load", *(argv if argv is not None else sys.argv[1:])])
    load = os.getloadavg()
    proc, port, ready = start_server(args)
    infer(port, args.model, images[0], {"mode": "predict", "n": args.batch})     # warm-up
    measured = []
    try:
        for mode, n, requests in cases(args):
            args.mode, args.n, args.requests = mode, n, requests
            started, rows = time.perf_counter(), []
            for c in (int(c) for c in args.concurrency.split(",")):
                if time.perf_counter() - started > args.max_seconds:
                    break
                rows.append(level(args, port, images, c))
            measured.append((argparse.Namespace(**vars(args)), rows))
    finally:
        proc.terminate()
        proc.wait(60)
    text = "\n".join([f"`{command}`", "",
                      f"MEASURED on {args.device} ({os.cpu_count()} CPU cores; load average before: "
                      f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, after the server's runs: "
                      "{:.2f} {:.2f} {:.2f}); time to ready {:.1f} s.".format(*os.getloadavg(), ready), ""]
                     + [report(case, rows, offline(case, images)) for case, rows in measured])
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)


def premise(args, repeats: int = 2) -> None:
    """Through the Python API, no server: 8 PREDICTs of n = --n one after another against one of 8 x n, for the model,
    with and without freed host memory kept (each in a fresh process): what packing 8 requests could save here."""
    if args.premise_child:
        torch.set_num_threads(args.threads)
        if args.premise_child == "kept":
            keep_freed_memory()
        smoothed = next(m for m in demo_models(0, batch=args.batch) if m.name == args.model).smoothed
        x = torch.from_numpy(load_dataset("embedded")[0][0].numpy())
        smoothed.predict(x, n=args.n, image_index=10 ** 6)          # warm-up
        for _ in range(repeats):
            started = time.perf_counter()
            for k in range(8):
                smoothed.predict(x, n=args.n, image_index=k)
            apart = time.perf_counter() - started
            started = time.perf_counter()
            smoothed.predict(x, n=8 * args.n, image_index=100)
            packed = time.perf_counter() - started
            print(f"MEASURED ({args.premise_child}, load {os.getloadavg()[0]:.2f}): 8 x n={args.n} {apart:.2f} s, "
                  f"1 x n={8 * args.n} {packed:.2f} s, ratio {apart / packed:.2f}", flush=True)
        return
    for memory in ("default", "kept"):
        env = dict(os.environ, GLIBC_TUNABLES="") if memory == "default" else dict(os.environ)
        subprocess.run([sys.executable, "-m", "studies.serve_load", "--premise-child", memory, "--model", args.model,
                        "--n", str(args.n), "--batch", str(args.batch), "--threads", str(args.threads)],
                       cwd=ROOT, env=env, check=True)


def report(args, rows, offline_rate: float) -> str:
    """One case's measured table as markdown."""
    serial = rows[0]["rate"] if rows else float("nan")
    what = f"PREDICT n={args.n}" if args.mode == "predict" else f"sequential CERTIFY n0={args.n0} n-max={args.n}"
    lines = [f"### {args.model}, {what}", "",
             f"MEASURED ({args.threads} torch thread(s), batch {args.batch}): one image per request, max({args.requests}, "
             f"concurrency) requests per level; the Python API offline (the same images and jobs, packed): "
             f"{offline_rate:.3f} requests/s.", "",
             "| concurrency | requests | requests/s | x serial | x offline | p50 s | p95 s | p99 s | requests per batch |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['concurrency']} | {r['requests']} | {r['rate']:.3f} | {r['rate'] / serial:.2f} "
                     f"| {r['rate'] / offline_rate:.2f} | {r['p50']:.2f} | {r['p95']:.2f} | {r['p99']:.2f} "
                     f"| {r['sharing']:.2f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()

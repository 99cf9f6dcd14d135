"""Sequential vs fixed-n CERTIFY on the demo images: total samples and the certified-accuracy rows.

    python -m diffsmooth.bench.sequential [--images 500] [--n 10000] [--device cuda --precision fp16]

ONE pass per image: n0 selection samples, then the estimation samples in the chunks of
engine/certify/sequential.py's look schedule, each chunk's vote counts recorded. Fixed-n CERTIFY
uses the sum of all chunks (the same samples a `certify --n N` run draws, same seed); the
sequential result is the ENGINE's own rule (certify_sequential) replayed on the recorded chunks,
which is exact because a sequential run's samples are a prefix of the fixed run's and its look
boundaries are the recorded chunk boundaries (tests/bench/test_sequential_bench.py checks the replay
against a real `certify --sequential` run). Writes both TSVs, markdown and JSON to --out.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import click
import torch

from diffsmooth.engine.base_classifier.methods import MethodConfig, method_named
from diffsmooth.engine.certify.cohen import certify_from_counts, top_class
from diffsmooth.engine.certify.jobs import Request
from diffsmooth.engine.certify.sequential import certify_sequential
from diffsmooth.engine.choices import DEFAULT_METHOD, METHODS
from diffsmooth.engine.data import load_dataset
from diffsmooth.engine.demo.run import spread_indices
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.runs.analyze import certified_accuracy, clopper_pearson
from diffsmooth.engine.runs.assemble import ModelSources
from diffsmooth.engine.runs.fast_path import FastPath
from diffsmooth.engine.runs.request import sequential_rule
from diffsmooth.engine.runs.results import CERTIFY_COLUMNS, SEQUENTIAL_EXTRA, ResultWriter, format_radius, format_time
from diffsmooth.engine.runs.stage_build import build_smooth


class _Stopped(Exception):
    """SIGTERM (e.g. from `timeout`) during the run."""


def _stop_on_sigterm(signum, frame):
    raise _Stopped("SIGTERM")


def replay_counter(recorded: dict):
    """count(first, num) served from recorded chunk counts; any other range is a schedule mismatch."""
    def count(first, num):
        if (first, num) not in recorded:
            raise RuntimeError(f"replay asked for samples {first}..{first + num - 1}, which is not a recorded chunk")
        return recorded[(first, num)]
    return count


def _all_of(ranges):
    """A job asking for the counts of every (first, num) range at once."""
    return (yield tuple(Request(first, num) for first, num in ranges))


def certify_both(pipeline, x, image_index: int, *, n0: int, n: int, alpha: float, batch: int, rule):
    """((fixed prediction, radius), (sequential prediction, radius, samples, top votes), votes for cA out of n)
    from one pass."""
    ranges, first = [(0, n0)], n0
    for size in rule.chunks():
        ranges.append((first, size))
        first += size
    # one job asks for every chunk at once: its samples are contiguous, so only the last batch is padded
    counts = [c[0] for c in pipeline.run_one(x, image_index, _all_of(ranges), batch)]    # one configuration
    recorded = dict(zip(ranges, counts))
    total = sum(counts[1:])
    fixed = certify_from_counts(recorded[(0, n0)].tolist(), total.tolist(), alpha, pipeline.sigma)
    c_a = top_class(recorded[(0, n0)].tolist())
    count = replay_counter(recorded)
    sequential, = certify_sequential(lambda first, num: count(first, num)[None], n0, rule)
    return tuple(fixed), (sequential.prediction, sequential.radius, sequential.samples, sequential.top_votes), \
        int(total[c_a]), c_a


def _accuracy_rows(rows, radii):
    out = {}
    for r in radii:
        acc = certified_accuracy(rows, r)
        k = sum(1 for row in rows if int(row["correct"]) == 1 and float(row["radius"]) >= r)
        out[f"{r:g}"] = {"accuracy": acc, "ci95": list(clopper_pearson(k, len(rows)))}
    return out


def markdown(report: dict) -> str:
    s = report["settings"]
    radii = [f"{r:g}" for r in s["radii"]]
    local = f" (m={s['m']}, sigma'={s['local_sigma']})" if "m" in {o.name for o in method_named(s["method"]).options} else ""
    lines = [f"{s['method']} sigma={s['sigma']}{local}, n0={s['n0']}, "
             f"alpha={s['alpha']}, {report['images']} demo images, device={s['device']} {s['precision']}, "
             f"batch={s['batch']}", "",
             "| run | samples (total) | " + " | ".join(f"r={r}" for r in radii) + " |",
             "|" + "---|" * (len(radii) + 2)]
    for key, label in (("fixed", f"fixed-n CERTIFY n={s['n']}"), ("sequential", f"--sequential n-max={s['n']}")):
        accs = report[key]["certified_accuracy"]
        cells = " | ".join(f"{accs[r]['accuracy']:.3f} [{accs[r]['ci95'][0]:.2f}, {accs[r]['ci95'][1]:.2f}]"
                           for r in radii)
        lines.append(f"| {label} | {report[key]['samples']:,} | {cells} |")
    diff = " | ".join(f"{report['difference_points'][r]:+.1f}" for r in radii)
    lines.append(f"| sequential - fixed (points) | {report['speedup']:.2f}x fewer | {diff} |")
    if report.get("stopped_early"):
        lines += ["", f"**{report['stopped_early']}** (the rows above cover the finished images only)"]
    lines += ["", f"wall time of the one shared pass: {report['seconds']:.1f} s "
                  f"({report['fixed']['samples'] / report['seconds']:.0f} samples/s); "
                  f"accuracy cells: value [95% Clopper-Pearson interval over the images]"]
    return "\n".join(lines)


def run(images: int, n: int, n0: int, alpha: float, radii: str, batch: int, device: str, precision: str,
        method: str, sigma: float, m: int, local_sigma: float, seed: int, out, progress: bool = True,
        compile=None, futility=None) -> dict:
    rule = sequential_rule(radii, sigma, alpha, n, futility)
    dataset = load_dataset("embedded")
    indices = spread_indices(len(dataset), images)
    smooth = build_smooth(MethodConfig(method, sigma, m=m, local_sigma=local_sigma), ModelSources.demo(),
                          tuple(dataset.image_shape), dataset.num_classes, device=device, precision=precision,
                          seed=seed, fast=FastPath.resolve(device, compile))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("fixed.tsv", "sequential.tsv"):
        (out / name).unlink(missing_ok=True)
    fixed_w = ResultWriter(out / "fixed.tsv")
    seq_w = ResultWriter(out / "sequential.tsv", CERTIFY_COLUMNS + SEQUENTIAL_EXTRA)
    fixed_rows, seq_rows, seq_samples, votes_for_ca = [], [], 0, []
    start = time.perf_counter()
    stopped = None
    previous_handler = signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        for done, i in enumerate(indices, 1):
            x, label = dataset[i]
            t0 = time.perf_counter()
            fixed_result, seq_result, n_a, c_a = certify_both(smooth.pipeline, x, i, n0=n0, n=n, alpha=alpha,
                                                              batch=batch, rule=rule)
            (f_pred, f_rad), (s_pred, s_rad, used, top_votes) = fixed_result, seq_result
            elapsed = format_time(time.perf_counter() - t0)
            frow = dict(idx=i, label=int(label), predict=f_pred, radius=format_radius(f_rad),
                        correct=int(f_pred == int(label)), time=elapsed)
            srow = dict(frow, predict=s_pred, radius=format_radius(s_rad), correct=int(s_pred == int(label)),
                        samples=used, top_votes=top_votes, selected=c_a)
            fixed_w.write(**frow)
            seq_w.write(**srow)
            fixed_rows.append(frow)
            seq_rows.append(srow)
            seq_samples += used
            votes_for_ca.append(n_a)
            if progress:
                print(f"[{done}/{len(indices)}] image {i}: fixed {f_pred} r={f_rad:.3f} | sequential {s_pred} "
                      f"r={s_rad:.3f} after {used} samples", file=sys.stderr, flush=True)
    except (KeyboardInterrupt, _Stopped) as why:        # e.g. `timeout`: report the images finished so far
        stopped = f"stopped by {type(why).__name__} after {len(fixed_rows)} of {len(indices)} images"
        print(f"# {stopped}", file=sys.stderr)
    finally:
        signal.signal(signal.SIGTERM, previous_handler)
        fixed_w.close()
        seq_w.close()
    if not fixed_rows:
        raise _Stopped("no image finished")
    seconds = time.perf_counter() - start
    fixed_samples = len(fixed_rows) * (n0 + n)
    rows_as_read = lambda rows: [{k: str(v) for k, v in r.items()} for r in rows]   # as analyze reads them
    fixed_acc = _accuracy_rows(rows_as_read(fixed_rows), rule.radii)
    seq_acc = _accuracy_rows(rows_as_read(seq_rows), rule.radii)
    report = {
        "settings": dict(images=images, n=n, n0=n0, alpha=alpha, radii=list(rule.radii), batch=batch, device=device,
                         precision=precision, method=method, sigma=sigma, m=m, local_sigma=local_sigma, seed=seed,
                         futility=rule.describe_futility(), look_schedule=rule.chunks()),
        "images": len(fixed_rows),
        "stopped_early": stopped,
        "fixed": {"samples": fixed_samples, "certified_accuracy": fixed_acc,
                  "votes_for_cA_of_n": votes_for_ca},
        "sequential": {"samples": seq_samples, "certified_accuracy": seq_acc,
                       "samples_per_image": [r["samples"] for r in seq_rows]},
        "speedup": fixed_samples / seq_samples,
        "difference_points": {r: 100 * (seq_acc[r]["accuracy"] - fixed_acc[r]["accuracy"]) for r in fixed_acc},
        "seconds": seconds,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    report["markdown"] = markdown(report)
    (out / "sequential.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "sequential.md").write_text(report["markdown"] + "\n")
    return report


@click.command()
@click.option("--images", type=int, default=500, show_default=True, help="Demo images (spread over the 500).")
@click.option("--n", type=int, default=10000, show_default=True, help="Fixed-n samples = sequential n-max.")
@click.option("--n0", type=int, default=100, show_default=True)
@click.option("--alpha", type=float, default=0.001, show_default=True)
@click.option("--radii", default="0.25,0.5,0.75,1.0", show_default=True)
@click.option("--batch", type=int, default=1000, show_default=True, help="Forward batch (results do not depend on it).")
@click.option("--device", default="cpu", show_default=True)
@click.option("--precision", type=click.Choice(["fp32", "fp16", "bf16"]), default="fp32", show_default=True)
@click.option("--method", type=click.Choice(METHODS), default=DEFAULT_METHOD, show_default=True)
@click.option("--sigma", type=float, default=0.5, show_default=True)
@click.option("--m", "m", type=int, default=5, show_default=True)
@click.option("--local-sigma", type=float, default=0.25, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--futility", default=None, metavar="M|off|RULE:M",
              help="The sequential rule's futility stop, as `certify --futility` [default: the pace rule].")
@click.option("--threads", type=int, default=None, help="CPU threads for torch.")
@click.option("--out", type=click.Path(), default="bench-sequential", show_default=True,
              help="Directory for fixed.tsv, sequential.tsv, sequential.md, sequential.json.")
@click.option("--compile/--no-compile", "compile", default=None,
              help="The compiled static-batch fast path [default: on for CUDA]; a look's padded tail is counted "
                   "by the next look, so no sample is computed twice.")
@click.option("--quiet", is_flag=True)
def main(threads, quiet, **kw):
    """Fixed-n vs --sequential CERTIFY on the demo images; prints the markdown table."""
    if threads:
        torch.set_num_threads(threads)
    try:
        report = run(progress=not quiet, **kw)
    except UserError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(report["markdown"])


if __name__ == "__main__":
    main()

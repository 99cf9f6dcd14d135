"""One table from bench/gpu_check.sh's outputs: seconds per image of the engine and of the
reference-equivalent baseline (same process, same GPU), the targets, peak GPU memory, the vote
agreement report, each step's exit status and time against its limit, the run-time agreement checks
the certify steps printed, and each GPU test log's result.

    python -m diffsmooth.bench.gpu_summary OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from diffsmooth.bench.agreement import table
from diffsmooth.bench.kernel_profile import summary_lines

TARGETS = {"cifar10": {"seconds": 8.0, "ratio": 15.0}, "imagenet": {"seconds": 50.0, "ratio": None}}


def _runs(path: Path):
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip() and '"run"' in line]


def _memory(peak) -> str:
    if not peak or "max_allocated_gib" not in peak:
        return "-"
    return f"{peak['max_allocated_gib']:.1f} / {peak['max_reserved_gib']:.1f}"


def _steps(out: Path):
    """(step, exit status, seconds, limit) from gpu_check.sh's steps.tsv."""
    path = out / "steps.tsv"
    if not path.exists():
        return []
    return [line.split("\t") for line in path.read_text().splitlines() if line.count("\t") == 3]


def _gpu_name(out: Path, runs) -> str:
    """The GPU as the bench runs recorded it, else as the import step printed it ('... gpu NAME')."""
    if runs and runs[0]["machine"].get("gpu"):
        return runs[0]["machine"]["gpu"]
    log = out / "import.log"
    for line in log.read_text().splitlines() if log.exists() else []:
        if " gpu " in line:
            return line.split(" gpu ", 1)[1].strip()
    return "unknown"


def _table_variants(path: Path) -> list:
    """bench.table_gpu's variants: wall time, samples, builds and compiles, rows and cells against the first."""
    if not path.exists():
        return []
    try:
        variants = json.loads(path.read_text())
    except json.JSONDecodeError:
        return ["", "demo table: no result (see table_gpu.txt)"]
    lines = ["", "demo table per variant (rows and cells against the first variant's, the same noise):", "",
             "| variant | wall s | samples | builds | compiles | rows equal | cells equal |", "|---|---|---|---|---|---|---|"]
    first = variants[0]["cells"] if variants else {}
    for v in variants:
        against = v.get("against_first")
        rows = f"{against['equal']} of {against['rows']}" if against else "(reference)"
        cells = "yes" if v["cells"] == first else "NO"
        lines.append(f"| {v['name']} | {v['wall_s']:.1f} | {v['samples']:,} | {v['builds']} | {v['compiles']} | "
                     f"{rows} | {cells} |")
    return lines


# The headline-shaped demo race measured on an H200 on 2026-11-27 (main 3813ad8, before the wrong-class stop and
# extensions deciding one radius): samples per line (docs/table-studies.md, "Measured").
HEADLINE_BEFORE = {"diffsmooth": 10_254_925, "rs": 6_823_919}


def _headline(out: Path) -> list:
    """`headline`'s tables: samples per line against fixed-n and against the measured 2026-11-27 table."""
    lines = []
    for line, before in HEADLINE_BEFORE.items():
        doc = _json(out / f"headline_{line}" / "summary.json")
        if not doc:
            continue
        samples = doc["samples"]
        if not lines:
            lines = ["", "the demo table at the paper's shape (3 sigmas x 500 images, n-max 100,000):", "",
                     "| line | samples | fixed-n | fewer | 2026-11-27 (before) | change | seconds |",
                     "|---|---|---|---|---|---|---|"]
        seconds = (doc.get("seconds") or {}).get("measured")
        lines.append(f"| {line} | {samples['total']:,} | {samples['fixed_n']:,} | "
                     f"{samples['fixed_n'] / max(samples['total'], 1):.1f}x | {before:,} | "
                     f"{samples['total'] / before - 1:+.1%} | {'-' if seconds is None else round(seconds)} |")
    return lines


def summarize(out_dir) -> str:
    out = Path(out_dir)
    lines = []
    runs = _runs(out / "bench.jsonl")
    lines.append(f"GPU: {_gpu_name(out, runs)}")
    if runs:
        lines += ["", *_bench_table(runs)]
    agreement_doc = _json(out / "agreement.json")
    lines += variants_table(runs, agreement_doc, _skipped_variants(out))
    for line in runs:
        profile = line["run"].get("kernel_profile")
        if profile:
            conv = " (fused conv)" if (line["run"].get("fast_path") or {}).get("fused_conv") else ""
            lines += ["", f"{line['run']['models']}{conv}: " + summary_lines(profile)[0]]
    for line in _runs(out / "ablation.jsonl"):
        run, n = line["run"], str(line["settings"]["n"])
        fp = run.get("fast_path") or {}
        label = "with" if fp.get("fused_attention") else "without"
        lines += ["", f"ablation, {run['models']} {label} fused attention: "
                      f"{run['extrapolated']['seconds_per_image'][n]:.2f} s per image at n={int(n):,} "
                      f"(UNet {run['rates']['denoiser_samples_per_s'] / 1e3:.1f} ksamples/s)"]
    sequential = out / "sequential" / "sequential.md"
    if sequential.exists():
        lines += ["", "sequential vs fixed-n CERTIFY:", "", sequential.read_text().strip()]
    lines += _table_variants(out / "table_gpu.txt")
    lines += _headline(out)
    if agreement_doc:
        lines += ["", table(agreement_doc)]
    steps = _steps(out)
    if steps:
        lines += ["", "| step | exit | seconds | limit s |", "|---|---|---|---|"]
        lines += [f"| {name} | {'timed out' if code == '124' else code} | {sec} | {limit} |"
                  for name, code, sec, limit in steps]
    lines += _check_lines(out)
    for tests in sorted(out.glob("*tests*.log")):
        tail = [l for l in tests.read_text().splitlines() if " passed" in l or " failed" in l or " error" in l]
        lines += ["", f"GPU tests ({tests.name}): {tail[-1].strip('= ') if tail else 'no summary line'}"]
    return "\n".join(lines)


def _json(path: Path):
    try:
        return json.loads(path.read_text()) if path.exists() else None
    except json.JSONDecodeError:
        return None


SKIP_PREFIXES = ("skipping variant ", "variant ")


def _skipped_variants(out: Path) -> list:
    """The bench steps' lines about variants not measured (past the deadline, failed), by log."""
    return [f"{log.name}: {line.strip()}" for log in sorted(out.glob("bench_*.txt"))
            for line in log.read_text(errors="replace").splitlines()
            if line.startswith(SKIP_PREFIXES) and ("deadline" in line or "failed" in line)]


def arithmetic_part(spec: str, keep_classifier_batch: bool = True) -> str:
    """A variant's tokens that can change votes: batch=N never does (nor, when asked to drop it,
    classifier-batch=N: the same per-sample maths in other call sizes); 'default' when none is left."""
    dropped = ("batch=",) if keep_classifier_batch else ("batch=", "classifier-batch=")
    kept = [t for t in spec.split("+") if not t.startswith(dropped) and t != "default"]
    return "+".join(kept) or "default"


def _flips(agreement_doc, variant: str) -> str:
    """The agreement row judging `variant` on the demo models: 'compiled fp16 + SPEC' with its batch token
    left out, else with its classifier-batch left out too (the fast path's row for the default): per-sample
    votes that differ, and the verdict."""
    if not agreement_doc:
        return "not judged"
    rows = {row["variant"]: row for row in agreement_doc.get("rows", [])}
    for keep in (True, False):
        kept = arithmetic_part(variant, keep)
        row = rows.get("compiled fp16 (fast path)" if kept == "default" else f"compiled fp16 + {kept}")
        if row is None:
            continue
        if row.get("verdict") == "FAILED":
            return "FAILED to run"
        return f"{row['differ']} of {row['samples']} ({row['verdict']})" + ("" if keep else f" as {kept}")
    return "not judged"


def _rate(value, unit=1e3) -> str:
    return f"{value / unit:.1f}k" if value else "-"


def _share(value) -> str:
    return f"{100 * value:.1f}%" if value else "-"


def variants_table(runs, agreement_doc=None, skipped=()) -> list:
    """One row per measured variant (bench --variants), per model set: samples/s of each stage and its share
    of the peak, seconds per image, speed-up against the default measured in the same process, the vote
    flips bench.agreement found, and peak memory (warm-up / steady state)."""
    named = [line for line in runs if line["run"].get("variant")]
    if not named:
        return []
    lines = ["", "time-per-sample variants, each measured beside the default in one process on this GPU; flips: "
                 "bench.agreement on the demo models against eager fp32, TF32 off", "",
             "| models | variant | batch | UNet samples/s (% of peak) | classifier samples/s (% of peak) | "
             "pipeline samples/s | s/image | vs default | flips | peak GiB warm-up / steady |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for models in dict.fromkeys(line["run"]["models"] for line in named):
        rows = [line for line in named if line["run"]["models"] == models]
        default = next((line for line in rows if line["run"]["variant"] == "default"), None)
        for line in rows:
            run, n = line["run"], str(line["settings"]["n"])
            seconds = run["extrapolated"]["seconds_per_image"][n]
            base = default["run"]["extrapolated"]["seconds_per_image"][n] if default else None
            rates, achieved = run["rates"], run["achieved"]
            phases = (run.get("peak_memory") or {}).get("phases") or {}
            memory = " / ".join(f"{phases[p]['max_allocated_gib']:.1f}" if phases.get(p) else "-"
                                for p in ("warmup", "steady"))
            lines.append(
                f"| {models} | {run['variant']} | {run['batch']} | "
                f"{_rate(rates.get('denoiser_samples_per_s'))} ({_share(achieved.get('denoiser_fraction_of_peak'))}) | "
                f"{_rate(rates.get('classifier_samples_per_s'))} ({_share(achieved.get('classifier_fraction_of_peak'))}) | "
                f"{_rate(rates.get('pipeline_samples_per_s'))} | {seconds:.2f} at n={int(n):,} | "
                f"{'%.2fx' % (base / seconds) if base else '-'} | {_flips(agreement_doc, run['variant'])} | {memory} |")
    if skipped:
        lines += ["", "not measured:", *(f"- {line}" for line in skipped)]
    return lines


CHECK_PREFIXES = ("# fast path vs eager fp32", "error: the fast path disagrees")


def _check_lines(out: Path) -> list:
    """The run-time agreement check's verdicts that the steps' logs printed (certify runs), by log."""
    found = [f"- {log.name}: {line.strip()}" for log in sorted(out.glob("*.txt"))
             for line in log.read_text(errors="replace").splitlines() if line.startswith(CHECK_PREFIXES)]
    return ["", "run-time agreement checks:", *found] if found else []


def _bench_table(runs) -> list:
    """One row per bench run: seconds per image, the reference-equivalent baseline, targets, peak memory."""
    lines = []
    lines.append("| models | n | engine path | warm-up (compile) s | engine s/image | reference-equivalent s/image | "
                 "ratio | target | met | peak GPU memory GiB (allocated / reserved) |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|")
    for line in runs:
        run, settings = line["run"], line["settings"]
        n = str(settings["n"])
        engine = run["extrapolated"]["seconds_per_image"][n]
        ref = run.get("reference_equivalent")
        ref_s = ref["seconds_per_image"][n] if ref else None
        ratio = ref_s / engine if ref_s else None
        target = TARGETS.get(run["models"], {})
        goals, met = [], []
        if target.get("seconds"):
            goals.append(f"<= {target['seconds']:g} s")
            met.append(engine <= target["seconds"])
        if target.get("ratio") and ratio is not None:
            goals.append(f">= {target['ratio']:g}x")
            met.append(ratio >= target["ratio"])
        fp = run.get("fast_path") or {}
        path = f"{run['backend']} {run['precision']}" + "".join(
            f", {k}" for k, on in (("compiled", fp.get("compile")), ("CUDA graphs", fp.get("cuda_graphs")),
                                   ("2 streams", fp.get("streams") == 2),
                                   ("fused attention", fp.get("fused_attention")),
                                   ("fused conv", fp.get("fused_conv"))) if on) + (
            f" [variant {run['variant']}, batch {run['batch']}]" if run.get("variant") else "")
        lines.append(f"| {run['models']} | {int(n):,} | {path} | {run['warmup']['first_batch_s']:.0f} | {engine:.2f} | "
                     f"{'%.1f' % ref_s if ref_s else '-'} | {'%.1fx' % ratio if ratio else '-'} | "
                     f"{', '.join(goals) or '-'} | {('yes' if all(met) else 'NO') if met else '-'} | "
                     f"{_memory(run.get('peak_memory'))} |")
    return lines


if __name__ == "__main__":
    print(summarize(sys.argv[1] if len(sys.argv) > 1 else "."))

"""Human-readable output of a benchmark document: terminal tables, and the sweep plot (PNG)."""

from __future__ import annotations

from typing import List, Optional, Sequence

from diffsmooth.engine.base_classifier.methods import method_named

from .kernel_profile import summary_lines

STAGE_LABELS = {"noise": "noise generation", "denoise": "denoise (UNet)", "classify": "classify (+local smoothing)",
                "vote_count": "vote count (argmax, scatter-add, sync)", "statistics": "statistics (Clopper-Pearson)",
                "io": "I/O (row write, fsync)"}


def table(headers: Sequence[str], rows: Sequence[Sequence], align: Optional[str] = None) -> str:
    """A plain-text table; `align` is one 'l'/'r' per column (numbers right by default)."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    align = align or "l" + "r" * (len(headers) - 1)

    def fmt(r):
        return "  ".join(c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(r, widths, align))

    lines = [fmt(cells[0]), "  ".join("-" * w for w in widths)]
    lines += [fmt(r) for r in cells[1:]]
    return "\n".join(lines)


def si(x: Optional[float], unit: str = "", digits: int = 3) -> str:
    """1.23e10 -> '12.3 G' (+unit); None -> '-'."""
    if x is None:
        return "-"
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= factor:
            return f"{x / factor:.{digits}g} {prefix}{unit}"
    return f"{x:.{digits}g} {unit}".rstrip()


def seconds(x: Optional[float]) -> str:
    if x is None:
        return "-"
    if x >= 3600:
        return f"{x:,.0f} s ({x / 3600:.1f} h)"
    if x >= 10:
        return f"{x:,.0f} s"
    if x >= 0.01:
        return f"{x:.3g} s"
    return f"{x * 1e3:.3g} ms"


def pct(x: Optional[float]) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def render(doc: dict) -> str:
    """The whole report as text: machine, settings, per run: rates, stage split, FLOPs, extrapolation,
    reference-equivalent ratio, and published times when compared."""
    m, s = doc["machine"], doc["settings"]
    out: List[str] = []
    hw = m["gpu"] or f"{m['cpu_model']} ({m['cpu_cores']} cores, torch threads {m['torch_threads']})"
    out.append(f"machine: {hw}; load average {m['load_average']}; torch {m['torch']}, "
               f"onnxruntime {m['onnxruntime'] or 'not installed'}")
    mm = f", m={s['m']}, sigma'={s['local_sigma']}" if "m" in {o.name for o in method_named(s["method"]).options} else ""
    out.append(f"models: {s['models']}; method {s['method']}, sigma={s['sigma']}{mm}; n0={s['n0']}, n={s['n']}, "
               f"batch {s['batch']}, {s['images']} image(s), device {s['device']}")
    for skip in doc["skipped"]:
        what = (f"variant {skip['variant']}" if "backend" not in skip else
                f"{skip['backend']}/{skip['precision']}" + (f" of variant {skip['variant']}" if "variant" in skip else ""))
        out.append(f"skipped {what}: {skip['reason']}")
    for run in doc["runs"]:
        out += _run_lines(run)
    if doc.get("sweep"):
        out += _sweep_lines(doc["sweep"])
    return "\n".join(out)


def _run_lines(run: dict) -> List[str]:
    """One run's section: memory, weights, what was measured, rates and FLOPs, time split, extrapolation."""
    out = [""]
    variant = f" [variant {run['variant']}, batch {run['batch']}]" if run.get("variant") else ""
    out.append(f"== {run['backend']} / {run['precision']} on {run['device']}{variant}: {run['stages']}")
    phases = (run.get("peak_memory") or {}).get("phases") or {}
    if phases:
        out.append("   peak GPU memory (allocated / reserved GiB): " + ", ".join(
            f"{name} {p['max_allocated_gib']:.1f} / {p['max_reserved_gib']:.1f}" for name, p in phases.items() if p))
    info = run["model_info"]
    out.append(f"   weights: {info['weights']}; denoiser {info.get('denoiser')}, classifier {info.get('classifier')}")
    meas, f = run["measured"], run["flops"]
    out.append(f"   measured: {meas['images']} image(s) x (n0 {meas['n0_measured']} + n {meas['n_measured']}) "
               f"samples, batch {meas['batch']}; warm-up excluded: build models "
               f"{seconds(run['warmup']['build_models_s'])}, build stages {seconds(run['warmup']['build_stages_s'])}, "
               f"first batch {seconds(run['warmup']['first_batch_s'])}")
    r, a = run["rates"], run["achieved"]
    rows = [["denoiser", si(r["denoiser_samples_per_s"], "samples/s"), si(f["denoiser_per_sample"], "FLOP"),
             si(a["denoiser_flops_per_s"], "FLOP/s"), pct(a["denoiser_fraction_of_peak"])],
            [f"classifier (x{f['classifier_calls_per_sample']} calls)", si(r["classifier_samples_per_s"], "samples/s"),
             si(f["classifier_per_sample"], "FLOP"), si(a["classifier_flops_per_s"], "FLOP/s"),
             pct(a["classifier_fraction_of_peak"])],
            ["whole pipeline", si(r["pipeline_samples_per_s"], "samples/s"), si(f["total_per_sample"], "FLOP"),
             si(a["pipeline_flops_per_s"], "FLOP/s"), pct(a["pipeline_fraction_of_peak"])]]
    out.append(_indent(table(["stage", "rate", "FLOPs/sample", "achieved", "of peak"], rows)))
    out.append(f"   peak: {si(a['peak_flops_per_s'], 'FLOP/s')} ({a['peak_source']}); {f['convention']}")
    st = meas["stage_seconds"]
    total = sum(st.values())
    rows = [[STAGE_LABELS[k], seconds(v / meas["images"]), pct(v / total if total else None)]
            for k, v in st.items()]
    rows.append(["total per measured image", seconds(total / meas["images"]), ""])
    out.append(_indent(table(["time split (per image, measured)", "seconds", "share"], rows)))
    if run.get("kernel_profile"):
        out += [f"   {line}" for line in summary_lines(run["kernel_profile"])]
    return out + _extrapolation_lines(run)


def _extrapolation_lines(run: dict) -> List[str]:
    """Seconds per certified image extrapolated, beside the reference-equivalent baseline and published times."""
    meas, r, out = run["measured"], run["rates"], []
    ex = run["extrapolated"]
    ref = run.get("reference_equivalent")
    rows = []
    for n, sec in ex["seconds_per_image"].items():
        rows.append([f"n0={ex['n0']:,}, n={int(n):,}", seconds(sec),
                     seconds(ref["seconds_per_image"][n]) if ref else "-"])
    out.append(_indent(table(["seconds per certified image (extrapolated)", "engine", "reference-equivalent"], rows)))
    out.append(f"   ({ex['note']})")
    if ref:
        out.append(f"   engine vs reference-equivalent on this machine: {ref['speedup']:.2f}x "
                   f"({si(r['pipeline_samples_per_s'], 'samples/s')} at batch {meas['batch']} vs "
                   f"{si(ref['samples_per_s'], 'samples/s')} at batch {ref['batch']}; same models, same samples)")
    cmp_ = run.get("compare")
    if cmp_:
        rows = []
        for c in cmp_["rows"]:
            rows.append([f"{c['dataset']} {c['method']}" + (f" m={c['m']}" if c["m"] else ""), f"{c['n']:,}",
                         seconds(c["published_s"]), c["source"], seconds(c["measured_extrapolated_s"]),
                         f"{c['measured_over_published']:.3g}x" if c["measured_over_published"] else "-",
                         f"{c['published_implied_tflops']:.1f}" if c.get("published_implied_tflops") else "-"])
        out.append(_indent(table(["published", "n", "s/image", "where", "this run (extrap.)", "ratio",
                                  "implied TFLOP/s"], rows, "lrrlrrr")))
        out.append(f"   NOTE: {cmp_['note']}")
    return out


def _sweep_lines(sw: dict) -> List[str]:
    """The sweep's seconds per certified image, rows m, columns batch."""
    out = ["", f"== sweep ({sw['backend']}/{sw['precision']}): seconds per certified image at n0={sw['n0']:,}, "
               f"n={sw['n']:,} (extrapolated), rows m, columns batch"]
    rows = [[f"m={m}"] + [seconds(v) for v in row] for m, row in zip(sw["ms"], sw["table"])]
    out.append(_indent(table(["", *[f"batch {b}" for b in sw["batches"]]], rows)))
    if sw.get("plot"):
        out.append(f"   plot: {sw['plot']}")
    return out


def _indent(text: str, by: str = "   ") -> str:
    return "\n".join(by + line for line in text.splitlines())


def plot_sweep(sweep: dict, path: str, title: str = "") -> str:
    """PNG: seconds per certified image vs m (one line per batch) and vs batch (one line per m)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    grid = sweep["table"]
    for j, b in enumerate(sweep["batches"]):
        ax1.plot(sweep["ms"], [row[j] for row in grid], marker="o", label=f"batch {b}")
    ax1.set_xlabel("m (local noises)")
    ax1.set_ylabel(f"seconds per certified image (n={sweep['n']:,}, extrapolated)")
    ax1.legend(fontsize=8)
    ax1.grid(alpha=0.3)
    for i, m in enumerate(sweep["ms"]):
        ax2.plot(sweep["batches"], grid[i], marker="o", label=f"m={m}")
    ax2.set_xscale("log", base=2)
    ax2.set_xlabel("batch size")
    ax2.legend(fontsize=8)
    ax2.grid(alpha=0.3)
    fig.suptitle(title or "time per certified image")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)

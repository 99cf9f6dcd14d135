"""The `diffsmooth` command line (click). Thin: it parses options, then calls the engine.

Every user-fixable problem (UserError) prints one line `error: ...` and exits with code 2.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click


class _CLIError(click.ClickException):
    exit_code = 2

    def show(self, file=None):
        click.echo(f"error: {self.message}", err=True)


class _Group(click.Group):
    """Turns UserError (and a few OS errors) from any command into one line and exit code 2."""

    def invoke(self, ctx):
        from diffsmooth.engine.errors import UserError
        try:
            return super().invoke(ctx)
        except UserError as exc:
            raise _CLIError(str(exc)) from None
        except (FileNotFoundError, IsADirectoryError, PermissionError) as exc:
            raise _CLIError(f"{exc.strerror}: {exc.filename}") from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="diffsmooth-engine")
def main():
    """DiffSmooth certification: diffusion denoiser + local smoothing, certified with CERTIFY."""


def _positive(name):
    def check(ctx, param, value):
        if value is not None and value < 1:
            raise click.BadParameter(f"must be >= 1, got {value}")
        return value
    return check


def model_options(f):
    """Options naming the models; with none of them the embedded demo models are used."""
    options = [
        click.option("--denoiser", type=click.Path(), help="UNet checkpoint (improved-/guided-diffusion state dict)."),
        click.option("--preset", type=click.Choice(["cifar10", "imagenet", "demo"]),
                     help="UNet architecture + schedule [default: cifar10, or demo for the embedded models]."),
        click.option("--unet-config", default=None, help="JSON of UNet config fields overriding the preset."),
        click.option("--schedule", type=click.Choice(["linear", "cosine"]), help="Override the preset's schedule."),
        click.option("--diffusion-steps", type=int, help="Override the preset's number of diffusion steps."),
        click.option("--classifier", type=click.Path(), multiple=True,
                     help="Classifier checkpoint (Cohen/SmoothAdv dict or state dict); repeat for a sweep."),
        click.option("--arch", help="Classifier architecture when the checkpoint does not say."),
        click.option("--normalization", type=click.Choice(["normalize", "center", "none"]),
                     help="Input layer in front of the classifier [default: per dataset]."),
        click.option("--stats", type=click.Choice(["cifar10", "imagenet", "fashion-mnist"]),
                     help="Mean/std for normalisation [default: from --dataset]."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def method_options(f):
    options = [
        click.option("--method", type=click.Choice(["rs", "dds", "diffsmooth"]), multiple=True,
                     default=["diffsmooth"], show_default=True, help="Repeat for a sweep."),
        click.option("--sigma", type=float, default=0.5, show_default=True, help="Smoothing noise std (input in [0,1])."),
        click.option("--local-sigma", type=float, multiple=True, default=[0.25], show_default=True,
                     help="sigma' of the local noises; repeat for a sweep."),
        click.option("--m", "--num-local", "m", type=int, multiple=True, default=[5], show_default=True,
                     help="Number of local noises; repeat for a sweep (nested: m=21 serves 1,3,5,11)."),
        click.option("--local-noise", type=click.Choice(["fixed", "fresh"]), default="fixed", show_default=True,
                     help="fixed: drawn once (seed 42), as the reference; fresh: new per sample (Algorithm 3)."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def run_options(f):
    options = [
        click.option("--dataset", type=click.Choice(["cifar10", "imagenet", "npz", "idx", "embedded"]),
                     help="Dataset layout [default: embedded demo subset]."),
        click.option("--data", type=click.Path(), help="Dataset directory or file."),
        click.option("--split", default="test", show_default=True),
        click.option("--n0", type=int, default=100, show_default=True, callback=_positive("n0")),
        click.option("--n", "--num-samples", "n", type=int, default=10000, show_default=True, callback=_positive("n"),
                     help="Monte Carlo samples for estimation (--num-samples: the same, for torchrun)."),
        click.option("--alpha", type=float, default=0.001, show_default=True),
        click.option("--batch", type=int, default=None, callback=_positive("batch"),
                     help="Noisy samples per Monte Carlo batch [default: 1000 on CPU; on CUDA 2000 for images "
                          "up to 64x64, else 32]. Counts do not depend on it on CPU fp32 (see README)."),
        click.option("--skip", type=int, default=1, show_default=True, callback=_positive("skip"),
                     help="Use every skip-th image."),
        click.option("--max", "--max-index", "max_index", type=int, default=None,
                     help="Stop before this dataset index (--max-index: the same, for torchrun)."),
        click.option("--seed", type=int, default=0, show_default=True, help="Noise seed (per image, per sample)."),
        click.option("--backend", type=click.Choice(["torch", "onnxruntime", "tensorrt"]), default="torch",
                     show_default=True),
        click.option("--onnx-dir", type=click.Path(),
                     help="Exported graphs for --backend onnxruntime (and their built plans for tensorrt)."),
        click.option("--device", default="cpu", show_default=True, help="cpu, cuda or cuda:N."),
        click.option("--precision", type=click.Choice(["fp32", "fp16", "bf16"]), default="fp32", show_default=True),
        click.option("--compile/--no-compile", "compile", default=None,
                     help="torch.compile the stages at one static batch shape [default: on for CUDA]."),
        click.option("--cuda-graphs/--no-cuda-graphs", "cuda_graphs", default=None,
                     help="Replay each compiled stage from a CUDA graph [default: on with --compile on CUDA]."),
        click.option("--streams", type=click.IntRange(1, 2), default=None,
                     help="2: denoise batch k+1 while classifying batch k on two CUDA streams [default: 2 on CUDA]."),
        click.option("--fused-attention/--no-fused-attention", "fused_attention", default=None,
                     help="Run the UNet's attention through scaled_dot_product_attention (flash kernels) "
                          "[default: on with --compile on CUDA]."),
        click.option("--fused-conv/--no-fused-conv", "fused_conv", default=False,
                     help="ResNet classifiers with BatchNorm folded into the convolutions and conv + add + ReLU "
                          "as one cuDNN call on CUDA [default: off; not yet measured on a GPU]."),
        click.option("--validate-samples", type=click.IntRange(0), default=1000, show_default=True,
                     help="Samples of the first image on which a compiled / fp16 / bf16 path is checked against "
                          "eager fp32 once per run (0: skip)."),
        click.option("--min-agreement", type=click.FloatRange(0, 1), default=0.999, show_default=True,
                     help="Refuse the run when fewer votes agree with eager fp32 in that check."),
        click.option("--out", type=click.Path(), required=True, help="Result TSV (resumed if it exists)."),
        click.option("--shard", default=None, metavar="I/K",
                     help="Certify only shard I of K of the selected images (e.g. Slurm arrays); "
                          "merge with `diffsmooth merge`. Under torchrun the rank is the shard."),
        click.option("--threads", type=int, default=None, callback=_positive("threads"),
                     help="CPU threads for torch (default: torch's choice; on a shared machine use fewer)."),
        click.option("--quiet", is_flag=True, help="No progress bar."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _sources(kw, dataset_kind):
    from diffsmooth.engine.runs.assemble import ModelSources, parse_unet_config
    unet_config = parse_unet_config(kw["unet_config"])
    default_stats = {"cifar10": "cifar10", "imagenet": "imagenet", "idx": "fashion-mnist",
                     "embedded": "fashion-mnist", "npz": "cifar10"}[dataset_kind]
    given = dict(denoiser=kw["denoiser"], preset=kw["preset"], unet_config=unet_config or None,
                 schedule=kw["schedule"], diffusion_steps=kw["diffusion_steps"],
                 classifier=kw["classifier"], arch=kw["arch"], normalization=kw["normalization"],
                 stats=kw["stats"] or default_stats)
    if not kw["denoiser"] and not kw["classifier"]:
        return ModelSources.demo(**{k: v for k, v in given.items() if k not in ("denoiser", "classifier")})
    if given["preset"] is None and not unet_config:
        given["preset"] = "cifar10"
    given["unet_config"] = unet_config
    return ModelSources(**given)


def _dataset(kw):
    """The dataset and the selected indices (Cohen's --skip/--max convention)."""
    from diffsmooth.engine.data import load_dataset
    from diffsmooth.engine.errors import UserError, check_alpha
    kind = kw["dataset"] or ("embedded" if not kw["data"] else None)
    if kind is None:
        raise UserError("--data given without --dataset: say which layout it is (cifar10, imagenet, npz, idx)")
    dataset = load_dataset(kind, kw["data"], split=kw["split"])
    check_alpha(kw["alpha"])
    return kind, dataset, dataset.indices_selected(kw["skip"], kw["max_index"])


def _set_threads(kw):
    if kw.get("threads"):
        import torch
        torch.set_num_threads(kw["threads"])


def _is_sweep(kw) -> bool:
    return any(len(kw[k]) > 1 for k in ("method", "local_sigma", "m", "classifier"))


def _single(kw):
    """Options of a single-configuration run: the first (only) value of each repeatable option."""
    single = dict(kw)
    for key in ("method", "local_sigma", "m"):
        single[key] = kw[key][0]
    single["classifier"] = kw["classifier"][0] if kw["classifier"] else None
    return single


def _fast_path(kw):
    from diffsmooth.engine.runs.fast_path import FastPath
    if kw["backend"] != "torch":
        return FastPath()
    return FastPath.resolve(kw["device"], kw["compile"], kw["cuda_graphs"], kw["streams"], kw["fused_attention"],
                            kw["fused_conv"])


def _samples_per_pass(kw, mode):
    """Samples one image's votes take in one chain of passes (None for sequential looks): what a
    static batch is aligned to."""
    if kw.get("sequential"):
        return None
    return kw["n"] if mode == "predict" else kw["n0"] + kw["n"]


def _prepare(kw, mode="certify"):
    """Dataset, selected indices, method config, Smooth and shard plan from the parsed options.
    The result file's recorded settings are checked before any model is built or compiled."""
    from diffsmooth.engine.base_classifier.methods import MethodConfig
    from diffsmooth.engine.errors import UserError
    from diffsmooth.engine.runs.assemble import build_checked_smooth
    from diffsmooth.engine.runs.fast_path import default_static_batch
    from diffsmooth.engine.runs.sharding import plan_from, rank_device

    _set_threads(kw)
    kind, dataset, indices = _dataset(kw)
    if not indices:
        raise UserError("no images selected (check --skip / --max)")
    config = MethodConfig(kw["method"], kw["sigma"], kw["m"], kw["local_sigma"], kw["local_noise"])
    sources = _sources(kw, kind)
    plan = plan_from(kw["shard"], kw["device"])
    device = rank_device(plan, kw["device"])
    fast = _fast_path(dict(kw, device=device))
    kw["batch"] = kw["batch"] or default_static_batch(device, tuple(dataset.image_shape),
                                                      _samples_per_pass(kw, mode), fast.static_batch)
    kw["fast_path"] = fast.as_dict()
    from diffsmooth.engine.runs.results import check_or_record_settings, shard_path
    check_or_record_settings(kw["out"] if plan.num_shards == 1 else shard_path(kw["out"], plan.shard, plan.num_shards),
                             _settings(mode, kw), record=False)
    first = plan.take(indices)[0] if plan.take(indices) else indices[0]
    smooth = build_checked_smooth(config, sources, tuple(dataset.image_shape), dataset.num_classes,
                                  dataset[first][0], first, kw["batch"], backend=kw["backend"], device=device,
                                  precision=kw["precision"], seed=kw["seed"], onnx_dir=kw["onnx_dir"], fast=fast,
                                  validate_samples=kw["validate_samples"], min_agreement=kw["min_agreement"])
    return dataset, indices, config, smooth, plan


def _certify_sweep(kw):
    """Several classifiers / sigma' / m / methods at one sigma: denoise once, vote many times."""
    from pathlib import Path as _Path
    from diffsmooth.engine.demo import shipped as demo_assets
    from diffsmooth.engine.runs.assemble import load_denoiser_from
    from diffsmooth.engine.backends.torch_backend import TorchBackend
    from diffsmooth.engine.models.checkpoints import load_classifier
    from diffsmooth.engine.errors import UserError
    from diffsmooth.engine.base_classifier.methods import MethodConfig
    from diffsmooth.engine.runs.sweep import SweepPipeline, plan_entries, run_sweep

    if kw["backend"] != "torch" or kw["shard"]:
        raise UserError("sweeps run on the torch backend in one process (no --backend onnxruntime/tensorrt "
                        "or --shard yet)")
    if kw["fused_conv"]:
        raise UserError("--fused-conv is for single configurations; sweeps run the classifiers unfolded")
    for method in kw["method"]:                     # validates sigma, every sigma' and m
        for ls in kw["local_sigma"]:
            for m in kw["m"]:
                MethodConfig(method, kw["sigma"], m, ls, kw["local_noise"])
    _set_threads(kw)
    kind, dataset, indices = _dataset(kw)
    sources = _sources(dict(kw, classifier=kw["classifier"][0] if kw["classifier"] else None), kind)
    if kw["classifier"]:
        paths = {_Path(p).stem: p for p in kw["classifier"]}
        if len(paths) != len(kw["classifier"]):
            raise UserError("sweep classifiers need distinct file names (they name the result files)")
        classifiers_for = lambda method, ls: list(paths)
    else:
        paths = {}

        def classifiers_for(method, ls):
            path = demo_assets.demo_classifier_for(method, kw["sigma"], ls if ls is not None else 0.0)
            paths[path.stem] = str(path)
            return [path.stem]
    entries = plan_entries(kw["method"], classifiers_for, kw["local_sigma"], kw["m"])
    modules = {name: load_classifier(paths[name], arch=sources.arch, dataset=sources.stats,
                                     normalization=sources.normalization) for name in {e.classifier for e in entries}}
    from diffsmooth.engine.runs.fast_path import default_static_batch
    fast = _fast_path(kw)
    kw["batch"] = kw["batch"] or default_static_batch(kw["device"], tuple(dataset.image_shape),
                                                      _samples_per_pass(kw, "certify"), fast.static_batch)
    kw["fast_path"] = fast.as_dict()
    backend = TorchBackend(kw["device"], kw["precision"],
                           compile=fast.compile, cuda_graphs=fast.cuda_graphs)
    purify = None
    if any(e.method != "rs" for e in entries):
        purify = backend.stage(load_denoiser_from(sources).purifier(kw["sigma"], fast.fused_attention), "denoiser")
    shape = tuple(dataset.image_shape)
    num_classes = _probe_classes(backend, modules, shape, dataset.num_classes)
    pipeline = SweepPipeline(entries, modules, purify, backend, kw["sigma"], shape, num_classes,
                             kw["local_noise"], seed=kw["seed"], static_batch=fast.static_batch,
                             compiled_noise=fast.compiled_noise)
    settings = _settings("certify", dict(kw, method=list(kw["method"]), local_sigma=list(kw["local_sigma"]),
                                         m=list(kw["m"]), classifier=list(kw["classifier"])))
    click.echo(f"# sweep: {len(entries)} configurations at sigma={kw['sigma']}, images={len(indices)} -> {kw['out']}/",
               err=True)
    summary = run_sweep(pipeline, dataset, indices, kw["out"], n0=kw["n0"], n=kw["n"], alpha=kw["alpha"],
                        batch=kw["batch"], settings=settings, progress=not kw["quiet"],
                        sequential=_sequential_rule(kw))
    _report(summary)


def _probe_classes(backend, modules, shape, data_classes):
    """Classes scored by every classifier (they must agree and cover the data's labels)."""
    import torch
    from diffsmooth.engine.errors import UserError, first_line
    counts = set()
    for name, module in modules.items():
        try:
            stage = backend.stage(module, name)
            probe = getattr(stage, "eager", stage)          # no compile for a batch-1 probe
            counts.add(int(probe(torch.full((1, *shape), 0.5, device=backend.device)).shape[1]))
        except RuntimeError as exc:
            raise UserError(f"classifier {name} cannot take images of shape {shape}: "
                            f"{first_line(exc)}") from None
    if len(counts) != 1:
        raise UserError(f"the sweep's classifiers score different numbers of classes: {sorted(counts)}")
    k = counts.pop()
    if data_classes and data_classes > k:
        raise UserError(f"the data has labels up to {data_classes - 1} but the classifiers score only {k} classes")
    return k


def sequential_options(f):
    """Early stopping with an anytime-valid bound (engine/certify/sequential.py)."""
    options = [
        click.option("--sequential", is_flag=True,
                     help="Stop each image once every --radii answer is settled (anytime-valid bound); "
                          "adds a `samples` column."),
        click.option("--radii", default=None, help="With --sequential: the radii to settle, e.g. 0.25,0.5,0.75,1.0."),
        click.option("--n-max", type=int, default=None, callback=_positive("n-max"),
                     help="With --sequential: most estimation samples per image [default: --n]."),
        click.option("--futility", default=None, metavar="K|off",
                     help="With --sequential: stop an image once even its vote rate + K standard errors "
                          "would not certify the next radius at n-max [default: 1.25]; 'off' runs such "
                          "images to n-max. Validity does not depend on it."),
        click.option("--bound", default=None, type=click.Choice(["split-cp", "mixture"]),
                     help="With --sequential: split-cp (Clopper-Pearson split over the looks fixed by n-max; "
                          "the fewest samples) or mixture (valid at every sample, so a budget can be extended "
                          "later) [default: split-cp]."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _sequential_rule(kw):
    """The SequentialRule of a --sequential run, else None."""
    from diffsmooth.engine.certify.sequential import rule_from_options
    from diffsmooth.engine.errors import UserError
    if not kw.get("sequential"):
        if kw.get("radii") or kw.get("n_max") or kw.get("futility") or kw.get("bound"):
            raise UserError("--radii, --n-max, --futility and --bound belong to --sequential")
        return None
    return rule_from_options(kw["radii"], kw["sigma"], kw["alpha"], kw["n_max"] or kw["n"], kw.get("futility"),
                             kw.get("bound"))


@main.command()
@model_options
@method_options
@run_options
@sequential_options
def certify(**kw):
    """CERTIFY each selected image; one TSV row per image (idx label predict radius correct time).

    Several --method / --classifier / --local-sigma / --m values make a sweep: --out is then a
    directory with one TSV per configuration and index.json; the denoiser runs once per batch.
    """
    _sequential_rule(kw)                            # option errors before any model is loaded
    if _is_sweep(kw):
        return _certify_sweep(kw)
    kw = _single(kw)
    dataset, indices, config, smooth, plan = _prepare(kw)
    rule = _sequential_rule(kw)
    samples = f"n={kw['n']}" if rule is None else f"sequential n-max={rule.n_max} radii={list(rule.radii)}"
    click.echo(f"# {smooth.pipeline.describe()}; batch={kw['batch']} sigma={config.sigma} n0={kw['n0']} {samples} "
               f"alpha={kw['alpha']} images={len(indices)} -> {kw['out']}", err=True)
    _run_sharded("certify", kw, dataset, indices, smooth, plan)


@main.command()
@model_options
@method_options
@run_options
def predict(**kw):
    """PREDICT each selected image (abstain = -1); TSV rows idx label predict correct time."""
    from diffsmooth.engine.errors import UserError
    if _is_sweep(kw):
        raise UserError("predict takes one configuration: give each of --method/--classifier/--local-sigma/--m once")
    kw = _single(kw)
    dataset, indices, config, smooth, plan = _prepare(kw, "predict")
    _run_sharded("predict", kw, dataset, indices, smooth, plan)


def _run_sharded(mode, kw, dataset, indices, smooth, plan):
    """Run this process's share; under torchrun rank 0 merges the shards into --out."""
    from diffsmooth.engine.runs.sharding import finish, wait_for_all
    from diffsmooth.engine.runs.results import check_or_record_settings, merge_results, shard_path
    from diffsmooth.engine.runs.dataset_run import run_dataset
    out = kw["out"] if plan.num_shards == 1 else shard_path(kw["out"], plan.shard, plan.num_shards)
    check_or_record_settings(out, _settings(mode, kw))
    summary = run_dataset(smooth, dataset, plan.take(indices), out, mode=mode, n0=kw["n0"], n=kw["n"],
                          alpha=kw["alpha"], batch=kw["batch"], progress=not kw["quiet"],
                          sequential=_sequential_rule(kw))
    _report(summary)
    wait_for_all(plan)
    if plan.is_merger and not summary["interrupted"]:
        shards = [shard_path(kw["out"], i, plan.num_shards) for i in range(plan.num_shards)]
        count = merge_results(shards, kw["out"])
        click.echo(f"merged {count} rows from {plan.num_shards} ranks into {kw['out']}", err=True)
    elif plan.num_shards > 1 and not plan.distributed:
        click.echo(f"shard {plan.shard}/{plan.num_shards} done; when all are, run "
                   f"`diffsmooth merge {kw['out']} {shard_path(kw['out'], '*', plan.num_shards)}`", err=True)
    finish(plan)


def _settings(mode, kw):
    """What determines the rows of a result file (a resumed run must match it)."""
    keys = ("method", "sigma", "local_sigma", "m", "local_noise", "n0", "n", "alpha", "seed",
            "dataset", "data", "split", "denoiser", "preset", "unet_config", "classifier", "arch",
            "normalization", "stats", "backend", "precision", "batch", "fast_path")
    settings = {k: kw.get(k) for k in keys}
    # Counts repeat exactly at a fixed batch size, precision and kernel choice; across batch sizes
    # only on CPU fp32 (measured on CUDA: fp16 changed 10 of 30,000 votes): a resume must match all.
    settings["device_type"] = str(kw.get("device", "cpu")).split(":")[0]
    settings["mode"] = mode
    if mode == "predict":
        settings.pop("n0")
    rule = _sequential_rule(kw)
    if rule is not None:
        settings.pop("n")                       # n only sets n-max's default
        settings.update(sequential=True, radii=list(rule.radii), n_max=rule.n_max, futility=rule.futility,
                        look_growth=rule.growth, bound=rule.bound)
    if kw["method"] != "diffsmooth" and not isinstance(kw["method"], list):
        for k in ("local_sigma", "m", "local_noise"):
            settings.pop(k)
    return settings


def _report(summary):
    state = "interrupted after" if summary["interrupted"] else "wrote"
    click.echo(f"{state} {summary['written']} rows ({summary['skipped_done']} already done) to {summary['path']}",
               err=True)


@main.command()
@click.argument("files", nargs=-1, required=True, type=click.Path())
@click.option("--radii", default="0,0.25,0.5,0.75,1.0,1.25,1.5", show_default=True,
              help="Comma-separated radii for the table.")
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of the table.")
@click.option("--plot", type=click.Path(), help="Write a certified-accuracy curve PNG here.")
def analyze(files, radii, as_json, plot):
    """Certified accuracy at radii and ACR for result TSVs (either time format)."""
    from diffsmooth.engine.runs.analyze import best_per_radius, markdown_table, plot_curves, summarize, to_json
    from diffsmooth.engine.errors import UserError
    try:
        radii = [float(r) for r in radii.split(",") if r.strip()]
    except ValueError:
        raise UserError(f"--radii must be comma-separated numbers, got {radii!r}") from None
    paths = _expand_result_files(files)
    summaries = [summarize(p, radii) for p in paths]
    if as_json:
        click.echo(to_json(summaries))
    else:
        click.echo(markdown_table(summaries, radii))
        if len(summaries) > 1:
            click.echo("\n" + best_per_radius(summaries, radii))
    if plot:
        plot_curves(paths, plot)
        click.echo(f"wrote {plot}", err=True)


@main.command()
@click.option("--out", type=click.Path(), default="demo-out", show_default=True, help="Output directory.")
@click.option("--images", type=int, default=30, show_default=True, callback=_positive("images"),
              help="K test images (spread over the 500 shipped ones).")
@click.option("--n", "n", type=int, default=500, show_default=True, callback=_positive("n"),
              help="Monte Carlo samples per image (the largest certifiable radius grows with n).")
@click.option("--n0", type=int, default=100, show_default=True, callback=_positive("n0"))
@click.option("--alpha", type=float, default=0.001, show_default=True)
@click.option("--sigma", type=float, default=0.5, show_default=True)
@click.option("--local-sigma", type=float, default=0.25, show_default=True)
@click.option("--m", "m", type=int, default=5, show_default=True)
@click.option("--batch", type=int, default=200, show_default=True, callback=_positive("batch"))
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--device", default="cpu", show_default=True, help="cpu, cuda or cuda:N.")
@click.option("--precision", type=click.Choice(["fp32", "fp16", "bf16"]), default="fp32", show_default=True)
@click.option("--compile/--no-compile", "compile", default=None,
              help="Compiled static-shape stages (+ CUDA graphs, 2 streams on CUDA) [default: on for CUDA].")
@click.option("--threads", type=int, default=None, callback=_positive("threads"), help="CPU threads for torch.")
@click.option("--quiet", is_flag=True)
def demo(out, images, n, n0, alpha, sigma, local_sigma, m, batch, seed, device, precision, compile, threads, quiet):
    """Certify K shipped Fashion-MNIST images with rs, dds and diffsmooth on the embedded models."""
    from diffsmooth.engine.demo.run import run_demo
    from diffsmooth.engine.errors import check_alpha
    _set_threads({"threads": threads})
    check_alpha(alpha)
    from diffsmooth.engine.runs.fast_path import FastPath
    result = run_demo(out, images=images, n0=n0, n=n, alpha=alpha, sigma=sigma, m=m,
                      local_sigma=local_sigma, batch=batch, seed=seed, device=device, precision=precision,
                      fast=FastPath.resolve(device, compile), progress=not quiet)
    click.echo(f"\n{result['header']}\n\n{result['table']}\n")
    timing = ", ".join(f"{k} {v:.1f} s" for k, v in result["seconds"].items())
    click.echo(f"time: {timing}; wrote {', '.join(result['files'])}, {out}/certified_accuracy.png, {out}/summary.md")


@main.command()
@model_options
@click.option("--dataset", type=click.Choice(["cifar10", "imagenet", "npz", "idx", "embedded"]))
@click.option("--data", type=click.Path())
@click.option("--sigma", type=float, default=0.5, show_default=True)
@click.option("--local-sigma", type=float, default=0.25, show_default=True)
@click.option("--m", "m", type=int, default=2, show_default=True, help="Locally-noised rows to show.")
@click.option("--images", type=int, default=8, show_default=True, callback=_positive("images"))
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--out", type=click.Path(), default="purified.png", show_default=True)
def purify(dataset, data, sigma, local_sigma, m, images, seed, out, **model_kw):
    """PNG grid: clean / noisy / one-shot denoised / locally smoothed images (the paper's figure)."""
    from diffsmooth.engine.data import load_dataset
    from diffsmooth.engine.demo.run import purify_grid
    from diffsmooth.engine.errors import UserError
    kind = dataset or ("embedded" if not data else None)
    if kind is None:
        raise UserError("--data given without --dataset: say which layout it is")
    ds = load_dataset(kind, data)
    if not model_kw["denoiser"] and model_kw["classifier"]:
        raise UserError("purify needs --denoiser (or no model options for the embedded demo)")
    sources = _sources(model_kw, kind)
    path = purify_grid(out, sources=sources, dataset=ds, images=images, sigma=sigma,
                       local_sigma=local_sigma, m=m, seed=seed)
    click.echo(f"wrote {path} (rows: clean, noisy, denoised, {m} locally-noised)")


@main.command()
@click.argument("out", type=click.Path())
@click.argument("shards", nargs=-1, required=True, type=click.Path())
def merge(out, shards):
    """Merge shard TSVs into OUT: sorted by idx, every index once (conflicting rows are refused)."""
    from diffsmooth.engine.runs.results import merge_results
    count = merge_results(shards, out)
    click.echo(f"merged {count} rows from {len(shards)} files into {out}", err=True)


def _expand_result_files(files):
    """Files as given; a directory stands for the .tsv files inside it."""
    paths = []
    for f in files:
        p = Path(f)
        paths.extend(sorted(p.glob("*.tsv")) if p.is_dir() else [p])
    return paths


@main.command("env")
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of text.")
@click.option("--check-compile", is_flag=True,
              help="Also compile a tiny function with torch.compile (CPU, and CUDA when present).")
@click.option("--compile-timeout", type=float, default=300.0, show_default=True,
              help="Seconds before --check-compile gives up.")
def env(as_json, check_compile, compile_timeout):
    """Versions, hardware and optional runtimes, for bug reports."""
    import json
    from diffsmooth.engine.env_report import collect_env, format_env
    report = collect_env(compile_check=check_compile, compile_timeout=compile_timeout)
    click.echo(json.dumps(report, indent=1) if as_json else format_env(report))


def _register_optional_commands():
    """Commands that live next to their code (training, export, benchmarks)."""
    import importlib
    for module, names in (("diffsmooth.engine.demo.train_commands", ["train_demo"]),
                          ("diffsmooth.export.commands", ["export", "validate", "build_engine"]),
                          ("diffsmooth.bench.commands", ["bench"])):
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
            continue
        for name in names:
            if hasattr(mod, name):
                main.add_command(getattr(mod, name))


_register_optional_commands()

if __name__ == "__main__":
    sys.exit(main())

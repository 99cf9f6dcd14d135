"""Sweep vs one-by-one: the paper's grid (4 sigma' x 5 m x 2 classifiers + DDS) at one sigma,
certified in ONE pass (denoise once per batch) against the same configurations run separately.

    python -m studies.sweep_vs_single [--n 200] [--images 2] [--json]

Measured on the demo models (embedded weights when present, else the same architectures with
random weights), then extrapolated to the full-size CIFAR-10 UNet + ResNet-110 from their
measured per-sample costs on this machine (stated as an extrapolation).
"""

from __future__ import annotations

import json
import time

import click
import torch

from diffsmooth.engine.backends.torch.runner import TorchRunner
from diffsmooth.engine.backends.torch.stages import build_torch_stages, torch_stages
from diffsmooth.engine.base_classifier.configurations import configurations
from diffsmooth.engine.base_classifier.denoise import PRESET_SCHEDULES, DiffusionDenoiser, load_denoiser
from diffsmooth.engine.certify.monte_carlo import MonteCarloPipeline
from diffsmooth.engine.models import shipped as demo_assets
from diffsmooth.engine.models.checkpoints import load_classifier
from diffsmooth.engine.models.resnet import NormalizedClassifier, build_classifier_net, normalization_layer
from diffsmooth.engine.models.unet import PRESETS, UNetModel

LOCAL_SIGMAS = (0.12, 0.25, 0.5, 1.0)
MS = (1, 3, 5, 11, 21)


def _demo_models():
    """(denoiser, {name: classifier}, image shape, 'embedded'|'random')."""
    if demo_assets.DEMO_UNET.exists() and demo_assets.demo_classifier_path(0.25).exists():
        den = load_denoiser(demo_assets.DEMO_UNET, "demo")
        clfs = {f"s{s:.2f}": load_classifier(demo_assets.demo_classifier_path(s), dataset="fashion-mnist")
                for s in (0.25, 0.5)}
        return den, clfs, (1, 32, 32), "embedded"
    torch.manual_seed(0)
    den = DiffusionDenoiser(UNetModel(PRESETS["demo"]).eval(), PRESET_SCHEDULES["demo"])
    clfs = {name: NormalizedClassifier(normalization_layer("normalize", "fashion-mnist"),
                                       build_classifier_net("cifar_resnet20", 10, 1)).eval() for name in ("a", "b")}
    return den, clfs, (1, 32, 32), "random"


def _time(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(n: int = 200, n0: int = 20, images: int = 2, batch: int = 100, sigma: float = 0.5) -> dict:
    torch.set_num_threads(torch.get_num_threads())
    den, clfs, shape, weights = _demo_models()
    backend = TorchRunner("cpu")
    entries = configurations(["dds", "diffsmooth"], sigma, lambda method: {"local_sigma": list(LOCAL_SIGMAS), "m": list(MS)},
                             lambda config: list(clfs))
    entries = [e for e in entries if not (e.config.name == "dds" and e.classifier != list(clfs)[0])]   # one DDS row
    purify = backend.stage(den.purifier(sigma), "denoiser")
    sweep = MonteCarloPipeline(torch_stages(entries, clfs, den, backend, shape, 10), sigma)
    x = torch.rand(shape)
    sweep.count(x, 0, 0, batch, batch)                      # warm-up
    t_sweep = sum(_time(lambda: (sweep.count(x, i, 0, n0, batch), sweep.count(x, i, n0, n, batch)))
                  for i in range(images)) / images
    t_single = 0.0
    for e in entries:
        pipe = MonteCarloPipeline(build_torch_stages(e.config, clfs[e.classifier], den, backend, shape, 10), sigma)
        t_single += sum(_time(lambda: (pipe.count(x, i, 0, n0, batch), pipe.count(x, i, n0, n, batch)))
                        for i in range(images)) / images
    # per-sample costs of the demo models at this batch, for the cost model
    x_b = torch.rand(batch, *shape)
    unet_s = _time(lambda: purify(x_b)) / batch
    clf_stage = backend.stage(list(clfs.values())[0], "clf")
    clf_s = _time(lambda: clf_stage(x_b)) / batch
    return {"weights": weights, "configurations": len(entries), "n0": n0, "n": n, "images": images, "batch": batch,
            "seconds_per_image_sweep": t_sweep, "seconds_per_image_one_by_one": t_single,
            "speedup": t_single / t_sweep, "demo_unet_s_per_sample": unet_s, "demo_clf_s_per_image": clf_s,
            "entries": [e.name for e in entries], "configurations_used": entries}


def cost_model(entries, unet_s: float, clf_s: float) -> tuple:
    """(one-by-one, sweep) seconds per Monte Carlo sample from per-sample model costs."""
    local = lambda e: e.config.name == "diffsmooth"                                     # noqa: E731
    single = sum(unet_s + (e.config.option("m") if local(e) else 1) * clf_s for e in entries)
    groups = {(e.classifier, e.config.option("local_sigma")) for e in entries if local(e)}
    sweep = unet_s + len(groups) * max(MS) * clf_s + sum(clf_s for e in entries if e.config.name == "dds")
    return single, sweep


@click.command()
@click.option("--n", "n", default=200, show_default=True)
@click.option("--n0", default=20, show_default=True)
@click.option("--images", default=2, show_default=True)
@click.option("--batch", default=100, show_default=True)
@click.option("--cifar-unet-img-s", default=None, type=float,
              help="Measured full-size CIFAR-10 UNet samples/s on this machine (default: measure 8 samples).")
@click.option("--cifar-clf-img-s", default=None, type=float, help="Measured ResNet-110 images/s (default: measure).")
@click.option("--json", "as_json", is_flag=True)
def main(n, n0, images, batch, cifar_unet_img_s, cifar_clf_img_s, as_json):
    """Print sweep vs one-by-one time per image (measured on demo models, extrapolated to CIFAR-10)."""
    r = measure(n=n, n0=n0, images=images, batch=batch)
    entries = r.pop("configurations_used")
    if cifar_unet_img_s is None or cifar_clf_img_s is None:
        torch.manual_seed(0)
        unet, clf = UNetModel(PRESETS["cifar10"]).eval(), build_classifier_net("cifar_resnet110", 10, 3).eval()
        x = torch.rand(8, 3, 32, 32)
        with torch.inference_mode():
            unet(x, torch.full((8,), 496.0))
            clf(x)
            cifar_unet_img_s = cifar_unet_img_s or 8 / _time(lambda: unet(x, torch.full((8,), 496.0)))
            x32 = torch.rand(32, 3, 32, 32)
            cifar_clf_img_s = cifar_clf_img_s or 32 / _time(lambda: clf(x32))
    single, sweep = cost_model(entries, 1 / cifar_unet_img_s, 1 / cifar_clf_img_s)
    samples = 100 + 100_000
    r["cifar10_extrapolated"] = {"unet_samples_per_s": cifar_unet_img_s, "resnet110_images_per_s": cifar_clf_img_s,
                                 "hours_per_image_one_by_one_n1e5": single * samples / 3600,
                                 "hours_per_image_sweep_n1e5": sweep * samples / 3600, "speedup": single / sweep}
    if as_json:
        click.echo(json.dumps(r, indent=1))
        return
    c = r["cifar10_extrapolated"]
    click.echo(f"sweep of {r['configurations']} configurations (4 sigma' x 5 m x 2 classifiers + DDS), sigma=0.5\n")
    click.echo("| models | how | one by one (s/image) | one pass (s/image) | speed-up |\n|---|---|---|---|---|")
    click.echo(f"| demo ({r['weights']} weights) | measured, n0={n0}, n={n}, batch={batch} | "
               f"{r['seconds_per_image_one_by_one']:.1f} | {r['seconds_per_image_sweep']:.1f} | {r['speedup']:.1f}x |")
    click.echo(f"| full-size CIFAR-10 UNet + ResNet-110 | extrapolated from per-sample costs "
               f"({c['unet_samples_per_s']:.1f} UNet samples/s, {c['resnet110_images_per_s']:.0f} ResNet img/s), "
               f"n0+n=100,100 | {c['hours_per_image_one_by_one_n1e5']:.0f} h | {c['hours_per_image_sweep_n1e5']:.1f} h | "
               f"{c['speedup']:.1f}x |")


if __name__ == "__main__":
    main()

"""Exported graphs vs torch on the same inputs: output errors and argmax-vote agreement of the
denoiser -> classifier chain over >= 1000 noisy real images; results go into the manifests."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from diffsmooth.engine.backends.onnxruntime.runner import OrtStage
from diffsmooth.engine.backends.torch.runner import TorchRunner, TorchStage
from diffsmooth.engine.backends.torch.stages import score_module
from diffsmooth.engine.base_classifier.denoise import DiffusionDenoiser, load_denoiser
from diffsmooth.engine.base_classifier.methods import MethodConfig, method_named, method_names
from diffsmooth.engine.base_classifier.schedule import DiffusionSchedule
from diffsmooth.engine.certify.noise import STREAM_LOCAL, STREAM_PURIFY, STREAM_SMOOTHING, NoiseKeys, RowNoise, gaussian
from diffsmooth.engine.data import load_dataset
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.hashing import sha256_file
from diffsmooth.engine.models.checkpoints import load_classifier, load_unet
from diffsmooth.engine.models.diffusers_folder import denoiser_identity
from diffsmooth.engine.stages.manifests import matches, scan_manifests, verify_hashes

from .manifest import update_manifest

VOTE_THRESHOLDS = {"fp32": 0.9999, "fp16": 0.999}
# Max abs error allowed on outputs, relative to max(1, max |torch output|).
ERROR_TOLERANCES = {"fp32": 1e-3, "fp16": 5e-2}
DEFAULT_SAMPLES = 1000
DEFAULT_IMAGES = 10

Stage = Callable[..., torch.Tensor]


class ValidationFailed(UserError):
    """An exported graph disagrees with torch beyond the thresholds (details in its manifest)."""


# --------------------------------------------------------------------------------------------
# Inputs


def adapt_images(images: torch.Tensor, image_shape) -> torch.Tensor:
    """Real images brought to `image_shape`: channels averaged/replicated, bilinear resize, in [0,1]."""
    c, h, w = (int(s) for s in image_shape)
    x = images.float()
    if x.shape[1] != c:
        x = x.mean(dim=1, keepdim=True)
        x = x.expand(-1, c, -1, -1)
    if tuple(x.shape[2:]) != (h, w):
        x = F.interpolate(x, size=(h, w), mode="bilinear", align_corners=False, antialias=True)
    return x.clamp(0, 1).contiguous()


def validation_images(image_shape, count: int = DEFAULT_IMAGES, dataset: Optional[str] = None,
                      data: Optional[str] = None, split: str = "test") -> Tuple[torch.Tensor, List[int], str]:
    """(images, indices, description): `count` images spread over a dataset (default: the embedded
    subset), adapted to `image_shape`."""
    kind = dataset or "embedded"
    ds = load_dataset(kind, data if kind != "embedded" else None, split=split)
    total = len(ds)
    count = max(1, min(count, total))
    indices = sorted({int(i * total / count) for i in range(count)})
    x = torch.stack([ds[i][0] for i in indices])
    desc = f"{getattr(ds, 'name', kind)} ({len(indices)} images)"
    if tuple(x.shape[1:]) != tuple(int(s) for s in image_shape):
        desc += f", adapted from {'x'.join(map(str, x.shape[1:]))} to {'x'.join(map(str, image_shape))}"
        x = adapt_images(x, image_shape)
    return x, indices, desc


# --------------------------------------------------------------------------------------------
# Comparisons


@dataclass
class _ErrorStats:
    max_abs: float = 0.0
    sum_abs: float = 0.0
    count: int = 0
    scale: float = 0.0
    finite: bool = True

    def add(self, ref: torch.Tensor, got: torch.Tensor) -> None:
        ref, got = ref.detach().float().cpu(), got.detach().float().cpu()
        if not torch.isfinite(got).all():
            self.finite = False
            return
        d = (got - ref).abs()
        self.max_abs = max(self.max_abs, float(d.max()))
        self.sum_abs += float(d.sum())
        self.count += d.numel()
        self.scale = max(self.scale, float(ref.abs().max()))

    def result(self, precision: str) -> dict:
        tol = ERROR_TOLERANCES[precision] * max(1.0, self.scale)
        ok = self.finite and self.max_abs <= tol
        return {"max_abs_err": self.max_abs, "mean_abs_err": self.sum_abs / max(1, self.count),
                "tolerance": tol, "finite": self.finite, "passed": bool(ok)}


def compare_stages(*, precision: str, sigma: float, image_shape, reference: Dict[str, Optional[Stage]],
                   candidate: Dict[str, Optional[Stage]], local_noise_shape: Optional[Tuple[int, ...]] = None,
                   samples: int = DEFAULT_SAMPLES, seed: int = 0, batch: int = 100,
                   images: Optional[torch.Tensor] = None, image_indices: Optional[Sequence[int]] = None,
                   images_desc: str = "given images", purify_noise: bool = False) -> dict:
    """Torch (`reference`) vs ONNX (`candidate`) {purify, score} stages on the pipeline's noisy samples:
    per-stage errors on identical inputs and agreement of the chained argmax votes. `purify_noise`: the purify
    stages take the rows' own noises too (RowNoise, as in a run), the same for both."""
    if precision not in VOTE_THRESHOLDS:
        raise UserError(f"precision must be one of {', '.join(VOTE_THRESHOLDS)}, got {precision!r}")
    if images is None:
        images, image_indices, images_desc = validation_images(image_shape)
    if image_indices is None:
        image_indices = list(range(len(images)))
    per_image = int(math.ceil(samples / len(images)))
    den_err, cls_err = _ErrorStats(), _ErrorStats()
    agree = total = 0
    has_purify = reference.get("purify") is not None
    has_score = reference.get("score") is not None
    for x, idx in zip(images, image_indices):
        done = 0
        while done < per_image:
            size = min(batch, per_image - done)
            eps = gaussian(seed, STREAM_SMOOTHING, int(idx), done, size, tuple(x.shape))
            x_rs = x.unsqueeze(0) + sigma * eps
            h_ref = h_got = x_rs
            if has_purify:
                own = []
                if purify_noise:
                    own = [RowNoise(NoiseKeys(seed, STREAM_PURIFY, "cpu"), torch.full((size,), int(idx)),
                                    torch.arange(done, done + size))]
                h_ref = reference["purify"](x_rs, *own)
                h_got = candidate["purify"](x_rs, *own)
                den_err.add(h_ref, h_got)
            if has_score:
                extra = []
                if local_noise_shape is not None:
                    extra = [gaussian(seed, STREAM_LOCAL, int(idx), done, size, local_noise_shape)]
                s_ref = reference["score"](h_ref, *extra)
                s_same = candidate["score"](h_ref, *extra)      # same inputs: the graph's own error
                s_chain = candidate["score"](h_got, *extra) if has_purify else s_same
                cls_err.add(s_ref, s_same)
                if torch.isfinite(s_chain).all():
                    agree += int((s_ref.argmax(1) == s_chain.argmax(1)).sum())
                total += size
            done += size
    result = {"precision": precision, "samples": per_image * len(images), "seed": seed,
              "images": images_desc, "sigma": sigma}
    failures = []
    for role, present, errors in (("denoiser", has_purify, den_err), ("classifier", has_score, cls_err)):
        if not present:
            continue
        r = result[role] = errors.result(precision)
        if not r["passed"]:
            failures.append(f"{role} max abs err {r['max_abs_err']:.3g} > {r['tolerance']:.3g}"
                            if r["finite"] else f"{role} produced NaN/Inf")
    if has_score:
        rate = agree / max(1, total)
        threshold = VOTE_THRESHOLDS[precision]
        result["votes"] = {"agreement": rate, "threshold": threshold, "samples": total,
                           "disagreements": total - agree, "passed": bool(rate >= threshold)}
        if rate < threshold:
            failures.append(f"vote agreement {100 * rate:.2f}% < {100 * threshold:.2f}% "
                            f"({total - agree} of {total} samples differ)")
    else:
        result["votes"] = None
    result["passed"] = not failures
    result["failures"] = failures
    result["summary"] = "; ".join(failures) if failures else _ok_summary(result)
    return result


def _ok_summary(r: dict) -> str:
    parts = []
    if r.get("votes"):
        parts.append(f"votes agree {100 * r['votes']['agreement']:.2f}% over {r['votes']['samples']} samples")
    for k in ("denoiser", "classifier", "unet"):
        if r.get(k):
            parts.append(f"{k} max abs err {r[k]['max_abs_err']:.2g}")
    return ", ".join(parts)


def compare_unet(reference: torch.nn.Module, candidate: Stage, precision: str, image_shape,
                 images: Optional[torch.Tensor] = None, timesteps: Sequence[float] = (10.0, 250.0, 500.0, 900.0),
                 seed: int = 0) -> dict:
    """The plain UNet graph vs torch on noised images at several timesteps (errors only)."""
    if images is None:
        images, _, _ = validation_images(image_shape, 4)
    err = _ErrorStats()
    g = torch.Generator().manual_seed(seed)
    for t in timesteps:
        x_t = (2 * images - 1) * 0.8 + 0.6 * torch.randn(images.shape, generator=g)
        tt = torch.full((len(images),), float(t))
        with torch.inference_mode():
            ref = reference(x_t, tt)
        err.add(ref, candidate(x_t, tt))
    r = err.result(precision)
    result = {"precision": precision, "unet": r, "votes": None, "timesteps": list(timesteps),
              "passed": r["passed"], "failures": [] if r["passed"] else
              [f"unet max abs err {r['max_abs_err']:.3g} > {r['tolerance']:.3g}" if r["finite"]
               else "unet produced NaN/Inf"]}
    result["summary"] = "; ".join(result["failures"]) or _ok_summary(result)
    return result


# --------------------------------------------------------------------------------------------
# Validating written graphs


def _torch_stage(module, name):
    return TorchStage(module, name, torch.device("cpu"), "fp32")


def _ort_stage(path, name, precision, threads=None):
    return OrtStage(path, name, "cpu", precision, threads=threads)


def validate_graphs(graphs: Sequence, config: MethodConfig, image_shape, *, denoiser=None, classifier=None,
                    samples: int = DEFAULT_SAMPLES, seed: int = 0, dataset: Optional[str] = None,
                    data: Optional[str] = None, threads: Optional[int] = None,
                    raise_on_failure: bool = True) -> Dict[str, dict]:
    """Validate graphs (.path/.role/.precision) against their torch models, write results into the
    manifests, raise ValidationFailed on any failure."""
    images, indices, desc = validation_images(image_shape, DEFAULT_IMAGES, dataset, data)
    by_precision: Dict[str, Dict[str, object]] = {}
    for g in graphs:
        by_precision.setdefault(g.precision, {})[g.role] = g
    results: Dict[str, dict] = {}
    for precision, roles in by_precision.items():
        den, cls, unet = roles.get("denoiser"), roles.get("classifier"), roles.get("unet")
        if den is not None or cls is not None:
            reference: Dict[str, Optional[Stage]] = {"purify": None, "score": None}
            candidate: Dict[str, Optional[Stage]] = {"purify": None, "score": None}
            local_shape = None
            if den is not None:
                if denoiser is None:
                    raise UserError(f"validating {Path(den.path).name} needs the torch denoiser")
                reference["purify"] = config.purifier.stage(config.sigma, denoiser, TorchRunner())
                candidate["purify"] = config.purifier.exported_stage(
                    config.sigma, _ort_stage(den.path, "denoiser", precision, threads), den.manifest)
            if cls is not None:
                if classifier is None:
                    raise UserError(f"validating {Path(cls.path).name} needs the torch classifier")
                head = score_module(config, classifier, tuple(image_shape))
                reference["score"] = _torch_stage(head, "classifier")
                candidate["score"] = _ort_stage(cls.path, "classifier", precision, threads)
                if getattr(head, "takes_noise", False):
                    local_shape = config.head.fresh_noise_shape(tuple(image_shape))
            res = compare_stages(precision=precision, sigma=config.sigma, image_shape=image_shape,
                                 reference=reference, candidate=candidate, local_noise_shape=local_shape,
                                 samples=samples, seed=seed, images=images, image_indices=indices,
                                 images_desc=desc, purify_noise=den is not None and config.method.purifier.draws_noise)
            for g in (den, cls):
                if g is not None:
                    update_manifest(g.path, validation=res)
                    results[str(g.path)] = res
        if unet is not None:
            if denoiser is None:
                raise UserError(f"validating {Path(unet.path).name} needs the torch UNet")
            res = compare_unet(denoiser.unet, _ort_stage(unet.path, "unet", precision, threads), precision,
                               image_shape, images[:4])
            update_manifest(unet.path, validation=res)
            results[str(unet.path)] = res
    failed = {p: r for p, r in results.items() if not r["passed"]}
    if failed and raise_on_failure:
        lines = "; ".join(f"{Path(p).name}: {r['summary']}" for p, r in failed.items())
        raise ValidationFailed(f"ONNX validation failed ({lines}); results are in the manifests")
    return results


# --------------------------------------------------------------------------------------------
# Rebuilding torch models from manifests (for `diffsmooth validate --onnx-dir`)


@dataclass
class _Graph:
    path: Path
    role: str
    precision: str
    manifest: dict


def _check_source(manifest: dict, what: str) -> str:
    src = manifest.get("source") or {}
    path = src.get("path")
    if not path:
        raise UserError(f"{manifest.get('onnx_file')} was exported from in-memory {what} weights (no checkpoint); "
                        "validate it where it was exported (validate_graphs)")
    if not Path(path).exists():
        raise UserError(f"{manifest.get('onnx_file')}: its source checkpoint {path} is gone")
    if src.get("sha256") and sha256_file(path) != src["sha256"]:
        raise UserError(f"{manifest.get('onnx_file')}: source checkpoint {path} changed since export (sha256 differs)")
    return path


def load_denoiser_for(manifest: dict):
    """The torch denoiser a denoiser/unet manifest was exported from (checkpoint hash checked; a diffusers
    folder's weights and configs hashes checked)."""
    path = _check_source(manifest, "UNet")
    src = manifest["source"]
    if src.get("denoiser_format"):
        now = denoiser_identity(path, src.get("scheduler"))
        if any(now.get(k) != src.get(k) for k in now):
            raise UserError(f"{manifest.get('onnx_file')}: the diffusers folder {path} changed since export "
                            f"(its weights' or configs' sha256 differs)")
        return load_denoiser(path, None, scheduler=src.get("scheduler"))
    cfg = dict(manifest.get("unet_config") or {})
    if not cfg:
        raise UserError(f"{manifest.get('onnx_file')}: the manifest records no UNet config")
    unet = load_unet(path, None, **cfg)
    sched = manifest.get("schedule") or {}
    return DiffusionDenoiser(unet, DiffusionSchedule.from_record(sched))


def load_classifier_for(manifest: dict):
    """The torch classifier a classifier manifest was exported from (checkpoint hash checked)."""
    path = _check_source(manifest, "classifier")
    src = manifest["source"]
    return load_classifier(path, arch=src.get("arch"), dataset=src.get("stats") or "cifar10",
                           normalization=src.get("normalization"))


def config_from_manifest(manifest: dict) -> MethodConfig:
    """The method config a classifier graph was exported for (its method reads its own fields)."""
    return method_named(manifest.get("method")).config_from_manifest(manifest)


def purifier_config(manifest: dict) -> MethodConfig:
    """The method config a denoiser graph is validated at alone: its method's (a purifier of its own records
    it), else that of the first registered method whose purifier picks this graph by the fields it records (the
    one-shot purifier at its sigma)."""
    if manifest.get("role") == "denoiser" and manifest.get("method"):
        return config_from_manifest(manifest)
    sigma = float(manifest.get("sigma") or 0.5)
    for name in method_names():
        config = MethodConfig(name, sigma)
        wanted = config.purifier.lookup(config.sigma, config.name)
        if wanted and all(manifest.get(k) == v for k, v in wanted.items()):
            return config
    raise UserError(f"{manifest.get('onnx_file', 'the denoiser graph')}: no registered method's purifier reads it")


def paired_graphs(graphs: Sequence, manifest: Callable[[object], dict], alone: Sequence[str] = ("denoiser",)) -> list:
    """(config, image shape, denoiser graph or None, classifier graph or None) to validate together: each classifier
    graph (`.role`, `.precision`; `manifest(graph)` its manifest) behind the denoiser graph of its precision, shape
    and method, when its method denoises; then each graph of a role in `alone` that no classifier took."""
    groups, used = [], set()
    for cls in (g for g in graphs if g.role == "classifier"):
        config, shape = config_from_manifest(manifest(cls)), manifest(cls)["image_shape"]
        wanted = config.purifier.lookup(config.sigma, config.name) if config.purifier.denoises else None
        den = next((g for g in graphs if wanted is not None and g.role == "denoiser" and g.precision == cls.precision
                    and manifest(g)["image_shape"] == shape and matches(manifest(g), wanted)), None)
        used.add(id(den))
        groups.append((config, shape, den, cls))
    return groups + [(purifier_config(manifest(g)), manifest(g)["image_shape"], g, None)
                     for g in graphs if g.role in alone and id(g) not in used]


def validate_dir(onnx_dir, *, samples: int = DEFAULT_SAMPLES, seed: int = 0, dataset: Optional[str] = None,
                 data: Optional[str] = None, threads: Optional[int] = None) -> Dict[str, dict]:
    """Validate every graph in `onnx_dir` against the checkpoints named in its manifest."""
    graphs = [_Graph(p, m.get("role"), m.get("precision"), m) for p, m in scan_manifests(onnx_dir)]
    for g in graphs:
        verify_hashes(g.path, g.manifest)
    results: Dict[str, dict] = {}
    failures = []
    for config, shape, den, cls in paired_graphs(graphs, lambda g: g.manifest, ("denoiser", "unet")):
        try:
            results.update(validate_graphs(
                [g for g in (cls, den) if g is not None], config, shape,
                denoiser=load_denoiser_for(den.manifest) if den is not None else None,
                classifier=load_classifier_for(cls.manifest) if cls is not None else None,
                samples=samples, seed=seed, dataset=dataset, data=data, threads=threads))
        except ValidationFailed as exc:
            failures.append(str(exc))
    if failures:
        raise ValidationFailed(" | ".join(failures))
    return results

"""ONNX Runtime backend: exported graphs (diffsmooth.export) as Stages, picked and hash-checked via
their manifests; onnxruntime is imported lazily so `import diffsmooth` works without it."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

from diffsmooth.engine.errors import UserError
from diffsmooth.engine.base_classifier.methods import MethodConfig, probe
from diffsmooth.engine.backends.base import BaseClassifierStages

ORT_PRECISIONS = ("fp32", "fp16")
GPU_PROVIDERS = {"cuda": "CUDAExecutionProvider", "tensorrt": "TensorrtExecutionProvider"}
MANIFEST_FORMAT = "diffsmooth-onnx-manifest"


def _ort():
    try:
        import onnxruntime
    except ImportError:
        raise UserError("--backend onnxruntime needs the onnxruntime package "
                        "(pip install 'diffsmooth-engine[onnx]', or onnxruntime-gpu for CUDA)") from None
    return onnxruntime


def physical_cores() -> int:
    """Physical cores usable by this process (hyper-threads do not help these dense kernels)."""
    try:
        usable = set(os.sched_getaffinity(0))
    except AttributeError:
        usable = set(range(os.cpu_count() or 1))
    cores = set()
    try:
        cpu, phys = None, "0"
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, val = line.partition(":")
                key, val = key.strip(), val.strip()
                if key == "processor":
                    cpu = int(val)
                elif key == "physical id":
                    phys = val
                elif key == "core id" and cpu in usable:
                    cores.add((phys, val))
    except (OSError, ValueError):
        pass
    return max(1, min(len(cores) or len(usable), len(usable)))


def session_options(threads: Optional[int] = None):
    """Threads = physical cores (or $DIFFSMOOTH_ORT_THREADS), sequential, ORT_ENABLE_ALL, no spinning
    (spinning workers starve the torch work between calls: 61 vs 85 samples/s; $DIFFSMOOTH_ORT_SPIN=1)."""
    ort = _ort()
    so = ort.SessionOptions()
    if not threads and os.environ.get("DIFFSMOOTH_ORT_THREADS", "").strip():
        try:
            threads = int(os.environ["DIFFSMOOTH_ORT_THREADS"])
        except ValueError:
            raise UserError(f"DIFFSMOOTH_ORT_THREADS must be an integer, got {os.environ['DIFFSMOOTH_ORT_THREADS']!r}") from None
    so.intra_op_num_threads = int(threads or physical_cores())
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    spin = os.environ.get("DIFFSMOOTH_ORT_SPIN", "0").strip() == "1"
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    return so


def providers_for(device: torch.device, provider: Optional[str] = None,
                  cache_dir: Optional[str] = None) -> List:
    """The execution-provider list for `device`; UserError when the needed one is not installed."""
    ort = _ort()
    available = ort.get_available_providers()
    if device.type == "cpu":
        if provider not in (None, "cpu"):
            raise UserError(f"execution provider {provider!r} needs --device cuda")
        return ["CPUExecutionProvider"]
    if device.type != "cuda":
        raise UserError(f"--backend onnxruntime runs on cpu or cuda, not {device.type}")
    provider = provider or "cuda"
    if provider not in GPU_PROVIDERS:
        raise UserError(f"execution provider must be one of {', '.join(GPU_PROVIDERS)}, got {provider!r}")
    name = GPU_PROVIDERS[provider]
    if name not in available:
        raise UserError(f"{name} is not available in this onnxruntime (have: {', '.join(available)}); "
                        "install onnxruntime-gpu (and TensorRT for the tensorrt provider)")
    index = device.index if device.index is not None else 0
    cuda = ("CUDAExecutionProvider", {"device_id": index, "cudnn_conv_algo_search": "EXHAUSTIVE",
                                      "do_copy_in_default_stream": True})
    if provider == "cuda":
        return [cuda, "CPUExecutionProvider"]
    trt = ("TensorrtExecutionProvider", {
        "device_id": index,
        "trt_engine_cache_enable": True,
        "trt_engine_cache_path": cache_dir or ".",
        "trt_timing_cache_enable": True,
        # Precision comes from the graph itself (fp16 graphs are explicitly typed); no fp16 flag.
    })
    return [trt, cuda, "CPUExecutionProvider"]


class OrtStage:
    """One ONNX graph as a Stage (fp32 torch tensors in/out on `device`). CPU goes through numpy
    without copies; CUDA binds device buffers with IO binding (never run: no GPU here)."""

    def __init__(self, path, name: str, device="cpu", precision: str = "fp32",
                 provider: Optional[str] = None, threads: Optional[int] = None):
        ort = _ort()
        self.path = Path(path)
        self.name = name
        self.device = torch.device(device)
        self.precision = precision
        cache = self.path.parent / "trt_cache"
        requested = providers_for(self.device, provider, cache_dir=str(cache))
        if provider == "tensorrt":
            cache.mkdir(exist_ok=True)
        try:
            self.session = ort.InferenceSession(str(self.path), session_options(threads), providers=requested)
        except Exception as exc:  # onnxruntime raises its own exception types
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise UserError(f"onnxruntime cannot load {self.path.name}: {first}") from None
        wanted = requested[0] if isinstance(requested[0], str) else requested[0][0]
        got = self.session.get_providers()
        if not got or got[0] != wanted:
            raise UserError(f"onnxruntime did not start {wanted} for {self.path.name} "
                            f"(session providers: {', '.join(got)}); refusing to fall back silently")
        self.providers = got
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_name = self.session.get_outputs()[0].name
        self._out_shape = [d if isinstance(d, int) else None for d in self.session.get_outputs()[0].shape]

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        if len(inputs) != len(self.input_names):
            raise UserError(f"{self.name} takes {len(self.input_names)} input(s) "
                            f"({', '.join(self.input_names)}), got {len(inputs)}")
        if self.device.type == "cuda":
            return self._run_cuda(inputs)
        feeds = {n: t.detach().to("cpu", torch.float32).contiguous().numpy()
                 for n, t in zip(self.input_names, inputs)}
        out = self.session.run([self.output_name], feeds)[0]
        return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32))

    def _output_shape(self, batch: int) -> Tuple[int, ...]:
        shape = list(self._out_shape)
        if shape and shape[0] is None:
            shape[0] = batch
        if any(d is None for d in shape):
            raise UserError(f"{self.path.name}: output shape {self._out_shape} is not static apart from the batch")
        return tuple(shape)

    def _run_cuda(self, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
        """IO binding of torch CUDA buffers (untested here: needs onnxruntime-gpu and a GPU)."""
        index = self.device.index if self.device.index is not None else 0
        tensors = [t.detach().to(self.device, torch.float32).contiguous() for t in inputs]
        out = torch.empty(self._output_shape(tensors[0].shape[0]), dtype=torch.float32, device=self.device)
        binding = self.session.io_binding()
        for name, t in zip(self.input_names, tensors):
            binding.bind_input(name, "cuda", index, np.float32, tuple(t.shape), t.data_ptr())
        binding.bind_output(self.output_name, "cuda", index, np.float32, tuple(out.shape), out.data_ptr())
        torch.cuda.current_stream(self.device).synchronize()   # inputs written by torch are ready
        self.session.run_with_iobinding(binding)              # ORT synchronises its stream at the end
        return out


# --------------------------------------------------------------------------------------------
# Picking graphs by manifest


def _close(a, b) -> bool:
    return a is not None and b is not None and abs(float(a) - float(b)) <= 1e-9 * max(1.0, abs(float(b)))


def sha256_file(path, chunk: int = 1 << 22) -> str:
    """Hex sha256 of a file's bytes, read in chunks (graphs and checkpoints can be GiBs)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def check_external_data_paths(onnx_path: Path, manifest_names: Sequence[str] = ()) -> None:
    """UserError if the graph or its manifest points external data outside the graph's folder:
    a crafted model could otherwise make ONNX Runtime read any file on the machine."""
    import onnx
    folder = onnx_path.parent.resolve()
    try:
        model = onnx.load(str(onnx_path), load_external_data=False)
    except Exception as exc:                          # protobuf DecodeError and friends
        raise UserError(f"{onnx_path.name} is not a readable ONNX file ({type(exc).__name__}); re-export it") from None
    names = list(manifest_names)
    for tensor in model.graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            names += [entry.value for entry in tensor.external_data if entry.key == "location"]
    for name in names:
        target = (folder / name).resolve()
        if Path(name).is_absolute() or folder not in target.parents:
            raise UserError(f"{onnx_path.name}: external data {name!r} lies outside {folder}; refusing to load it")


def verify_hashes(onnx_path, manifest: dict) -> None:
    """UserError unless the graph (and its external data) still has the sha256 its manifest records."""
    p = Path(onnx_path)
    if not p.exists():
        raise UserError(f"{p.name} is named by its manifest but missing from {p.parent}")
    want = manifest.get("onnx_sha256")
    if not want:
        raise UserError(f"the manifest of {p.name} records no onnx_sha256; re-export it")
    have = sha256_file(p)
    if have != want:
        raise UserError(f"{p.name}: sha256 {have[:12]}... does not match its manifest ({want[:12]}...); "
                        "the file changed after export: re-export it")
    check_external_data_paths(p, list(manifest.get("external_data") or {}))
    for name, digest in (manifest.get("external_data") or {}).items():
        q = p.parent / name
        if not q.exists():
            raise UserError(f"{p.name}: its external data file {name} is missing from {p.parent}")
        if sha256_file(q) != digest:
            raise UserError(f"{p.name}: external data {name} does not match its manifest's sha256; re-export it")


def scan_manifests(onnx_dir, require: bool = True) -> List[Tuple[Path, dict]]:
    """(graph path, manifest) for every export manifest in `onnx_dir`, sorted by file name."""
    d = Path(onnx_dir)
    if not d.is_dir():
        raise UserError(f"--onnx-dir {d}: no such directory (make it with `diffsmooth export --out {d}`)")
    found = []
    for p in sorted(d.glob("*.json")):
        try:
            data = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(data, dict) and data.get("format") == MANIFEST_FORMAT:
            found.append((d / data.get("onnx_file", p.with_suffix(".onnx").name), data))
    if require and not found:
        raise UserError(f"--onnx-dir {d} holds no exported graphs (no manifests); run `diffsmooth export --out {d}`")
    return found


def _mismatches(manifest: dict, want: dict) -> List[str]:
    """Names of the fields in `want` that `manifest` does not match."""
    bad = []
    for key, value in want.items():
        have = manifest.get(key)
        if isinstance(value, float):
            if not _close(have, value):
                bad.append(f"{key}={have} (want {value})")
        elif isinstance(value, (list, tuple)):
            if list(have or []) != list(value):
                bad.append(f"{key}={have} (want {list(value)})")
        elif have != value:
            bad.append(f"{key}={have} (want {value})")
    return bad


def _describe_want(role: str, want: dict) -> str:
    parts = [f"{k}={'x'.join(map(str, v)) if isinstance(v, (list, tuple)) else v}" for k, v in want.items()
             if k != "role"]
    return f"{role} graph with " + ", ".join(parts)


def find_graph(found: List[Tuple[Path, dict]], role: str, want: dict, onnx_dir) -> Tuple[Path, dict]:
    """The one graph of `role` whose manifest matches `want`; a UserError naming the closest
    candidates and their mismatching fields otherwise."""
    same_role = [(p, m) for p, m in found if m.get("role") == role]
    matches = [(p, m) for p, m in same_role if not _mismatches(m, want)]
    if not matches:
        if not same_role:
            raise UserError(f"no {role} graph in {onnx_dir} (need a {_describe_want(role, want)}); "
                            f"export it with `diffsmooth export`")
        near = sorted(same_role, key=lambda pm: len(_mismatches(pm[1], want)))[:3]
        why = "; ".join(f"{p.name}: {', '.join(_mismatches(m, want))}" for p, m in near)
        raise UserError(f"no matching {_describe_want(role, want)} in {onnx_dir} ({why})")
    if len(matches) > 1:
        raise UserError(f"several {role} graphs in {onnx_dir} match ({', '.join(p.name for p, _ in matches)}); "
                        "keep one")
    path, manifest = matches[0]
    verify_hashes(path, manifest)
    validation = manifest.get("validation")
    if isinstance(validation, dict) and validation.get("passed") is False:
        raise UserError(f"{path.name} failed validation against torch ({validation.get('summary', 'see its manifest')}); "
                        "re-export it or use --backend torch")
    return path, manifest


def wanted_fields(config: MethodConfig, image_shape, precision: str) -> Tuple[dict, dict]:
    """Manifest fields the denoiser and the classifier graph must have for `config`."""
    shape = [int(s) for s in image_shape]
    denoiser = {"sigma": float(config.sigma), "image_shape": shape, "precision": precision}
    classifier = {"method": config.method, "sigma": float(config.sigma), "image_shape": shape,
                  "precision": precision}
    if config.method == "diffsmooth":
        classifier.update(m=int(config.m), local_sigma=float(config.local_sigma), local_noise=config.local_noise)
        if config.local_noise == "fixed":
            classifier["local_noise_seed"] = int(config.local_noise_seed)
    return denoiser, classifier


def build_onnx_stages(onnx_dir, config: MethodConfig, image_shape, num_classes: Optional[int] = None,
                      device: str = "cpu", precision: str = "fp32", provider: Optional[str] = None,
                      threads: Optional[int] = None) -> BaseClassifierStages:
    """Stages for `config` from the graphs in `onnx_dir` (picked and hash-checked via manifests)."""
    if precision not in ORT_PRECISIONS:
        raise UserError(f"--backend onnxruntime runs the exported fp32 or fp16 graphs, not {precision}")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise UserError(f"unknown device {device!r}: use cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"device {device!r} requested but CUDA is not available on this machine")
    found = scan_manifests(onnx_dir)
    want_denoiser, want_classifier = wanted_fields(config, image_shape, precision)
    purify = None
    if config.uses_denoiser:
        path, _ = find_graph(found, "denoiser", want_denoiser, onnx_dir)
        purify = OrtStage(path, f"denoiser[{path.name}]", dev, precision, provider, threads)
    path, manifest = find_graph(found, "classifier", want_classifier, onnx_dir)
    if num_classes is not None and manifest.get("num_classes") not in (None, num_classes):
        raise UserError(f"{path.name} scores {manifest.get('num_classes')} classes but the data has {num_classes}")
    label = "local-smoothing classifier" if config.method == "diffsmooth" else "classifier"
    score = OrtStage(path, f"{label}[{path.name}]", dev, precision, provider, threads)
    local_shape = (int(config.m), *map(int, image_shape)) if (
        config.method == "diffsmooth" and config.local_noise == "fresh") else None
    if len(score.input_names) != (2 if local_shape else 1):
        raise UserError(f"{path.name} takes inputs {score.input_names}, which does not fit "
                        f"local noise mode {config.local_noise!r}")
    stages = BaseClassifierStages(config.method, purify, score, num_classes or 0, local_shape)
    stages.num_classes = probe(stages, tuple(image_shape))
    if num_classes is not None and stages.num_classes != num_classes:
        raise UserError(f"the classifier graph outputs {stages.num_classes} classes but the data has {num_classes}")
    return stages

"""The Open Inference Protocol's infer request and response (KServe v2, JSON and the binary tensor extension):
bytes in, checked images and parameters out; results in, bytes out. No web framework here."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import numpy as np

from diffsmooth.engine.choices import DEFAULT_ALPHA, DEFAULT_N0
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.runs.analyze import DEFAULT_RADII
from diffsmooth.engine.runs.request import parse_radii
from diffsmooth.engine.serve.limits import BadRequest, Limits

INPUT = "images"
MODES = ("predict", "certify")
OUTPUTS = {"label": "INT64", "radius": "FP32", "samples": "INT64", "index": "INT64"}    # name -> datatype
PREDICT_OUTPUTS = ("label", "samples", "index")
DEFAULT_PREDICT_N = 1000
DEFAULT_CERTIFY_N = 10_000
HEADER = "inference-header-content-length"
PARAMETERS = ("mode", "n", "n0", "alpha", "radii", "sequential", "deadline_ms", "timeout", "binary_data_output")
NUMPY = {"INT64": "<i8", "FP32": "<f4"}


@dataclass(frozen=True)
class Asked:
    """What a request asks of each of its images: PREDICT (n, alpha) or CERTIFY (n0, n, alpha; sequential over
    `radii`, else Cohen's), and by when (seconds)."""

    mode: str = "predict"
    n: int = DEFAULT_PREDICT_N
    n0: int = DEFAULT_N0
    alpha: float = DEFAULT_ALPHA
    radii: Tuple[float, ...] = DEFAULT_RADII
    sequential: bool = True
    deadline: float = 600.0

    @property
    def samples(self) -> int:
        """The most samples one image may draw."""
        return self.n + (self.n0 if self.mode == "certify" else 0)


@dataclass
class InferRequest:
    """A checked infer request: its id, images [B, C, H, W] in [0, 1], what it asks, and which outputs (name ->
    binary or not) it wants back."""

    id: str
    images: np.ndarray
    asked: Asked
    outputs: Dict[str, bool]


def _refuse(text: str):
    raise BadRequest(text)


def _load_json(raw: bytes) -> dict:
    """A JSON object or a BadRequest (NaN and Infinity are not JSON)."""
    try:
        document = json.loads(raw.decode("utf-8"), parse_constant=lambda c: _refuse(f"{c} is not valid JSON"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise BadRequest(f"malformed JSON: {str(exc).splitlines()[0][:120]}") from None
    if not isinstance(document, dict):
        raise BadRequest("the request must be a JSON object")
    return document


def split_body(body: bytes, header_length: Optional[str]) -> Tuple[dict, bytes]:
    """(the JSON header, the binary tensors after it): `Inference-Header-Content-Length` says where the JSON ends."""
    if header_length is None:
        return _load_json(body), b""
    try:
        length = int(header_length)
    except ValueError:
        raise BadRequest(f"Inference-Header-Content-Length must be an integer, got {header_length[:40]!r}") from None
    if not 0 < length <= len(body):
        raise BadRequest(f"Inference-Header-Content-Length is {length}, the body holds {len(body)} bytes")
    return _load_json(body[:length]), body[length:]


def _integer(name: str, value, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise BadRequest(f"parameter `{name}` must be an integer in [{low}, {high}], got {value!r}")
    return value


def _number(name: str, value, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low < value < high:
        raise BadRequest(f"parameter `{name}` must be a number in ({low:g}, {high:g}), got {value!r}")
    return float(value)


def parse_parameters(parameters, limits: Limits) -> Asked:
    """The request's parameters: only PARAMETERS, each of its type and within the limits."""
    if parameters is None:
        parameters = {}
    if not isinstance(parameters, dict):
        raise BadRequest("`parameters` must be an object")
    unknown = sorted(set(parameters) - set(PARAMETERS))
    if unknown:
        raise BadRequest(f"unknown parameter `{unknown[0][:40]}`; known: {', '.join(PARAMETERS)}")
    mode = parameters.get("mode", "predict")
    if mode not in MODES:
        raise BadRequest(f"parameter `mode` must be predict or certify, got {str(mode)[:40]!r}")
    n = _integer("n", parameters.get("n", DEFAULT_PREDICT_N if mode == "predict" else DEFAULT_CERTIFY_N),
                 1, limits.max_samples)
    n0 = _integer("n0", parameters.get("n0", DEFAULT_N0), 1, limits.max_samples)
    if mode == "certify" and n0 + n > limits.max_samples:
        raise BadRequest(f"n0 + n is {n0 + n}, more than the limit of {limits.max_samples} samples per image")
    alpha = _number("alpha", parameters.get("alpha", DEFAULT_ALPHA), 0.0, 1.0)
    radii = parameters.get("radii", ",".join(f"{r:g}" for r in DEFAULT_RADII))
    try:
        radii = parse_radii(radii) if isinstance(radii, str) else _refuse("parameter `radii` must be a string")
    except UserError as exc:
        raise BadRequest(str(exc)) from None
    sequential = parameters.get("sequential", True)
    if not isinstance(sequential, bool):
        raise BadRequest(f"parameter `sequential` must be true or false, got {sequential!r}")
    deadline = limits.deadline
    if "deadline_ms" in parameters:
        deadline = _number("deadline_ms", parameters["deadline_ms"], 0, limits.deadline * 1000 + 1) / 1000
    if "timeout" in parameters:         # Triton's own name for it, in microseconds
        deadline = _integer("timeout", parameters["timeout"], 1, int(limits.deadline * 1e6)) / 1e6
    if not isinstance(parameters.get("binary_data_output", False), bool):
        raise BadRequest("parameter `binary_data_output` must be true or false")
    return Asked(mode, n, n0, alpha, radii, sequential, deadline)


def _tensor_shape(tensor: dict, image_shape: Tuple[int, ...], limits: Limits) -> List[int]:
    """The input's shape, checked before any data is read: [B, C, H, W] with the model's C, H, W."""
    shape = tensor.get("shape")
    if not isinstance(shape, list) or len(shape) != 1 + len(image_shape) or \
            any(isinstance(d, bool) or not isinstance(d, int) for d in shape):
        raise BadRequest(f"input `{INPUT}` must have shape [B, {', '.join(map(str, image_shape))}], got {str(shape)[:60]}")
    if tuple(shape[1:]) != tuple(image_shape):
        raise BadRequest(f"input `{INPUT}` must have shape [B, {', '.join(map(str, image_shape))}], got {shape}")
    if not 1 <= shape[0] <= limits.max_images:
        raise BadRequest(f"a request holds 1 to {limits.max_images} images, got {shape[0]}")
    if tensor.get("datatype") != "FP32":
        raise BadRequest(f"input `{INPUT}` must be FP32, got {str(tensor.get('datatype'))[:20]}")
    return shape


def _json_data(data, count: int) -> np.ndarray:
    """The numbers of a JSON tensor (flat or nested), `count` of them."""
    try:
        array = np.asarray(data)
    except (ValueError, TypeError):
        raise BadRequest(f"input `{INPUT}`'s data must be a list of numbers") from None
    if array.dtype.kind not in "iuf" or array.size != count:
        raise BadRequest(f"input `{INPUT}`'s data must be {count} numbers, got {array.size} of kind {array.dtype.kind}")
    return array.astype(np.float32).reshape(-1)


def parse_infer(body: bytes, header_length: Optional[str], image_shape: Tuple[int, ...], limits: Limits) -> InferRequest:
    """A checked InferRequest from an infer request's body, or a BadRequest saying, in one line, what is wrong."""
    document, binary = split_body(body, header_length)
    unknown = sorted(set(document) - {"id", "inputs", "outputs", "parameters"})
    if unknown:
        raise BadRequest(f"unknown field `{unknown[0][:40]}` in the request")
    asked = parse_parameters(document.get("parameters"), limits)
    inputs = document.get("inputs")
    if not isinstance(inputs, list) or len(inputs) != 1 or not isinstance(inputs[0], dict) \
            or inputs[0].get("name") != INPUT:
        raise BadRequest(f"the request must have one input, named `{INPUT}`")
    tensor = inputs[0]
    shape = _tensor_shape(tensor, image_shape, limits)
    count = math.prod(shape)
    size = (tensor.get("parameters") or {}).get("binary_data_size")
    if size is None:
        if binary:
            raise BadRequest("binary data after the JSON header, but no input has `binary_data_size`")
        values = _json_data(tensor.get("data"), count)
    else:
        if isinstance(size, bool) or not isinstance(size, int) or size != 4 * count or len(binary) != size:
            raise BadRequest(f"input `{INPUT}` needs {4 * count} bytes of binary data; `binary_data_size` is "
                             f"{str(size)[:20]} and {len(binary)} bytes follow the header")
        values = np.frombuffer(binary, dtype="<f4")
    if not np.isfinite(values).all():
        raise BadRequest(f"input `{INPUT}` holds NaN or infinite values")
    if values.min() < 0 or values.max() > 1:
        raise BadRequest(f"input `{INPUT}` must hold values in [0, 1], got [{values.min():g}, {values.max():g}]")
    request_id = document.get("id", "")
    if not isinstance(request_id, str) or len(request_id) > 128:
        raise BadRequest("`id` must be a string of at most 128 characters")
    outputs = _requested_outputs(document.get("outputs"), asked, document.get("parameters") or {})
    return InferRequest(request_id, values.astype(np.float32).reshape(shape), asked, outputs)


def _requested_outputs(outputs, asked: Asked, parameters: dict) -> Dict[str, bool]:
    """name -> binary: the outputs asked for (all of the mode's when none is named)."""
    names = PREDICT_OUTPUTS if asked.mode == "predict" else tuple(OUTPUTS)
    if outputs is None:
        return {name: bool(parameters.get("binary_data_output", False)) for name in names}
    if not isinstance(outputs, list) or not all(isinstance(o, dict) for o in outputs):
        raise BadRequest("`outputs` must be a list of objects")
    wanted = {}
    for output in outputs:
        name = output.get("name")
        if name not in names:
            raise BadRequest(f"unknown output `{str(name)[:40]}` for mode {asked.mode}; known: {', '.join(names)}")
        binary = (output.get("parameters") or {}).get("binary_data", False)
        if not isinstance(binary, bool):
            raise BadRequest("an output's `binary_data` must be true or false")
        wanted[name] = binary
    return wanted


def encode_infer(model: str, request: InferRequest, values: Dict[str, np.ndarray],
                 parameters: dict) -> Tuple[bytes, Dict[str, str]]:
    """The infer response's body and headers: JSON, with the outputs asked as binary after it."""
    outputs, chunks = [], []
    for name, binary in request.outputs.items():
        array = np.ascontiguousarray(values[name], dtype=NUMPY[OUTPUTS[name]])
        tensor = {"name": name, "datatype": OUTPUTS[name], "shape": list(array.shape)}
        if binary:
            chunks.append(array.tobytes())
            tensor["parameters"] = {"binary_data_size": len(chunks[-1])}
        else:
            tensor["data"] = array.tolist()
        outputs.append(tensor)
    document = {"model_name": model, "model_version": "1", "id": request.id, "parameters": parameters,
                "outputs": outputs}
    header = json.dumps(document).encode()
    if not chunks:
        return header, {"content-type": "application/json"}
    return header + b"".join(chunks), {"content-type": "application/octet-stream",
                                       "inference-header-content-length": str(len(header))}

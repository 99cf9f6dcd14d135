"""`diffsmooth serve --demo` as a real process on 127.0.0.1: tritonclient reads its metadata and infers (sync and
async, binary tensors), plain JSON infer, the same answers as the Python API for the server-assigned indices, bad
input interleaved with valid requests, the bounded queue, /metrics, and SIGTERM (the last test)."""

import json
import socket
import threading
import time

import numpy as np
import pytest
import torch

pytest.importorskip("fastapi")
tritonclient_http = pytest.importorskip("tritonclient.http")

from server_process import ServerProcess, outputs  # noqa: E402

from diffsmooth.engine.certify.sequential import SequentialRule  # noqa: E402
from diffsmooth.engine.data import load_dataset  # noqa: E402
from diffsmooth.engine.serve.model_registry import demo_models  # noqa: E402

SEED = 7
MAX_IMAGES, MAX_QUEUE = 8, 9
SHAPE = (1, 32, 32)


@pytest.fixture(scope="module")
def server():
    process = ServerProcess("--demo", "--seed", str(SEED), "--max-images", str(MAX_IMAGES), "--max-queue",
                            str(MAX_QUEUE), "--max-body-mb", "0.5", "--max-samples", "100000")
    yield process
    process.stop()


@pytest.fixture(scope="module")
def images():
    """Six shipped test images of different classes."""
    data = load_dataset("embedded")
    picked, seen = [], set()
    for k in range(len(data)):
        x, label = data[k]
        if label not in seen:
            seen.add(label)
            picked.append(x.numpy())
        if len(picked) == 6:
            break
    return np.stack(picked).astype(np.float32)


@pytest.fixture(scope="module")
def offline():
    """The Python API's smoothed classifiers of the demo models, with the server's seed."""
    torch.set_num_threads(1)
    return {m.name: m for m in demo_models(SEED)}


def test_tritonclient_reads_the_metadata(server):
    client = tritonclient_http.InferenceServerClient(f"127.0.0.1:{server.port}")
    assert client.is_server_live() and client.is_server_ready()
    assert client.get_server_metadata()["name"] == "diffsmooth"
    assert [m["name"] for m in client.get_model_repository_index()] == ["rs", "dds", "diffsmooth"]
    meta = client.get_model_metadata("diffsmooth")
    assert meta["inputs"] == [{"name": "images", "datatype": "FP32", "shape": [-1, *SHAPE]}]
    assert {o["name"] for o in meta["outputs"]} == {"label", "radius", "samples", "index"}
    assert meta["parameters"]["m"] == 5 and meta["parameters"]["sigma"] == 0.5
    assert (meta["parameters"]["device"], meta["parameters"]["precision"]) == ("cpu", "fp32")
    assert meta["parameters"]["checked_against_eager_fp32"] is False      # eager fp32 on a CPU: nothing to check
    assert client.is_model_ready("rs") and not client.is_model_ready("nope")


def _triton_inputs(x):
    tensor = tritonclient_http.InferInput("images", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=True)
    return [tensor]


def test_tritonclient_sync_and_async_infer_with_binary_data(server, images, offline):
    client = tritonclient_http.InferenceServerClient(f"127.0.0.1:{server.port}", concurrency=2)
    wanted = [tritonclient_http.InferRequestedOutput(name, binary_data=True) for name in ("label", "samples", "index")]
    result = client.infer("rs", _triton_inputs(images[:2]), outputs=wanted, parameters={"mode": "predict", "n": 40})
    pending = client.async_infer("diffsmooth", _triton_inputs(images[2:3]), parameters={"mode": "predict", "n": 12})
    labels, indices = result.as_numpy("label"), result.as_numpy("index")
    assert result.as_numpy("samples").tolist() == [40, 40] and labels.dtype == np.int64
    smooth = offline["rs"].smoothed
    assert labels.tolist() == [smooth.predict(torch.from_numpy(images[k]), n=40, image_index=int(i))
                               for k, i in enumerate(indices)]
    other = pending.get_result()
    assert other.as_numpy("samples").tolist() == [12]
    assert other.get_response()["parameters"]["seeded"] is True
    client.close()


def test_same_answers_as_the_python_api(server, images, offline):
    """PREDICT and sequential CERTIFY through the server equal the Python API on the server-assigned indices."""
    status, answer = server.infer("rs", images, mode="certify", n0=20, n=200, radii="0.25,0.5")
    assert status == 200, answer
    got = outputs(answer)
    smooth = offline["rs"].smoothed.smooth_for(SHAPE)
    rule = SequentialRule((0.25, 0.5), 0.5, 0.001, 200)
    expected = [smooth.certify_sequential(torch.from_numpy(x), 20, rule, 200, image_index=i)
                for x, i in zip(images, got["index"])]
    assert got["label"] == [c.prediction for c in expected]
    assert got["samples"] == [c.samples for c in expected]
    assert np.allclose(got["radius"], [c.radius for c in expected], rtol=1e-6)
    assert len({label for label in got["label"] if label >= 0}) >= 3        # the votes spread over several classes
    assert answer["parameters"]["noise"] == "seeded" and answer["parameters"]["seed"] == SEED
    status, answer = server.infer("diffsmooth", images[:3], mode="predict", n=12, alpha=0.2)
    got = outputs(answer)
    api = offline["diffsmooth"].smoothed
    assert got["label"] == [api.predict(torch.from_numpy(x), n=12, alpha=0.2, image_index=i)
                            for x, i in zip(images[:3], got["index"])]
    assert len(set(got["label"])) >= 2


def test_indices_are_the_servers_never_repeated(server, images):
    seen = []
    for _ in range(3):
        status, answer = server.infer("rs", images[:2], n=5)
        assert status == 200
        seen += outputs(answer)["index"]
    assert len(set(seen)) == len(seen)
    status, answer = server.infer("rs", images[:1], n=5, image_index=0)       # a client cannot pick one
    assert status == 400 and "image_index" in answer["error"]


def _document(x, **parameters):
    return {"inputs": [{"name": "images", "shape": list(x.shape), "datatype": "FP32", "data": x.reshape(-1).tolist()}],
            "parameters": parameters}


def _malformed(x):
    """(what, body bytes, headers) of each kind of bad request."""
    one = x[:1]
    good = _document(one, n=5)
    binary = one.astype("<f4").tobytes()
    header = json.dumps({"inputs": [{"name": "images", "shape": [1, *SHAPE], "datatype": "FP32",
                                     "parameters": {"binary_data_size": len(binary)}}]}).encode()

    def changed(**change):
        document = json.loads(json.dumps(good))
        document["inputs"][0].update(change)
        return json.dumps(document).encode()

    length = {"Inference-Header-Content-Length": str(len(header))}
    nan = json.dumps(good).replace(json.dumps(float(one.reshape(-1)[0])), "NaN", 1).encode()
    return [
        ("wrong shape", changed(shape=[1, 1, 32, 31]), {}),
        ("wrong rank", changed(shape=[1, 32, 32]), {}),
        ("wrong dtype", changed(datatype="FP64"), {}),
        ("NaN", nan, {}),
        ("inf in binary", header + np.full(one.size, np.inf, "<f4").tobytes(), length),
        ("above 1", changed(data=(one.reshape(-1) + 1.5).tolist()), {}),
        ("below 0", changed(data=(one.reshape(-1) - 2).tolist()), {}),
        ("strings", changed(data=["a"] * one.size), {}),
        ("too few numbers", changed(data=one.reshape(-1)[:-1].tolist()), {}),
        ("too many images", json.dumps(_document(np.zeros((MAX_IMAGES + 1, *SHAPE), np.float32))).encode(), {}),
        ("too many samples", json.dumps(_document(one, n=10 ** 9)).encode(), {}),
        ("malformed JSON", b'{"inputs": [', {}),
        ("not UTF-8", b"\xff\xfe{}", {}),
        ("not an object", b"[1, 2]", {}),
        ("header longer than the body", header + binary, {"Inference-Header-Content-Length": str(len(header) + len(binary) + 9)}),
        ("header length not a number", header + binary, {"Inference-Header-Content-Length": "12x"}),
        ("binary shorter than declared", header + binary[:-4], length),
        ("unknown parameter", json.dumps(_document(one, n=5, bogus=1)).encode(), {}),
        ("n a bool", json.dumps(_document(one, n=True)).encode(), {}),
        ("mode unknown", json.dumps(_document(one, mode="train")).encode(), {}),
        ("alpha out of range", json.dumps(_document(one, alpha=1.5)).encode(), {}),
        ("compressed", json.dumps(good).encode(), {"Content-Encoding": "gzip"}),
        ("unknown output", json.dumps(dict(good, outputs=[{"name": "logits"}])).encode(), {}),
        ("unknown field", json.dumps(dict(good, extra=1)).encode(), {}),
    ]


def _oversized(port: int):
    """(status, error line) of a body declared larger than the limit (0.5 MiB), of which only a little is sent: the
    server answers before reading it."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"POST /v2/models/rs/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 600000\r\nConnection: close\r\n\r\n{" + b" " * 1000)
        answer = b""
        while b"}" not in answer.partition(b"\r\n\r\n")[2]:
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)["error"]


def test_bad_input_gets_400_and_one_line_and_valid_answers_hold(server, images, offline):
    smooth = offline["rs"].smoothed
    cases = _malformed(images)
    for round_ in range(4):
        for what, body, headers in cases:
            status, _, answer = server.request("POST", "/v2/models/rs/infer", body, headers)
            assert status == 400, (what, status, answer[:200])
            line = json.loads(answer)["error"]
            assert line and "\n" not in line, (what, line)
        status, line = _oversized(server.port)
        assert status == 400 and "limit" in line
        status, _, answer = server.request("POST", "/v2/models/nope/infer", json.dumps(_document(images[:1])).encode())
        assert status == 400 and "unknown model" in json.loads(answer)["error"]
        status, answer = server.infer("rs", images[round_:round_ + 2], n=30)
        assert status == 200, answer
        got = outputs(answer)
        assert got["label"] == [smooth.predict(torch.from_numpy(x), n=30, image_index=i)
                                for x, i in zip(images[round_:round_ + 2], got["index"])]


def test_a_full_queue_answers_503_and_a_deadline_frees_the_samples(server, images):
    slow = {}
    worker = threading.Thread(target=lambda: slow.update(answer=server.infer("rs", images[:4], n=90_000,
                                                                                deadline_ms=1500)))
    worker.start()
    time.sleep(0.5)
    status, headers, body = server.request("POST", "/v2/models/rs/infer", json.dumps(_document(images)).encode())
    assert status == 503 and headers.get("retry-after") == "1", body
    worker.join(60)
    status, answer = slow["answer"]
    assert status == 504 and "deadline" in answer["error"]
    _wait_for_empty_queue(server)
    started = time.perf_counter()
    status, _ = server.infer("rs", images[:1], n=30)
    assert status == 200 and time.perf_counter() - started < 10


def _wait_for_empty_queue(server, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while b'diffsmooth_queue_images{model="rs"} 0.0' not in server.get("/metrics")[2]:
        assert time.monotonic() < deadline, "the cancelled request's images never left the queue"
        time.sleep(0.1)


def _timed(server, images) -> float:
    started = time.perf_counter()
    status, _ = server.infer("rs", images[:1], n=30)
    assert status == 200
    return time.perf_counter() - started


def test_a_client_that_disconnects_frees_its_samples(server, images):
    idle = min(_timed(server, images) for _ in range(2))
    body = json.dumps(_document(images[:4], n=90_000)).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"POST /v2/models/rs/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        time.sleep(0.8)
    _wait_for_empty_queue(server)
    after = _timed(server, images)
    print(f"latency of a 1-image PREDICT n=30: idle {idle:.3f} s, after a client left {after:.3f} s")
    assert after < 3 * idle + 1.0


def test_metrics(server):
    status, _, text = server.get("/metrics")
    assert status == 200
    for name in ("diffsmooth_requests_total", "diffsmooth_request_seconds_bucket", "diffsmooth_queue_images",
                 "diffsmooth_samples_counted", "diffsmooth_batch_requests_bucket", "diffsmooth_batch_fill_bucket"):
        assert name.encode() in text
    assert b'diffsmooth_batch_requests_count{model="rs"} 0.0' not in text        # batches were counted


def test_sigterm_finishes_the_request_in_flight_and_exits_0(server, images):
    """(Runs last: it stops the module's server.)"""
    answer = {}
    worker = threading.Thread(target=lambda: answer.update(result=server.infer("rs", images[:2], n=1500)))
    worker.start()
    time.sleep(0.7)
    assert server.stop() == 0
    worker.join(30)
    status, body = answer["result"]
    assert status == 200 and outputs(body)["samples"] == [1500, 1500]

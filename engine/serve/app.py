"""The HTTP side (FastAPI on uvicorn): the Open Inference Protocol's routes over a Service, the bearer token, the
body limit, one log line per request, /metrics, and SIGTERM (ready turns false, requests in flight finish, exit 0)."""

from __future__ import annotations

import hmac
import signal
import socket
import sys
import time
from typing import Callable, Optional

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from diffsmooth.engine.errors import first_line
from diffsmooth.engine.serve.limits import BadRequest
from diffsmooth.engine.serve.metrics import Metrics
from diffsmooth.engine.serve.service import Service

OPEN_PATHS = ("/v2/health/live", "/v2/health/ready")      # a load balancer's probes need no token
GRACE_SECONDS = 30


def error(status: int, text: str, headers: Optional[dict] = None) -> JSONResponse:
    """The protocol's error body: one line."""
    return JSONResponse({"error": text}, status_code=status, headers=headers)


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused past `limit` bytes before it is all read; compressed bodies are refused."""
    if request.headers.get("content-encoding", "identity") != "identity":
        raise BadRequest("compressed request bodies are not accepted")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BadRequest(f"the body is {declared} bytes, more than the limit of {limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BadRequest(f"the body is more than the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


class Bearer:
    """Every request but the health probes carries `Authorization: Bearer TOKEN`, else 401 (plain ASGI: the request's
    own receive stays untouched, so a waiting request still sees its client leave)."""

    def __init__(self, app, token: str):
        self.app, self.expected = app, f"Bearer {token}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                await error(401, "a bearer token is required (Authorization: Bearer TOKEN)")(scope, receive, send)
                return
        await self.app(scope, receive, send)


def build_app(service: Service, metrics: Metrics, token: Optional[str] = None,
              log: Callable[[str], None] = print) -> FastAPI:
    """The app: health, metadata, repository index, infer and /metrics on `service`."""
    app = FastAPI(title="diffsmooth serve", docs_url=None, redoc_url=None, openapi_url=None)

    if token is not None:
        app.add_middleware(Bearer, token=token)

    @app.get("/v2/health/live")
    def live():
        return Response(status_code=200)

    @app.get("/v2/health/ready")
    def ready():
        return Response(status_code=200 if service.ready else 503)

    @app.get("/v2")
    def server_metadata():
        return service.server_metadata()

    @app.post("/v2/repository/index")
    def repository_index():
        return service.index()

    @app.get("/v2/models/{name}")
    @app.get("/v2/models/{name}/versions/{version}")
    def model_metadata(name: str, version: str = "1"):
        return _answer(lambda: service.model_metadata(name))

    @app.get("/v2/models/{name}/ready")
    @app.get("/v2/models/{name}/versions/{version}/ready")
    def model_ready(name: str, version: str = "1"):
        return Response(status_code=200 if name in service.models and service.ready else 400)

    @app.post("/v2/models/{name}/infer")
    @app.post("/v2/models/{name}/versions/{version}/infer")
    async def infer(name: str, request: Request, version: str = "1"):
        started = time.perf_counter()
        answer, status, headers = None, 500, {}
        try:
            body = await read_body(request, service.limits.max_body_bytes)
            answer = await service.infer(name, body, request.headers.get("inference-header-content-length"),
                                         request.is_disconnected)
            status = 200
            return Response(answer.body, headers=answer.headers)
        except Exception as exc:            # noqa: BLE001 - every failure is one line; the server keeps serving
            status = getattr(exc, "status", 500)
            headers = {"retry-after": "1"} if status == 503 else {}
            line = first_line(exc) if status != 500 else f"{type(exc).__name__}: {first_line(exc)}"
            return error(status, line, headers)
        finally:
            seconds = time.perf_counter() - started
            metrics.observe(name if name in service.models else "-", status, seconds)
            request_id = answer.request_id if answer else "-"
            what = f" mode={answer.mode} images={answer.images}" if answer else ""
            log(f"request {request_id} model={name[:60]}{what} status={status} seconds={seconds:.3f}")

    @app.get("/metrics")
    def metrics_text():
        return Response(metrics.text(), media_type="text/plain; version=0.0.4")

    return app


def _answer(make):
    try:
        return make()
    except BadRequest as exc:
        return error(exc.status, first_line(exc))


class _Server(uvicorn.Server):
    """uvicorn's server whose SIGTERM / SIGINT first turns ready false, then stops as uvicorn does (requests in
    flight finish), and is not raised again afterwards: the process exits 0."""

    service: Service

    def handle_exit(self, sig, frame) -> None:
        self.service.ready = False
        self.should_exit = True


def bind(host: str, port: int) -> socket.socket:
    """The listening socket (port 0: a free one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    return sock


def run_server(service: Service, sock: socket.socket, token: Optional[str] = None, grace: float = GRACE_SECONDS) -> None:
    """Serve on `sock` until SIGTERM or SIGINT; the models' workers stop after the last request."""
    metrics = Metrics()
    service.start()
    for name, worker in service.workers.items():
        metrics.watch(name, worker)

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    app = build_app(service, metrics, token, log)
    config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=grace,
                            lifespan="off")
    server = _Server(config)
    server.service = service
    host, port = sock.getsockname()[:2]
    print(f"serving {', '.join(service.models)} on http://{host}:{port} port={port}", flush=True)
    try:
        server.run(sockets=[sock])
    finally:
        service.stop()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

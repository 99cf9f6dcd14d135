"""`diffsmooth serve`: certified predictions over the Open Inference Protocol (docs/serving.md). The web stack
(the `serve` extra: fastapi, uvicorn, prometheus_client) is imported only when the server starts."""

from __future__ import annotations

import ipaddress
import sys

import click

from diffsmooth.cli.fast_path_options import compile_flag
from diffsmooth.cli.options import precision_option
from diffsmooth.cli.param_types import BATCH, SEED, THREADS, Count, Number
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.runs.resolve import set_threads
from diffsmooth.engine.serve import noise_key
from diffsmooth.engine.serve.limits import Limits
from diffsmooth.engine.serve.model_registry import DEFAULT_BATCH, Execution, demo_models, folder_models

LIMITS = Limits()


def is_loopback(host: str) -> bool:
    """Whether `host` is a loopback address (or `localhost`): anything else is reachable from other machines."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@click.command()
@click.option("--demo", is_flag=True, help="Serve the shipped demo models as rs, dds and diffsmooth (sigma 0.5, m 5).")
@click.option("--models", "models_dir", type=click.Path(file_okay=False), default=None,
              help="A folder of model files NAME.toml (method, sigma, checkpoints, settings; docs/serving.md).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind; any non-loopback address needs --token.")
@click.option("--port", type=Count(0, 65535, label="the port"), default=8000, show_default=True,
              help="Port to bind (0: a free one; the bound port is printed on the first line).")
@click.option("--token", envvar="DIFFSMOOTH_SERVE_TOKEN", default=None,
              help="Bearer token every request but the health probes must carry [env DIFFSMOOTH_SERVE_TOKEN].")
@click.option("--seed", type=SEED, default=None,
              help="TESTS ONLY: a reproducible noise key (every response says so) [default: drawn from the OS].")
@click.option("--threads", type=THREADS, default=None, help="CPU threads for torch.")
@click.option("--device", default="cpu", show_default=True, help="cpu, cuda or cuda:N.")
@precision_option()
@compile_flag()
@click.option("--batch", type=BATCH, default=DEFAULT_BATCH, show_default=True,
              help="--demo: noisy samples per batch, shared by every request in flight.")
@click.option("--max-images", type=Count(1, 2 ** 20), default=LIMITS.max_images, show_default=True,
              help="Most images in one request.")
@click.option("--max-samples", type=Count(1, 2 ** 32 - 1), default=LIMITS.max_samples, show_default=True,
              help="Most Monte Carlo samples one image may ask (n0 + n).")
@click.option("--max-queue", type=Count(1, 2 ** 20), default=LIMITS.max_queue, show_default=True,
              help="Most images queued or in flight per model; past it: 503 with Retry-After.")
@click.option("--max-body-mb", type=Number(0, 2 ** 14, low_open=True, label="the body limit"),
              default=LIMITS.max_body_bytes / 2 ** 20, show_default=True, help="Largest request body, MiB.")
@click.option("--deadline", type=Number(0, 86400, low_open=True, label="the deadline"), default=LIMITS.deadline,
              show_default=True, help="Seconds a request may take unless it asks less (deadline_ms).")
def serve(demo, models_dir, host, port, token, seed, threads, device, precision, compile, batch, max_images, max_samples,
          max_queue, max_body_mb, deadline):
    """Serve certified predictions over the Open Inference Protocol (KServe v2) on HTTP."""
    if demo == (models_dir is not None):
        raise UserError("give exactly one of --demo or --models FOLDER")
    if not is_loopback(host) and not token:
        raise UserError(f"--host {host} is reachable from other machines: give --token (or DIFFSMOOTH_SERVE_TOKEN), "
                        f"or bind 127.0.0.1")
    limits = Limits(max(1, int(max_body_mb * 2 ** 20)), max_images, max_samples, max_queue, deadline)
    set_threads(threads)
    start(None if demo else models_dir, host, port, token, seed, Execution(device, precision, compile), batch, limits)


def start(models_dir, host, port, token, seed, execution: Execution, batch, limits) -> None:
    """Self-test the sampler, load the models (the demo's when `models_dir` is None), bind and serve (the heavy step)."""
    try:
        from diffsmooth.engine.serve.app import bind, run_server
        from diffsmooth.engine.serve.service import Service
    except ImportError as exc:
        raise UserError(f"`diffsmooth serve` needs the serve extra: pip install 'diffsmooth-engine[serve]' "
                        f"({exc.name or exc} is missing)") from None
    key = noise_key.NoiseKey.make(seed)
    summary = noise_key.self_test(noise_key.engine_sampler(key.key))
    print(f"# noise: {key.generator}; sampler self-test passed: {summary}", file=sys.stderr, flush=True)
    models = demo_models(key.key, execution, batch) if models_dir is None else folder_models(models_dir, key.key, execution)
    for model in models:
        if model.check_fast_path():
            print(f"# model {model.name}: its fast path agreed with eager fp32", file=sys.stderr, flush=True)
    try:
        sock = bind(host, port)
    except OSError as exc:
        raise UserError(f"cannot bind {host}:{port}: {exc.strerror or exc}") from None
    run_server(Service(models, key, limits), sock, token)

"""A real `diffsmooth serve` process on 127.0.0.1 (port 0, the printed port read back), and plain-HTTP helpers."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
START_SECONDS = 120


class ServerProcess:
    """`python -m diffsmooth.cli serve ARGS --port 0` started, its port read from its first line; `stop` sends SIGTERM."""

    def __init__(self, *args: str):
        env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
        self.proc = subprocess.Popen([sys.executable, "-m", "diffsmooth.cli", "serve", *args, "--port", "0",
                                      "--threads", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=env, cwd=ROOT)
        line = self.proc.stdout.readline()          # the first line names the port (or the process ended)
        found = re.search(r"port=(\d+)", line)
        if not found:
            self.proc.kill()
            raise AssertionError(f"no port line: {line!r}; stderr: {self.proc.stderr.read()[-2000:]}")
        self.port = int(found.group(1))
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + START_SECONDS
        while self.get("/v2/health/ready")[0] != 200:
            assert time.monotonic() < deadline and self.proc.poll() is None, "the server never became ready"
            time.sleep(0.1)

    def request(self, method: str, path: str, body: bytes = None, headers: dict = None, timeout: float = 60):
        """(status, headers, body bytes) of one request."""
        req = urllib.request.Request(self.url + path, data=body, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as answer:
                return answer.status, dict(answer.headers), answer.read()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers), exc.read()

    def get(self, path: str):
        try:
            return self.request("GET", path, timeout=5)
        except OSError:
            return 0, {}, b""

    def infer(self, model: str, images: np.ndarray, timeout: float = 60, **parameters):
        """(status, the JSON answer) of a JSON infer request."""
        document = {"inputs": [{"name": "images", "shape": list(images.shape), "datatype": "FP32",
                                "data": images.reshape(-1).tolist()}], "parameters": parameters}
        status, _, body = self.request("POST", f"/v2/models/{model}/infer", json.dumps(document).encode(),
                                       {"Content-Type": "application/json"}, timeout)
        return status, json.loads(body)

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM, then the exit code (killed after `timeout` seconds)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return -9


def outputs(answer: dict) -> dict:
    """name -> list of an infer answer's JSON outputs."""
    return {o["name"]: o["data"] for o in answer["outputs"]}

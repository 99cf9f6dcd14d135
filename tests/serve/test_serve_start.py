"""What `diffsmooth serve` checks before it serves, in process: the sampler self-test refuses a planted bad sampler,
a non-loopback address needs a token, the OS-random key, a model folder of TOML files; and a stage that raises
fails only the requests in flight (the model's worker keeps serving)."""

import functools

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from diffsmooth.cli import main
from diffsmooth.engine.errors import UserError
from diffsmooth.engine.pipelines import SmoothedClassifier
from diffsmooth.engine.runs.assemble import check_against_eager
from diffsmooth.engine.runs.fast_path import VALIDATE_IMAGES, FastPath
from diffsmooth.engine.serve import noise_key
from diffsmooth.engine.serve.model_registry import folder_models
from diffsmooth.engine.serve.noise_key import IndexCounter, NoiseKey, engine_sampler, self_test
from diffsmooth.engine.serve.protocol import Asked

pytestmark = pytest.mark.usefixtures("one_thread")


def _one_line_error(result):
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


def test_the_engine_sampler_passes_and_planted_bad_samplers_fail():
    assert "KS p" in self_test(engine_sampler(NoiseKey.make(None).key))
    rng = np.random.default_rng(0)
    for bad in (lambda: rng.standard_normal(2 ** 20) * 1.01,               # variance 2% high
                lambda: (rng.random(2 ** 20) - 0.5) * np.sqrt(12),          # the right moments, the wrong law
                lambda: rng.standard_normal(2 ** 20) + 0.01,                # biased
                lambda: np.repeat(rng.standard_normal(2 ** 19), 2)):        # each draw twice
        with pytest.raises(UserError, match="self-test failed"):
            self_test(bad)


def test_serve_refuses_to_start_with_a_bad_sampler(monkeypatch):
    started = []
    monkeypatch.setattr(noise_key, "engine_sampler", lambda key: lambda: np.random.default_rng(1).random(2 ** 20))
    monkeypatch.setattr("diffsmooth.engine.serve.model_registry.demo_models", lambda *a: started.append(a))
    line = _one_line_error(CliRunner().invoke(main, ["serve", "--demo", "--port", "0"]))
    assert "self-test failed" in line and not started


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.5", "::", "example.org"])
def test_a_non_loopback_address_needs_a_token(host, monkeypatch):
    monkeypatch.delenv("DIFFSMOOTH_SERVE_TOKEN", raising=False)
    line = _one_line_error(CliRunner().invoke(main, ["serve", "--demo", "--host", host]))
    assert "--token" in line


def test_one_of_demo_or_models():
    assert "exactly one" in _one_line_error(CliRunner().invoke(main, ["serve"]))


def test_the_key_is_the_operating_systems_unless_seeded():
    keys = {NoiseKey.make(None).key for _ in range(4)}
    assert len(keys) == 4 and NoiseKey.make(None).generator == "os-random key"
    assert NoiseKey.make(3) == NoiseKey(3, "seeded")
    counter = IndexCounter(2 ** 32 - 4)
    assert counter.take(2) == 2 ** 32 - 4
    with pytest.raises(UserError, match="restart"):
        counter.take(2)


def test_a_model_folder_of_toml_files(tmp_path):
    (tmp_path / "mine.toml").write_text('method = "diffsmooth"\nsigma = 0.5\nclassifier = "demo"\ndenoiser = "demo"\n'
                                        '[settings]\nm = 3\n')
    (model,) = folder_models(tmp_path, seed=1)
    assert (model.name, model.method, model.settings["m"], model.image_shape) == ("mine", "diffsmooth", 3, (1, 32, 32))
    assert set(model.digests) == {"classifier", "denoiser"}
    (tmp_path / "mine.toml").write_text('method = "rs"\nsigma = 0.5\nclassifier = "demo"\nsigmaa = 1\n')
    with pytest.raises(UserError, match="unknown key `sigmaa`"):
        folder_models(tmp_path, seed=1)


def test_a_stage_that_raises_fails_its_requests_and_the_worker_keeps_serving(tmp_path):
    from diffsmooth.engine.serve.batcher import ModelWorker, result_of

    (tmp_path / "rs.toml").write_text('method = "rs"\nsigma = 0.5\nclassifier = "demo"\nbatch = 16\n')
    (model,) = folder_models(tmp_path, seed=1)
    pipeline = model.pipeline()
    worker = ModelWorker(pipeline, 16, 8, IndexCounter(), log=lambda line: None).start()
    real, calls = pipeline.classify, []

    def broken_once(h, rows):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("planted stage failure")
        return real(h, rows)

    pipeline.classify = broken_once
    x = np.zeros((2, 1, 32, 32), np.float32)
    asked = Asked(n=20)
    with pytest.raises(RuntimeError, match="planted"):
        worker.submit(x, asked).future.result(timeout=60)
    results = worker.submit(x, asked).future.result(timeout=60)
    assert [result_of(r, asked)[2] for r in results] == [20, 20] and worker.waiting == 0
    expected = model.smoothed.predict(torch.zeros(1, 32, 32), n=20, image_index=2)
    assert result_of(results[0], asked)[0] == expected
    worker.close()
    worker.thread.join(10)


def test_concurrent_requests_share_every_batch_fairly_with_the_same_answers(tmp_path):
    from diffsmooth.engine.serve.batcher import ModelWorker, result_of

    (tmp_path / "rs.toml").write_text('method = "rs"\nsigma = 0.5\nclassifier = "demo"\nbatch = 80\n')
    (model,) = folder_models(tmp_path, seed=1)
    worker = ModelWorker(model.pipeline(), 80, 64, IndexCounter(), log=lambda line: None)
    batches = []
    worker.on_batch = lambda requests, rows: batches.append((requests, rows))
    from diffsmooth.engine.data import load_dataset

    data = load_dataset("embedded")
    x = np.stack([data[k][0].numpy()[None] for k in range(0, 8 * 13, 13)]).astype(np.float32)
    asked = Asked(n=40)
    tickets = [worker.submit(image, asked) for image in x]          # all queued before the worker starts
    worker.start()
    results = [result_of(t.future.result(timeout=60)[0], asked)[0] for t in tickets]
    assert batches[:4] == [(8, 80)] * 4                            # 8 requests x a slice of 80 // 8 rows
    expected = [model.smoothed.predict(torch.from_numpy(image[0]), n=40, image_index=t.first_index)
                for image, t in zip(x, tickets)]
    assert results == expected and len(set(results)) >= 2
    batches.clear()
    worker.submit(x[0], Asked(n=60)).future.result(timeout=60)      # alone: the whole request in one batch
    assert batches == [(1, 60)]
    worker.close()
    worker.thread.join(10)

def _call(app, method: str, path: str, headers=()):
    """(status, body) of one request through the ASGI app, with no server around it."""
    import asyncio

    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "path": path,
             "raw_path": path.encode(), "query_string": b"", "root_path": "", "scheme": "http",
             "headers": [(k.lower().encode(), v.encode()) for k, v in headers], "client": ("127.0.0.1", 1),
             "server": ("127.0.0.1", 80)}
    asyncio.run(app(scope, receive, send))
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


def test_a_token_guards_every_route_but_the_health_probes():
    pytest.importorskip("fastapi")
    import json

    from diffsmooth.engine.serve.app import build_app
    from diffsmooth.engine.serve.limits import Limits
    from diffsmooth.engine.serve.metrics import Metrics
    from diffsmooth.engine.serve.service import Service

    service = Service([], NoiseKey.make(None), Limits(), log=lambda line: None)
    service.ready = True
    app = build_app(service, Metrics(), token="s3cret", log=lambda line: None)
    assert _call(app, "GET", "/v2/health/live")[0] == 200 and _call(app, "GET", "/v2/health/ready")[0] == 200
    for method, path in (("GET", "/v2"), ("GET", "/metrics"), ("POST", "/v2/repository/index")):
        status, body = _call(app, method, path)
        assert status == 401 and "\n" not in json.loads(body)["error"]
        assert _call(app, method, path, [("Authorization", "Bearer wrong")])[0] == 401
        assert _call(app, method, path, [("Authorization", "Bearer s3cret")])[0] == 200


def test_without_the_serve_extra_every_other_command_works_and_serve_says_what_to_install(monkeypatch):
    for name in ("fastapi", "uvicorn", "prometheus_client", "diffsmooth.engine.serve.app",
                 "diffsmooth.engine.serve.metrics"):
        monkeypatch.setitem(__import__("sys").modules, name, None)       # an import of it now fails
    assert CliRunner().invoke(main, ["env", "--help"]).exit_code == 0
    line = _one_line_error(CliRunner().invoke(main, ["serve", "--demo", "--port", "0"]))
    assert "serve extra" in line


class _OneClassUp(torch.nn.Module):
    """The classifier's logits moved one class up: a fast path that disagrees."""

    def __init__(self, classifier):
        super().__init__()
        self.classifier = classifier

    def forward(self, x):
        return torch.roll(self.classifier(x), 1, dims=-1)


def _rs_folder(tmp_path, monkeypatch, check: bool = True):
    """The demo RS model from a folder on a fast path that may change the votes (cheap on a CPU); its check images
    the embedded set's (a demo classifier's default) or none (as a model of the user's own files without the key);
    the check at 40 samples per image instead of 500, to keep the suite fast."""
    monkeypatch.setattr("diffsmooth.engine.pipelines.check_against_eager",
                        functools.partial(check_against_eager, validate_samples=40))
    (tmp_path / "rs.toml").write_text('method = "rs"\nsigma = 0.5\nclassifier = "demo"\nbatch = 250\n')
    (model,) = folder_models(tmp_path, seed=1)
    model.smoothed.fast = FastPath(fused_attention=True)
    model.check = model.check if check else None
    return model


def test_a_fast_path_is_checked_against_eager_fp32_on_the_check_images_before_serving(tmp_path, monkeypatch):
    model = _rs_folder(tmp_path, monkeypatch)
    assert model.check == ("embedded", None)
    assert model.check_fast_path() == VALIDATE_IMAGES
    assert model.smoothed._checked[model.image_shape] == list(range(VALIDATE_IMAGES))
    assert model.pipeline() is model.smoothed.smooth_for(model.image_shape).pipeline      # the checked one serves
    eager = _rs_folder(tmp_path, monkeypatch, check=False)
    eager.smoothed.fast = FastPath()
    assert eager.check_fast_path() == 0                  # eager fp32 needs no check (and no check dataset)
    (tmp_path / "images").mkdir()
    (tmp_path / "rs.toml").write_text('method = "rs"\nsigma = 0.5\nclassifier = "demo"\ncheck_dataset = "cifar10"\n'
                                      'check_data = "images"\n')
    assert folder_models(tmp_path, seed=1)[0].check == ("cifar10", str(tmp_path / "images"))


def test_a_fast_path_without_check_images_or_that_disagrees_is_refused_in_one_line(tmp_path, monkeypatch):
    with pytest.raises(UserError, match="give `check_dataset`") as refused:
        _rs_folder(tmp_path, monkeypatch, check=False).check_fast_path()
    assert "\n" not in str(refused.value)
    real = SmoothedClassifier._pipeline

    def planted(self, shape, fast, precision):
        if not fast.fused_attention:
            return real(self, shape, fast, precision)
        honest, self.classifier = self.classifier, _OneClassUp(self.classifier)
        try:
            return real(self, shape, fast, precision)
        finally:
            self.classifier = honest

    monkeypatch.setattr(SmoothedClassifier, "_pipeline", planted)
    with pytest.raises(UserError, match="disagrees with eager fp32") as refused:
        _rs_folder(tmp_path, monkeypatch).check_fast_path()
    assert "\n" not in str(refused.value)

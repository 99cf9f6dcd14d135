"""Fixtures of the hostile-input (fuzz) and fault tests: the heavy steps of every command stubbed out,
and the reliability ledger written when the session ends ($DIFFSMOOTH_RELIABILITY_JSON)."""

import pytest
import reliability_ledger as ledger
from fuzz_helpers import Accepted

_outcomes = {"passed": 0, "failed": 0, "skipped": 0, "xfailed": 0, "xpassed": 0}


def _accept(*args, **kwargs):
    raise Accepted()


@pytest.fixture
def stub_heavy_steps(monkeypatch):
    """Every command stops with Accepted where its real work (models, training, export, the table's
    preflight and runs) would begin: reaching it means the options were accepted."""
    import diffsmooth.bench.harness as bench_harness
    import diffsmooth.cli.certify as certify
    import diffsmooth.cli.demo as demo
    import diffsmooth.cli.env as env
    import diffsmooth.cli.export as export
    import diffsmooth.cli.purify as purify
    import diffsmooth.cli.serve as serve
    import diffsmooth.cli.table as table
    import diffsmooth.cli.train_demo as train_demo
    import diffsmooth.cli.validate as validate
    import diffsmooth.export.trt_build as trt_build
    from diffsmooth.engine.table.build import TableBuilder

    monkeypatch.setattr(certify, "build_voter", _accept)
    monkeypatch.setattr(demo, "run_demo", _accept)
    monkeypatch.setattr(env, "collect_env", _accept)
    monkeypatch.setattr(export, "load_classifier_from", _accept)    # export: options checked before models load
    monkeypatch.setattr(export, "load_denoiser_from", _accept)
    monkeypatch.setattr(export, "export_models", _accept)
    monkeypatch.setattr(purify, "purify_grid", _accept)
    monkeypatch.setattr(serve, "start", _accept)                     # the sampler's self-test, the models, the socket
    monkeypatch.setattr(train_demo, "run", _accept)
    monkeypatch.setattr(validate, "validate_dir", _accept)
    monkeypatch.setattr(trt_build, "current_target", _accept)
    monkeypatch.setattr(bench_harness, "machine_info", _accept)      # the first step after BenchSettings.resolved()
    monkeypatch.setattr(table, "_preflight", _accept)               # a table asks first: the models' first work
    monkeypatch.setattr(TableBuilder, "build", _accept)


def pytest_runtest_logreport(report):
    if "fuzz/test_" not in report.nodeid.replace("\\", "/"):
        return
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        if hasattr(report, "wasxfail"):
            _outcomes["xfailed" if report.outcome == "skipped" else "xpassed"] += 1
        else:
            _outcomes[report.outcome] += 1


def pytest_sessionfinish(session, exitstatus):
    ledger.write_if_asked(int(exitstatus), dict(_outcomes))

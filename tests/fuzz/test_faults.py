"""Faults survived, for real, on the embedded demo models: a full disk during a row write, SIGTERM
(a scheduler's notice) and SIGKILL to a running `certify`, and models whose weights hold NaN / inf.
After each, the finished rows are intact and a rerun of the same command gives the rows of an
uninterrupted run (the `time` column aside)."""

import errno
import os
import signal
import subprocess
import sys
import time

import pytest
import reliability_ledger as ledger
import torch
from cli_helpers import assert_rows_spread, rows_without_time
from fuzz_helpers import DEMO_CLASSIFIER, DEMO_CLASSIFIER_CLEAN, invoke, refused_properly, snapshot, stopped_properly

from diffsmooth.engine.demo import shipped as demo_assets
from diffsmooth.engine.runs import results as results_module
from diffsmooth.engine.runs.results import read_result

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not demo_assets.DEMO_UNET.exists(), reason="embedded demo models not shipped")]

# 13 demo images (every 40th), 300 samples each: votes spread over several classes (asserted), and
# a run lasts long enough on 2 CPU cores to be stopped in the middle (after 2 rows, before the last).
RUN = ["certify", "--method", "rs", "--sigma", "0.5", "--n0", "100", "--n", "200", "--skip", "40", "--batch", "250",
       "--threads", "1", "--quiet"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The rows of an uninterrupted run."""
    out = tmp_path_factory.mktemp("reference") / "r.tsv"
    result = invoke([*RUN, "--out", out])
    assert result.exit_code == 0, result.output
    assert_rows_spread(out, min_classes=3)
    return rows_without_time(out)


def _rerun_matches(out, reference, kind):
    result = invoke([*RUN, "--out", out])
    ok = result.exit_code == 0 and rows_without_time(out) == reference
    ledger.fault(kind, ok)
    assert result.exit_code == 0, result.output
    assert rows_without_time(out) == reference, f"{kind}: the rerun's rows differ from an uninterrupted run's"


def _finished_rows_intact(out, reference):
    """Every row in the file is complete (no torn line) and is the uninterrupted run's row."""
    rows = rows_without_time(out)
    by_index = {r["idx"]: r for r in reference}
    return all(by_index.get(r["idx"]) == r for r in rows), rows


@pytest.mark.parametrize("partial", [False, True], ids=["between-rows", "mid-row"])
def test_full_disk_stops_with_one_line_and_the_rerun_completes(tmp_path, monkeypatch, reference, partial):
    """ENOSPC on the 4th row (after half of it reached the disk when `partial`): one `error: ... no space
    left ...` line, exit 2, the 3 finished rows intact and no torn line; the rerun completes the file."""
    out = tmp_path / "r.tsv"
    real_write_all = results_module._write_all
    calls = {"n": 0}

    def full_disk(fd, data):
        calls["n"] += 1
        if calls["n"] <= 4:                     # the header and 3 rows
            return real_write_all(fd, data)
        if partial:
            os.write(fd, data[:len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(results_module, "_write_all", full_disk)
    result = invoke([*RUN, "--out", out])
    monkeypatch.setattr(results_module, "_write_all", real_write_all)
    problem = stopped_properly(result)
    intact, rows = _finished_rows_intact(out, reference)
    ok = problem is None and "no space left" in result.stderr and intact and len(rows) == 3 \
        and out.read_bytes().endswith(b"\n")
    ledger.fault("full disk " + ("mid-row" if partial else "between rows"), ok)
    assert problem is None, problem
    assert "no space left" in result.stderr and str(out) in result.stderr
    assert intact and len(rows) == 3 and out.read_bytes().endswith(b"\n"), out.read_text()
    read_result(out)                            # a clean file: no torn line, nothing to repair
    _rerun_matches(out, reference, "full disk rerun")


def _start(out):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-m", "diffsmooth.cli", *RUN, "--out", str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def _wait_for_rows(proc, out, rows: int, timeout: float = 240):
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if out.exists():
            done = out.read_bytes().count(b"\n") - 1
            if done >= rows:
                return
        time.sleep(0.1)
    pytest.fail(f"the run wrote fewer than {rows} rows in {timeout} s (exit {proc.poll()})")


def test_sigterm_stops_at_once_keeps_the_rows_and_the_rerun_completes(tmp_path, reference):
    """SIGTERM mid-run: no new batch, the images in flight dropped, exit 143 within seconds with one line
    saying the rows are kept and the same command continues; the rerun gives the uninterrupted rows."""
    out = tmp_path / "r.tsv"
    proc = _start(out)
    _wait_for_rows(proc, out, 2)
    proc.send_signal(signal.SIGTERM)
    sent = time.time()
    _, err = proc.communicate(timeout=60)
    seconds = time.time() - sent
    print(f"SIGTERM: exit {proc.returncode} {seconds:.2f} s after the signal")
    lines = [line for line in err.splitlines() if line.strip()]
    intact, rows = _finished_rows_intact(out, reference)
    ok = proc.returncode == 143 and seconds < 15 and "Traceback" not in err and intact \
        and "kept" in lines[-1] and "same command" in lines[-1] and len(rows) < len(reference)
    ledger.fault("SIGTERM", ok)
    assert proc.returncode == 143, err
    assert "Traceback" not in err and "terminated (SIGTERM)" in lines[-1], err
    assert "kept" in lines[-1] and "same command again" in lines[-1], lines[-1]
    assert seconds < 15, f"took {seconds:.1f} s to stop after SIGTERM"
    assert intact and 2 <= len(rows) < len(reference) and out.read_bytes().endswith(b"\n")
    _rerun_matches(out, reference, "SIGTERM rerun")


def test_sigkill_leaves_a_resumable_file(tmp_path, reference):
    """SIGKILL (no notice): whatever reached the disk is complete rows plus at most a torn last line,
    which the rerun cuts; the rerun gives the uninterrupted rows."""
    out = tmp_path / "r.tsv"
    proc = _start(out)
    _wait_for_rows(proc, out, 2)
    proc.kill()
    proc.communicate(timeout=60)
    header, rows = read_result(out, torn_tail="ignore")
    by_index = {r["idx"]: r for r in reference}
    intact = all(by_index.get(r["idx"]) == {k: v for k, v in r.items() if k != "time"} for r in rows)
    ledger.fault("SIGKILL", proc.returncode == -signal.SIGKILL and intact)
    assert proc.returncode == -signal.SIGKILL and intact and len(rows) >= 2
    _rerun_matches(out, reference, "SIGKILL rerun")


@pytest.mark.parametrize("which", ["classifier", "denoiser"])
def test_nan_weights_are_refused_before_a_vote_is_counted(tmp_path, which, monkeypatch):
    """A model whose weights hold NaN or inf: one line naming the file and the parameter, exit 2, no
    result or settings file, and no vote counted (the Monte Carlo counting is never entered)."""
    from diffsmooth.engine.certify import monte_carlo

    counted = []
    monkeypatch.setattr(monte_carlo.MonteCarloPipeline, "scheduler",
                        lambda *a, **k: counted.append(1) or pytest.fail("a vote was about to be counted"))
    if which == "classifier":
        checkpoint = torch.load(DEMO_CLASSIFIER, weights_only=True)
        checkpoint["state_dict"]["1.fc.weight"][3, 7] = float("nan")
        args = ["--method", "rs", "--classifier", tmp_path / "bad.pt", "--stats", "fashion-mnist"]
        parameter = "fc.weight"
    else:
        checkpoint = torch.load(demo_assets.DEMO_UNET, weights_only=True)
        name = next(k for k, v in checkpoint.items() if v.is_floating_point() and v.dim() == 4)
        checkpoint[name].view(-1)[0] = float("inf")
        args = ["--method", "dds", "--denoiser", tmp_path / "bad.pt", "--preset", "demo", "--classifier",
                DEMO_CLASSIFIER_CLEAN]
        parameter = name
    torch.save(checkpoint, tmp_path / "bad.pt")
    before = snapshot(tmp_path)
    result = invoke(["certify", *args, "--sigma", "0.5", "--n0", "10", "--n", "20", "--max", "2", "--quiet",
                     "--out", tmp_path / "out" / "r.tsv"])
    problem = refused_properly(result)
    ok = problem is None and parameter in result.stderr and "bad.pt" in result.stderr and not counted \
        and snapshot(tmp_path) == before
    ledger.fault(f"NaN/inf weights ({which})", ok)
    assert problem is None, problem
    assert "NaN/inf" in result.stderr and parameter in result.stderr and "bad.pt" in result.stderr, result.stderr
    assert not counted and snapshot(tmp_path) == before

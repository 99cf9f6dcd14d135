"""One writer per result file: a second run on a held result file, sweep folder, table folder or merge
output stops at once (one `error:` line naming the file and the holder, exit code 2, nothing changed);
the lock file keeps the holder's pid; a killed holder never blocks its own resume; rows are single
appends."""

import errno
import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

import pytest
from cli_helpers import invoke_ok, rows_without_time
from click.testing import CliRunner

from diffsmooth.cli import main
from diffsmooth.engine.runs import locks
from diffsmooth.engine.runs.locks import LockHeld, hold_lock, lock_file
from diffsmooth.engine.runs.results import ResultWriter, read_rows, settings_path

FAST = ["--n0", "8", "--n", "40", "--batch", "16", "--quiet"]
HOLDER = ("import sys\nfrom diffsmooth.engine.runs.locks import hold_lock\n"
          "with hold_lock(sys.argv[1], 'x', folder=sys.argv[2] == '1'):\n"
          "    print('held', flush=True)\n    sys.stdin.read()\n")


@contextmanager
def held_elsewhere(target, folder=False):
    """Another process holds `target`'s lock for the block; yields that process."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(target), "1" if folder else "0"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        yield proc
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)


def invoke(args):
    return CliRunner().invoke(main, [str(a) for a in args])


def assert_refused(result, target, holder):
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: ") and result.output.count("\n") == 1, result.output
    assert str(target) in result.output and f"pid {holder.pid} on host" in result.output, result.output


def _no_models(monkeypatch):
    """Fail the test if a command gets as far as loading models."""
    import diffsmooth.cli.certify as certify_cli

    def refuse(*args, **kwargs):
        raise AssertionError("models loaded despite the held lock")
    monkeypatch.setattr(certify_cli, "build_voter", refuse)


@pytest.mark.parametrize("existing", [False, True])
def test_second_run_on_a_held_file_stops_before_models_and_changes_nothing(tmp_path, tiny_cli_args, monkeypatch,
                                                                            existing):
    out = tmp_path / "r.tsv"
    if existing:
        out.write_text("idx\tlabel\tpredict\tradius\tcorrect\ttime\n0\t0\t0\t0.5\t1\t0:00:01\n")
    before = out.read_bytes() if existing else None
    _no_models(monkeypatch)
    with held_elsewhere(out) as holder:
        start = time.time()
        result = invoke(["certify", *tiny_cli_args, "--method", "rs", "--sigma", "0.5", *FAST, "--out", out])
        assert_refused(result, out, holder)
        assert time.time() - start < 30
        assert (out.read_bytes() if out.exists() else None) == before
        assert not settings_path(out).exists()
        assert json.loads(lock_file(out).read_text())["pid"] == holder.pid     # the failed try truncated nothing


def test_failed_attempt_keeps_the_holders_pid_and_a_dead_holder_blocks_nothing(tmp_path):
    out = tmp_path / "r.tsv"
    with held_elsewhere(out) as holder:
        with pytest.raises(LockHeld, match=f"pid {holder.pid} on host"):
            with hold_lock(out):
                pass
        info = json.loads(lock_file(out).read_text())
        assert info["pid"] == holder.pid and info["host"]
        holder.send_signal(signal.SIGKILL)             # the kernel drops the lock with the process
        holder.wait()
        with hold_lock(out):
            assert json.loads(lock_file(out).read_text())["pid"] == os.getpid()
    assert lock_file(out).exists()                    # left behind: harmless
    with hold_lock(out):
        pass


def test_lock_is_reentrant_in_one_thread_and_exclusive_across_threads(tmp_path):
    out = tmp_path / "r.tsv"
    refused = []

    def other_thread():
        try:
            with hold_lock(out):
                pass
        except LockHeld as exc:
            refused.append(str(exc))
    with hold_lock(out):
        with hold_lock(out):                          # the command line, then execute, then the writer
            pass
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
    assert len(refused) == 1 and f"pid {os.getpid()}" in refused[0]
    locks.check_unlocked(out)                         # released on the outer exit
    with held_elsewhere(out):
        with pytest.raises(LockHeld):
            locks.check_unlocked(out)


def test_without_working_locks_it_warns_once_and_writes(tmp_path, monkeypatch):
    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")
    monkeypatch.setattr(fcntl, "flock", no_locks)
    monkeypatch.setattr(locks, "_warned", False)
    with pytest.warns(RuntimeWarning, match="no working file locks"):
        with ResultWriter(tmp_path / "a.tsv") as w:
            w.write(idx=0, label=1, predict=1, radius="0.5", correct=1, time="0:00:01")
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with ResultWriter(tmp_path / "b.tsv"):
            pass
    assert len(read_rows(tmp_path / "a.tsv")) == 1


def test_each_row_is_one_append_mode_write(tmp_path, monkeypatch):
    import diffsmooth.engine.runs.results as results
    writes = []
    real_write = os.write

    def counting_write(fd, data):
        writes.append((fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_APPEND, bytes(data)))
        return real_write(fd, data)
    monkeypatch.setattr(results.os, "write", counting_write)
    path = tmp_path / "r.tsv"
    with ResultWriter(path) as w:
        for i in range(3):
            w.write(idx=i, label=1, predict=1, radius="0.5", correct=1, time="0:00:01")
    assert len(writes) == 4 and all(append for append, _ in writes)      # the header, then one write per row
    assert [data for _, data in writes] == [line.encode() for line in path.read_text().splitlines(keepends=True)]


def test_sweep_folder_refuses_a_second_writer(tmp_path, tiny_models, monkeypatch):
    out = tmp_path / "sweep"
    args = ["certify", "--denoiser", tiny_models["unet"], "--preset", "cifar10", "--unet-config",
            tiny_models["unet_config"], "--dataset", "npz", "--data", tiny_models["data"], "--sigma",
            tiny_models["sigma"], "--classifier", tiny_models["classifier"], "--method", "rs", "--method", "dds",
            *FAST, "--out", out]
    _no_models(monkeypatch)
    with held_elsewhere(out, folder=True) as holder:
        result = invoke(args)
        assert_refused(result, out, holder)
        assert "sweep folder" in result.output
        assert sorted(p.name for p in out.iterdir()) == [".lock"]          # no index.json, no rows


def test_table_folder_refuses_a_second_writer(tmp_path):
    out = tmp_path / "t"
    with held_elsewhere(out, folder=True) as holder:
        result = invoke(["table", "--demo", "--rows", "rs", "--images", "2", "--n-max", "20", "--quiet", "--out", out])
        assert_refused(result, out, holder)
        assert "table folder" in result.output
        assert sorted(p.name for p in out.iterdir()) == [".lock"]          # no table.json, no runs/


def test_a_table_takes_its_runs_file_locks_inside_its_folder_lock(tmp_path):
    out = tmp_path / "t"
    with hold_lock(out, "table folder", folder=True):
        with hold_lock(out / "runs" / "rs_s0.25.tsv"):
            with hold_lock(out / "runs" / "sweep", "sweep folder", folder=True):
                pass


def test_merge_refuses_an_output_another_run_writes(tmp_path):
    shard, out = tmp_path / "a.tsv", tmp_path / "m.tsv"
    shard.write_text("idx\tlabel\tpredict\tradius\tcorrect\ttime\n0\t1\t1\t0.5\t1\t0:00:01\n")
    out.write_text("idx\tlabel\tpredict\tradius\tcorrect\ttime\n")
    with held_elsewhere(out) as holder:
        assert_refused(invoke(["merge", out, shard]), out, holder)
        assert out.read_text() == "idx\tlabel\tpredict\tradius\tcorrect\ttime\n"
    invoke_ok(["merge", out, shard])
    assert len(read_rows(out)) == 1


def _cli(args):
    return [sys.executable, "-m", "diffsmooth.cli", *[str(a) for a in args]]


@pytest.mark.slow
def test_two_certify_runs_on_one_file(tmp_path, tiny_cli_args, monkeypatch):
    """A real run holds the file: a second one (other settings too) exits 2 at once and changes
    nothing; after the first is SIGKILLed, a resume takes the lock and finishes with the rows of an
    uninterrupted run."""
    # n = 2000: the first run is still on its second image when it is stopped (its first row written)
    args = ["certify", *tiny_cli_args, "--method", "rs", "--n0", "50", "--n", "2000", "--batch", "100",
            "--window", "1", "--threads", "1", "--quiet"]
    out, whole = tmp_path / "r.tsv", tmp_path / "whole.tsv"
    first = subprocess.Popen(_cli([*args, "--out", out]), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not (out.exists() and len(out.read_text().splitlines()) >= 2):
            time.sleep(0.1)
        assert json.loads(lock_file(out).read_text())["pid"] == first.pid
        first.send_signal(signal.SIGSTOP)             # hold still: the file must not change while we look
        before = out.read_bytes(), settings_path(out).read_bytes()
        _no_models(monkeypatch)
        for other in ([], ["--n", "200"]):            # the same settings, and other settings
            start = time.time()
            assert_refused(invoke([*args, *other, "--out", out]), out, first)
            assert time.time() - start < 30
            assert (out.read_bytes(), settings_path(out).read_bytes()) == before
            assert json.loads(lock_file(out).read_text())["pid"] == first.pid
        first.send_signal(signal.SIGKILL)
        first.wait()
        monkeypatch.undo()
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
        first.stderr.close()
    resumed = subprocess.run(_cli([*args, "--out", out]), capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    assert "already done" in resumed.stderr and "(0 already done)" not in resumed.stderr
    invoke_ok([*args, "--out", whole])
    assert rows_without_time(out) == rows_without_time(whole)

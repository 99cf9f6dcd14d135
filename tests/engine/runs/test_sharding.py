"""Scale-out and crash safety: shards and torchrun ranks give the rows of one run; SIGKILL at
random points and a restart give the uninterrupted file; resumes refuse different settings."""

import os
import random
import signal
import subprocess
import sys
import time

import pytest
from cli_helpers import assert_rows_spread, rows_without_time
from cli_helpers import invoke_ok as invoke
from click.testing import CliRunner

from diffsmooth.cli import main
from diffsmooth.engine.runs.results import merge_results, read_rows, shard_path

FAST = ["--n0", "8", "--n", "40", "--batch", "16", "--quiet"]


def test_shards_merge_to_the_single_run(tmp_path, tiny_cli_args):
    whole = tmp_path / "whole.tsv"
    base = ["certify", *tiny_cli_args, "--method", "diffsmooth", "--m", "2", *FAST]
    invoke([*base, "--out", whole])
    merged = tmp_path / "merged.tsv"
    for i in range(3):
        result = invoke([*base, "--shard", f"{i}/3", "--out", merged])
        assert "diffsmooth merge" in result.output
    shards = [shard_path(merged, i, 3) for i in range(3)]
    assert [len(read_rows(s)) for s in shards] == [2, 2, 2]
    invoke(["merge", merged, *shards])
    assert_rows_spread(whole)
    assert rows_without_time(merged) == rows_without_time(whole)


def test_merge_refuses_conflicting_rows(tmp_path):
    a, b = tmp_path / "a.tsv", tmp_path / "b.tsv"
    header = "idx\tlabel\tpredict\tradius\tcorrect\ttime\n"
    a.write_text(header + "0\t1\t1\t0.5\t1\t0:00:01\n")
    b.write_text(header + "0\t1\t2\t0.5\t0\t0:00:01\n")
    from diffsmooth.engine.errors import UserError
    with pytest.raises(UserError, match="different results"):
        merge_results([a, b], tmp_path / "m.tsv")
    assert not (tmp_path / "m.tsv").exists()


def test_resume_refuses_other_settings(tmp_path, tiny_cli_args):
    out = tmp_path / "r.tsv"
    invoke(["certify", *tiny_cli_args, "--method", "rs", *FAST, "--max", "2", "--out", out])
    result = CliRunner().invoke(main, ["certify", *tiny_cli_args, "--method", "rs", "--sigma", "0.5",
                                       *FAST, "--out", str(out)])
    assert result.exit_code == 2 and "sigma=0.25" in result.output


def _cli(args):
    return [sys.executable, "-m", "diffsmooth.cli", *[str(a) for a in args]]


@pytest.mark.slow
def test_torchrun_two_gloo_ranks_equal_one_process(tmp_path, tiny_cli_args):
    whole, dist_out = tmp_path / "whole.tsv", tmp_path / "dist.tsv"
    # torchrun's own parser rejects prefixes of its options (--n, --m, --max): use the long aliases
    base = ["certify", *tiny_cli_args, "--method", "dds", "--n0", "8", "--num-samples", "40", "--batch", "16", "--quiet"]
    invoke([*base, "--out", whole])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
           str(29500 + os.getpid() % 1000), "-m", "diffsmooth.cli", *[str(a) for a in base], "--out", str(dist_out)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "merged 6 rows from 2 ranks" in proc.stderr
    assert_rows_spread(whole)
    assert rows_without_time(dist_out) == rows_without_time(whole)


@pytest.mark.slow
def test_sigkill_and_restart_equal_uninterrupted_run(tmp_path, tiny_cli_args):
    args = ["certify", *tiny_cli_args, "--method", "rs", "--n0", "50", "--n", "3000", "--batch", "100",
            "--threads", "1", "--quiet"]
    whole, killed = tmp_path / "whole.tsv", tmp_path / "killed.tsv"
    invoke([*args, "--out", whole])
    rng = random.Random(1)
    for _ in range(3):
        proc = subprocess.Popen(_cli([*args, "--out", killed]), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(2.0, 6.0))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if killed.exists():                       # simulate the worst case too: a torn last line
            with open(killed, "a") as f:
                f.write("5\t5\t")
    assert subprocess.run(_cli([*args, "--out", killed]), capture_output=True).returncode == 0
    assert_rows_spread(whole)
    assert rows_without_time(killed) == rows_without_time(whole)
    indices = [int(r["idx"]) for r in read_rows(killed)]
    assert len(indices) == len(set(indices))                 # every image once


@pytest.mark.slow
def test_sigint_stops_after_current_image(tmp_path, tiny_cli_args):
    args = ["certify", *tiny_cli_args, "--method", "rs", "--n0", "50", "--n", "20000", "--batch", "500",
            "--threads", "1", "--quiet"]
    out = tmp_path / "int.tsv"
    proc = subprocess.Popen(_cli([*args, "--out", out]), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not (out.exists() and len(out.read_text().splitlines()) >= 2):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert "interrupted after" in err
    rows = read_rows(out)
    assert 1 <= len(rows) < 6 and out.read_text().endswith("\n")

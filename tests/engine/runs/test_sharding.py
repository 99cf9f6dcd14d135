"""Scale-out and crash safety: shards and torchrun ranks give the rows of one run; SIGKILL at random points and a
restart give the uninterrupted file, as does torchrun's --max-restarts replacing a rank killed mid-look; resumes
refuse different settings."""

import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

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


PACED_CLI = Path(__file__).resolve().parents[2] / "paced_cli.py"    # plants a rank's SIGKILL mid-look


def _torchrun(ranks: int, args, out, *extra: str, launch=("-m", "diffsmooth.cli"), env=None):
    """`args` on `ranks` gloo ranks (one thread each) writing `out`; the finished process."""
    with socket.socket() as free:                   # a port no other test's torchrun holds
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks), "--master_port", str(port),
           *extra, *launch, *[str(a) for a in args], "--out", str(out)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, OMP_NUM_THREADS="1", **(env or {})))


@pytest.mark.slow
def test_three_gloo_ranks_share_every_image_of_a_sweep_and_write_one_processes_rows(tmp_path, tiny_models):
    """A sweep (rs, dds and diffsmooth; two classifiers; m 1 and 3) on 3 ranks, each computing its share of every
    image's samples: every configuration's file equals one process's, votes spread over several classes."""
    # torchrun's own parser rejects prefixes of its options (--n, --m, --max): the long aliases
    args = ["certify", "--denoiser", tiny_models["unet"], "--preset", "cifar10", "--unet-config",
            tiny_models["unet_config"], "--classifier", tiny_models["classifier"], "--classifier",
            tiny_models["classifier_b"], "--dataset", "npz", "--data", tiny_models["data"], "--sigma",
            tiny_models["sigma"], "--method", "rs", "--method", "dds", "--method", "diffsmooth", "--local-sigma", "0.12",
            "--local-noise", "fresh", "--n0", "8", "--num-samples", "40", "--batch", "16", "--threads", "1", "--quiet"]
    one, ranks = tmp_path / "one", tmp_path / "ranks"
    invoke([*args, "--m", "1", "--m", "3", "--out", one])
    proc = _torchrun(3, [*args, "--num-local", "1", "--num-local", "3"], ranks)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "the 3 ranks shared every image's samples" in proc.stderr
    files = sorted(p.name for p in one.glob("*.tsv"))
    assert len(files) == 2 * 4 and files == sorted(p.name for p in ranks.glob("*.tsv"))
    for name in files:
        assert_rows_spread(one / name)
        assert rows_without_time(ranks / name) == rows_without_time(one / name), name
    assert (ranks / "index.json").read_text() == (one / "index.json").read_text()
    assert not list(tmp_path.glob("*.shard-*"))


@pytest.mark.slow
def test_a_rank_killed_mid_look_is_replaced_by_torchruns_max_restarts(tmp_path, tiny_cli_args):
    """`--max-restarts 1`: rank 1 SIGKILLed at its fifth merge of counts (a sequential run's look), torchrun starts
    both ranks again, they resume from rank 0's rows and finish with one process's rows, exit 0, no person."""
    args = ["certify", *tiny_cli_args, "--method", "rs", "--sequential", "--radii", "0.1,0.2,0.3",
            "--num-samples", "2000", "--batch", "50", "--threads", "1", "--quiet"]
    whole, restarted = tmp_path / "whole.tsv", tmp_path / "restarted.tsv"
    invoke([*args, "--out", whole])
    proc = _torchrun(2, args, restarted, "--max-restarts", "1", launch=(str(PACED_CLI),),
                     env={"DIFFSMOOTH_TEST_KILL_AT_MERGE": "1:5"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"exitcode\s*:\s*-9", proc.stderr), proc.stderr[-3000:]         # the kill happened
    assert proc.stderr.count("the 2 ranks shared every image's samples") == 2      # the restarted attempt's ranks
    assert_rows_spread(whole)
    assert rows_without_time(restarted) == rows_without_time(whole)
    assert len({r["samples"] for r in read_rows(whole)}) >= 2        # images stopped at different looks


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

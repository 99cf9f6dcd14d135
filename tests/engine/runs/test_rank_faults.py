"""Ranks that prove they agree, on real gloo ranks under torchrun (tests/paced_cli.py plants each fault on one
rank): a rank with another data file, checkpoint or method setting is refused on every rank with one line and no
row is written; a rank that raises (in its run, or before it) or hangs ends every rank within the rank timeout with
a line naming it; a SIGTERM on one rank stops every rank with exit 143 and torchrun's --max-restarts does not start
them again, after which the same command finishes with one process's rows; 3 ranks, one killed, then 2 ranks give
one process's rows. The rendezvous rounds of one store get prefixes of their own (RoundPrefix)."""

import datetime
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import assert_rows_spread, rows_without_time
from cli_helpers import invoke_ok as invoke

from diffsmooth.engine.runs.results import read_rows

PACED_CLI = Path(__file__).resolve().parents[2] / "paced_cli.py"


def _port() -> int:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        return free.getsockname()[1]


def _torchrun(ranks: int, args, out, *extra: str, env=None, timeout=300):
    """`args` on `ranks` gloo ranks through tests/paced_cli.py (its plants from `env`); (process, seconds)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks), "--master_port", str(_port()),
           *extra, str(PACED_CLI), *[str(a) for a in args], "--out", str(out)]
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, OMP_NUM_THREADS="1", **(env or {})))
    return proc, time.perf_counter() - started


def _errors(stderr: str) -> list:
    """The `error: ...` lines the ranks printed (torchrun prefixes none with --no-python off)."""
    return [line[line.index("error: "):] for line in stderr.splitlines() if "error: " in line]


def _args(tiny_cli_args, *more):
    return ["certify", *tiny_cli_args, "--method", "rs", "--n0", "8", "--num-samples", "120", "--batch", "16",
            "--threads", "1", "--quiet", *more]


@pytest.fixture(scope="module")
def flipped_data(tmp_path_factory, tiny_models):
    """The tiny data with every image mirrored: another copy of the data on one node, same indices and labels."""
    held = np.load(tiny_models["data"])
    path = tmp_path_factory.mktemp("flipped") / "data.npz"
    np.savez(path, images=held["images"][..., ::-1], labels=held["labels"])
    return path


@pytest.mark.slow
@pytest.mark.parametrize("option,says", [("--data", "the image's pixels (image 0: rank 0 vs rank 1)"),
                                         ("--classifier", "the model weights (rank 0 vs rank 1)"),
                                         ("--num-local", "the settings")])
def test_a_rank_with_other_data_weights_or_setting_is_refused_on_every_rank_and_writes_no_row(
        tmp_path, tiny_models, tiny_cli_args, flipped_data, option, says):
    other = {"--data": flipped_data, "--classifier": tiny_models["classifier_b"], "--num-local": "5"}[option]
    args = _args(tiny_cli_args, "--method", "diffsmooth", "--local-sigma", "0.12", "--num-local", "3")
    args = [a for k, a in enumerate(args) if not (a == "rs" or (a == "--method" and args[k + 1] == "rs"))]
    out = tmp_path / "ranks.tsv"
    proc, _ = _torchrun(2, args, out, env={"DIFFSMOOTH_TEST_OPTION_ON_RANK": f"1:{option}={other}"})
    assert proc.returncode != 0
    lines = [line for line in _errors(proc.stderr) if "the ranks differ" in line]
    assert len(lines) == 2 and lines[0] == lines[1], proc.stderr[-3000:]        # the same line on both ranks
    assert says in lines[0], lines[0]
    assert not out.exists() or read_rows(out) == []


@pytest.mark.slow
@pytest.mark.parametrize("plant,says", [
    ({"DIFFSMOOTH_TEST_RAISE_AT": "1:3"}, "rank 1 failed (RuntimeError: planted failure on this rank)"),
    ({"DIFFSMOOTH_TEST_RAISE_AT": "1:0"}, "rank 1 failed: RuntimeError: planted failure before the run"),
    ({"DIFFSMOOTH_TEST_HANG_AT": "1:3"}, "a rank did not answer within the rank timeout (8 s"),
])
def test_a_rank_that_raises_or_hangs_ends_every_rank_within_the_rank_timeout(tmp_path, tiny_cli_args, plant, says):
    proc, seconds = _torchrun(2, _args(tiny_cli_args), tmp_path / "ranks.tsv",
                              env=dict(plant, DIFFSMOOTH_RANK_TIMEOUT_S="8"), timeout=240)
    assert proc.returncode != 0
    assert any(says in line for line in _errors(proc.stderr)), proc.stderr[-3000:]
    assert "Traceback" not in "\n".join(line for line in proc.stderr.splitlines() if "error:" in line)
    assert seconds < 90, seconds                   # start-up, the plant's batch, the 8 s timeout: not 7 days


def _sequential_alone(tmp_path, tiny_cli_args):
    """A sequential run's arguments and its rows in one process (votes spread, images stopping at various looks)."""
    args = _args(tiny_cli_args, "--sequential", "--radii", "0.1,0.2,0.3")
    args[args.index("120")] = "2000"
    whole = tmp_path / "whole.tsv"
    invoke([*args, "--out", whole])
    assert_rows_spread(whole)
    return args, whole


@pytest.mark.slow
def test_a_sigterm_on_one_rank_stops_every_rank_and_torchrun_does_not_restart_them(tmp_path, tiny_cli_args):
    args, whole = _sequential_alone(tmp_path, tiny_cli_args)
    ranks = tmp_path / "ranks.tsv"
    proc, _ = _torchrun(2, args, ranks, "--max-restarts", "2", env={"DIFFSMOOTH_TEST_TERM_AT": "1:6"})
    assert proc.returncode != 0
    stopped = [line for line in proc.stderr.splitlines() if "terminated (SIGTERM)" in line]
    assert len(stopped) == 2, proc.stderr[-3000:]                       # both ranks, once
    kept = len(read_rows(ranks)) if ranks.exists() else 0
    assert kept < len(read_rows(whole))         # a restarted attempt (no plant) would have finished the rows
    proc, _ = _torchrun(2, args, ranks)                                  # the same command again finishes the run
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert rows_without_time(ranks) == rows_without_time(whole)


@pytest.mark.slow
def test_three_ranks_one_killed_then_two_ranks_give_one_processes_rows(tmp_path, tiny_cli_args):
    args, whole = _sequential_alone(tmp_path, tiny_cli_args)
    ranks = tmp_path / "ranks.tsv"
    proc, _ = _torchrun(3, args, ranks, env={"DIFFSMOOTH_TEST_KILL_AT_MERGE": "1:8"})
    assert proc.returncode != 0 and re.search(r"exitcode\s*:\s*-9", proc.stderr), proc.stderr[-3000:]
    assert (len(read_rows(ranks)) if ranks.exists() else 0) < len(read_rows(whole))
    proc, _ = _torchrun(2, args, ranks)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert rows_without_time(ranks) == rows_without_time(whole)


def test_each_rendezvous_round_of_one_store_joins_under_a_prefix_of_its_own(monkeypatch):
    """Round 1: 3 ranks, rank 2 dies before it asks (its ticket never comes); round 2: 2 ranks on the same store; round
    3: 3 ranks again at the same restart count. Each round's ranks agree on one prefix, and no two rounds share one."""
    import torch.distributed as dist

    from diffsmooth.engine.runs.sharding import RoundPrefix
    port = _port()
    host = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=datetime.timedelta(seconds=30),
                         wait_for_workers=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))

    def round_of(world: int, dead=()):
        got, rounds = {}, []
        stands = threading.Barrier(world - len(dead), timeout=30)    # the group stands once every rank has its prefix

        def join(rank):
            with RoundPrefix(rank, world) as prefix:
                got[rank] = prefix
                stands.wait()
        for rank in range(world):
            if rank not in dead:
                rounds.append(threading.Thread(target=join, args=(rank,)))
        [t.start() for t in rounds]
        [t.join(timeout=40) for t in rounds]
        assert len(got) == world - len(dead)
        return got
    first = round_of(3, dead={2})
    # rank 2 of the first round asked after its rank 0 had died: a ticket no one answered, left in the store
    host.set(f"diffsmooth/ticket/{host.add('diffsmooth/tickets', 1)}", "stale-token")
    second = round_of(2)
    third = round_of(3)
    assert len(set(first.values())) == 1 and len(set(second.values())) == 1 and len(set(third.values())) == 1
    assert len({*first.values(), *second.values(), *third.values()}) == 3
    del host

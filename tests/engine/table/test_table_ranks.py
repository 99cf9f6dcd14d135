"""`diffsmooth table` under torchrun (gloo on the CPU): the folder of an N-rank table equals a one-process
table's (every result file's rows, row states and settings, race.json, plan.json, table.md, the samples, the
shared passes); a rank killed mid-extension and the table started again give the same folder, as do rank files
an earlier release's ranks left behind (with a row planted in two of them); ranks that see different specs, or
a refusal on rank 0, stop every rank with one line.

Two tables keep this cheap: the demo's two lines that denoise on 2 ranks (its race has extensions of several
images, DDS and DiffSmooth share one pass at each sigma), and a small RS spec on 3 ranks (tests/data/table_ranks/:
no UNet, two sigmas, 7 images split unevenly)."""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch.multiprocessing as mp

from diffsmooth.engine.demo import shipped as demo_assets
from diffsmooth.engine.errors import UserError

needs_demo = pytest.mark.skipif(not demo_assets.DEMO_UNET.exists(), reason="embedded demo models not shipped")

# the demo table's lines that denoise: its race extends several images at a time (a rank can be killed while its
# pass is unfinished), and DDS + DiffSmooth share one pass at each sigma. (A two-sigma spec of the same lines costs
# about half as much but its extensions hold 1-3 images, too few to catch a pass unfinished on both ranks.)
DEMO = ["table", "--demo", "--rows", "dds,diffsmooth", "--images", "5", "--n-max", "150", "--threads", "1", "--quiet"]
RS_SPEC = Path(__file__).resolve().parents[2] / "data" / "table_ranks" / "rs.toml"
# RS, two sigmas, 7 images, n-max 200: no UNet, extensions of several images (over 3 ranks: uneven shares)
RS = ["table", str(RS_SPEC), "--quiet"]
ONE_PASS = "one pass: the denoiser runs once per batch"       # each rank logs it as a shared pass starts


def _port() -> int:
    return 29000 + (os.getpid() * 7 + int(time.time() * 1000)) % 900


PACED_CLI = Path(__file__).resolve().parents[2] / "paced_cli.py"   # plants a rank's death (tests/paced_cli.py)


def _torchrun(ranks: int, out: Path, *extra: str, table=DEMO, paced: bool = False) -> list:
    launch = [str(PACED_CLI)] if paced else ["-m", "diffsmooth.cli"]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks), "--master_port", str(_port()),
            *extra, *launch, *table, "--out", str(out)]


def _env() -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1")


def _folder(out: Path) -> dict:
    """What a table folder holds, rows by index without the time column, lock files aside."""
    held = {}
    for path in sorted(p for p in (out / "runs").rglob("*") if p.is_file() and not p.name.endswith(".lock")):
        name = str(path.relative_to(out))
        lines = path.read_text().splitlines()
        if path.suffix == ".tsv":
            header = lines[0].split("\t")
            keep = [k for k, column in enumerate(header) if column != "time"]
            held[name] = [lines[0]] + sorted("\t".join(line.split("\t")[k] for k in keep) for line in lines[1:])
        elif path.name.endswith(".states.jsonl"):
            held[name] = sorted(lines)
        else:
            held[name] = lines
    for name in ("race.json", "plan.json", "table.md", "table_by_config.md"):
        held[name] = (out / name).read_text()
    summary = json.loads((out / "summary.json").read_text())
    held["samples"] = summary["samples"]
    held["shared_passes"] = summary["shared_passes"]
    return held


def _one_process(out: Path, table: list) -> dict:
    """The table in this process, its folder; its votes spread (equal folders say something) and its race extends."""
    from cli_helpers import invoke_ok
    invoke_ok([*table, "--out", out])
    held = _folder(out)
    predictions = {row.split("\t")[2] for name, rows in held.items() if name.endswith(".tsv") for row in rows[1:]}
    assert len(predictions - {"-1"}) >= 3, predictions
    assert any("_at" in name for name in held), sorted(held)
    return held


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    held = _one_process(tmp_path_factory.mktemp("one") / "t", DEMO)
    assert held["shared_passes"] > 0                # DDS + DiffSmooth shared their pilots' and first runs' passes
    return held


def _no_rank_files(out: Path) -> None:
    assert not list((out / "runs").glob("*.shard-*")), "rank files left behind"


def _rerun(ranks: int, out: Path, table=DEMO) -> dict:
    """The table on `ranks` gloo ranks into `out` (again); its folder."""
    proc = subprocess.run(_torchrun(ranks, out, table=table), capture_output=True, text=True, timeout=900, env=_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    _no_rank_files(out)
    return _folder(out)


@pytest.fixture(scope="module")
def rs_one_process(tmp_path_factory):
    return _one_process(tmp_path_factory.mktemp("rs") / "one", RS)


@needs_demo
@pytest.mark.slow
def test_a_table_on_three_gloo_ranks_equals_one_process(rs_one_process, tmp_path):
    whole = rs_one_process
    # the ranks' shares are uneven: some pass holds a number of images that 3 does not divide
    assert any((len(rows) - 1) % 3 for name, rows in whole.items() if name.endswith(".tsv")), sorted(whole)
    assert _rerun(3, tmp_path / "t", RS) == whole


@needs_demo
@pytest.mark.slow
def test_a_sigterm_on_one_rank_mid_table_stops_every_rank_unrestarted_and_a_rerun_gives_one_processes_folder(
        rs_one_process, tmp_path):
    """SIGTERM reaches rank 1 alone at its 4th meeting, under `--max-restarts 1`: every rank stops at the next
    meeting with exit 130, torchrun starts nothing again (a restarted attempt, unplanted, would finish and exit 0);
    the same command again finishes with one process's folder."""
    out = tmp_path / "t"
    proc = subprocess.run(_torchrun(2, out, "--max-restarts", "1", table=RS, paced=True), capture_output=True,
                          text=True, timeout=900, env=dict(_env(), DIFFSMOOTH_TEST_TERM_AT="1:4"))
    assert proc.returncode != 0
    assert proc.stderr.count("stopped by SIGTERM") == 2, proc.stderr[-3000:]         # both ranks, once each
    assert _rerun(2, out, RS) == rs_one_process


def _extension_with_rows(out: Path) -> Path:
    """The last extension file (race.json; the last line's) with two rows or more: one whose ranks each wrote rows."""
    from diffsmooth.engine.table.phases import phase_path
    from diffsmooth.engine.table.spec import demo_spec
    race = json.loads((out / "race.json").read_text())
    for line in reversed(demo_spec(("dds", "diffsmooth")).lines):
        for step in reversed(race[line.name]["extensions"]):
            path = phase_path(out, line, step["sigma"], step["kind"])
            if len(path.read_text().splitlines()) >= 3:
                return path
    raise AssertionError("no extension ran on two images or more")

def _unmerge(merged: Path, ranks: int) -> None:
    """Split a merged result file and its row states over rank files, as an earlier release's ranks left them
    before their merge, its first row in every rank file (a planted duplicate)."""
    from diffsmooth.engine.runs.results import shard_path
    assert merged.is_file(), sorted(p.name for p in merged.parent.iterdir())
    header, *rows = merged.read_text().splitlines()
    states = Path(f"{merged}.states.jsonl")
    held = states.read_text().splitlines() if states.exists() else []
    assert len(rows) >= 2, rows
    for k in range(ranks):
        part = shard_path(merged, k, ranks)
        part.write_text("\n".join([header, *rows[k::ranks], *rows[:1] * (k > 0)]) + "\n")
        if held:
            Path(f"{part}.states.jsonl").write_text("\n".join([*held[k::ranks], *held[:1] * (k > 0)]) + "\n")
    merged.unlink()
    states.unlink(missing_ok=True)


@needs_demo
@pytest.mark.slow
def test_a_table_on_two_gloo_ranks_with_a_rank_killed_mid_extension_finishes_under_max_restarts(one_process, tmp_path):
    """`torchrun --max-restarts 1`: rank 1 SIGKILLed at a meeting while a race extension is unfinished (its file
    holds fewer rows than it ends with); torchrun starts both ranks again, the table goes on from its rows and ends
    with exit 0 and one process's folder. Then an extension's rows left in rank files by an earlier release's
    ranks, one row in two of them (a planted duplicate), started again: the same folder, every row once."""
    out = tmp_path / "t"
    proc = subprocess.run(_torchrun(2, out, "--max-restarts", "1", paced=True), capture_output=True, text=True,
                          timeout=900, env=dict(_env(), DIFFSMOOTH_TEST_KILL_IN_EXTENSION="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"exitcode\s*:\s*-9", proc.stderr), proc.stderr[-3000:]        # the kill happened
    killed = json.loads((tmp_path / "killed.json").read_text())
    whole = dict(one_process)
    assert killed["rows"] < len(whole[f"runs/{killed['file']}"]) - 1, killed      # mid-extension
    _no_rank_files(out)
    restarted = _folder(out)
    # the ranks shared the passes one process shares, every one before the kill (the first runs precede the
    # race's extensions): each of the 2 ranks logged each in the first attempt, and the restart had none left
    assert proc.stderr.count(ONE_PASS) == 2 * whole["shared_passes"], proc.stderr[-3000:]
    assert restarted.pop("shared_passes") == 0
    whole.pop("shared_passes")
    assert restarted == whole
    _unmerge(_extension_with_rows(out), 2)
    resumed = _rerun(2, out)
    resumed.pop("shared_passes")
    assert resumed == whole


def _rank(rank: int, world: int, init: str, results):
    import torch.distributed as dist

    from diffsmooth.engine.runs.sharding import ProcessShare
    from diffsmooth.engine.table.ranks import Ranks
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    ranks = Ranks(ProcessShare(rank, world, True))
    got = []
    try:
        ranks.same("spec", "abc")               # alike: nothing to say
        got.append("same ok")
    except UserError as exc:
        got.append(str(exc))
    try:
        ranks.same("spec", "abc" if rank == 0 else "xyz")
        got.append("no error")
    except UserError as exc:
        got.append(str(exc))

    def refuse():
        raise UserError("DIR holds a table with another spec")
    try:
        ranks.agree(refuse)
        got.append("no error")
    except UserError as exc:
        got.append(str(exc))
    got.append(ranks.agree(lambda: {"written by": rank}))
    results[rank] = got
    dist.destroy_process_group()


def test_ranks_agree_on_refusals_and_see_a_different_spec(tmp_path):
    """Every rank raises the same one-line UserError when the ranks' specs differ or rank 0 refuses (a rank
    left waiting would hang the job); rank 0's result reaches every rank."""
    world, results = 3, mp.Manager().dict()
    mp.spawn(_rank, args=(world, f"file://{tmp_path / 'store'}", results), nprocs=world)
    for rank in range(world):
        same, different, refused, written = results[rank]
        assert same == "same ok"
        assert "the ranks see different spec (rank 0: abc; another: xyz)" in different and "\n" not in different
        assert refused == "DIR holds a table with another spec"
        assert written == {"written by": 0}


def test_a_dry_run_estimates_the_table_on_ranks(tmp_path):
    """--dry-run --ranks N: the predicted minutes on N ranks (each run's samples split, one batch per rank past its
    images' stops); --ranks without --dry-run is refused with one line (under torchrun the ranks are torchrun's)."""
    from click.testing import CliRunner

    from diffsmooth.cli import main
    from diffsmooth.engine.table.cost import on_ranks
    costs = {"predicted": {"seconds": 960.0}, "runs": {"a": {"seconds": 960.0, "samples": 500 * 30_000}}}
    line = on_ranks(costs, 8, 500, 2000)
    assert "about 2.0 min of compute for what one process does in 16.0 min (8.0x" in line, line
    few = {"predicted": {"seconds": 960.0}, "runs": {"a": {"seconds": 960.0, "samples": 2 * 30_000}}}
    assert "(6.3x" in on_ranks(few, 8, 2, 2000)      # two images: the batch computed past their stops shows
    assert "no estimate" in on_ranks({"predicted": {"seconds": None}}, 8, 500, 2000)
    result = CliRunner().invoke(main, ["table", "--demo", "--ranks", "2", "--out", str(tmp_path / "t")])
    assert result.exit_code == 2 and "--ranks belongs to --dry-run" in result.output


def test_a_rank_that_cannot_reach_the_store_says_so_in_one_line(tmp_path):
    """A rank whose MASTER_ADDR:MASTER_PORT has no store stops with one line and exit 2 within the connect
    timeout (init_process_group alone would wait out its 7-day timeout), having written nothing."""
    import socket
    with socket.socket() as s:                  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(_env(), WORLD_SIZE="2", RANK="1", LOCAL_RANK="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               DIFFSMOOTH_STORE_CONNECT_S="1")
    out = tmp_path / "t"
    proc = subprocess.run([sys.executable, "-m", "diffsmooth.cli", *DEMO, "--out", str(out)], capture_output=True,
                          text=True, timeout=120, env=env)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert lines[0].startswith("error: torchrun rank 1 cannot reach the process group's store at 127.0.0.1:")
    assert not out.exists()

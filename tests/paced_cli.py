"""`python tests/paced_cli.py ARGS`: `diffsmooth ARGS` with a rank's death planted (nothing else changes), in
torchrun's first attempt only, so `--max-restarts` has a rank to replace:

- DIFFSMOOTH_TEST_KILL_AT_MERGE=R:N: torchrun's rank R SIGKILLs itself as it reaches its N-th meeting with the
  other ranks (once per batch: in the middle of a look, its samples computed, not handed in).
- DIFFSMOOTH_TEST_KILL_IN_EXTENSION=R: rank R SIGKILLs itself at its first meeting after a race extension's file
  (`runs/*_at*.tsv` under `--out`) holds a row, having written `killed.json` beside `--out` (the file and its
  rows then), so a test can check that the pass was unfinished.
- DIFFSMOOTH_TEST_RAISE_AT=R:N: rank R raises RuntimeError at its N-th batch (0: before its run's first meeting).
- DIFFSMOOTH_TEST_HANG_AT=R:N: rank R sleeps for an hour as it reaches its N-th meeting.
- DIFFSMOOTH_TEST_TERM_AT=R:N: rank R sends itself SIGTERM as it reaches its N-th meeting.
- DIFFSMOOTH_TEST_OPTION_ON_RANK=R:--option=value: rank R runs with that option's value instead (another data
  file, checkpoint or setting on one node)."""

import json
import os
import signal
import sys
import time
from pathlib import Path

from diffsmooth.cli.group import main
from diffsmooth.engine.certify import blocks, scheduler

_step = blocks.SampleBlocks.step
AT_MERGE = os.environ.get("DIFFSMOOTH_TEST_KILL_AT_MERGE")
IN_EXTENSION = os.environ.get("DIFFSMOOTH_TEST_KILL_IN_EXTENSION")
RAISE_AT = os.environ.get("DIFFSMOOTH_TEST_RAISE_AT")
HANG_AT = os.environ.get("DIFFSMOOTH_TEST_HANG_AT")
TERM_AT = os.environ.get("DIFFSMOOTH_TEST_TERM_AT")
OPTION_ON_RANK = os.environ.get("DIFFSMOOTH_TEST_OPTION_ON_RANK")
meetings = [0]
batches = [0]
_batch = scheduler.Scheduler._step
_run_shared = scheduler.Scheduler._run_shared


def _at(planted, rank: int, count: int) -> bool:
    """Whether `planted` ("R:N") names this rank and count, in torchrun's first attempt."""
    if not planted or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return False
    r, n = (int(v) for v in planted.split(":"))
    return r == rank and n == count


def _failing_batch(self, *args):
    if self.blocks is None:             # a run in one process: no meeting to fail at
        return _batch(self, *args)
    batches[0] += 1
    if _at(RAISE_AT, self.blocks.rank, batches[0]):
        raise RuntimeError("planted failure on this rank")
    return _batch(self, *args)


def _failing_run(self, *args):
    if _at(RAISE_AT, self.blocks.rank, 0):
        raise RuntimeError("planted failure before the run")
    return _run_shared(self, *args)


scheduler.Scheduler._step = _failing_batch
scheduler.Scheduler._run_shared = _failing_run
if OPTION_ON_RANK and os.environ.get("RANK") == OPTION_ON_RANK.split(":", 1)[0]:
    option, value = OPTION_ON_RANK.split(":", 1)[1].split("=", 1)
    sys.argv[sys.argv.index(option) + 1] = value


def _out() -> Path:
    return Path(sys.argv[sys.argv.index("--out") + 1])


def _extension_with_rows():
    for path in sorted((_out() / "runs").glob("*_at*.tsv")):
        rows = len(path.read_text().splitlines()) - 1
        if rows > 0:
            return path, rows
    return None


def _fatal_step(self, *args):
    meetings[0] += 1
    if _at(HANG_AT, self.rank, meetings[0]):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)       # torchrun's agent ends it at once once the others exit
        time.sleep(3600)
    if _at(TERM_AT, self.rank, meetings[0]):
        os.kill(os.getpid(), signal.SIGTERM)
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    if first_attempt and AT_MERGE:
        rank, at = (int(v) for v in AT_MERGE.split(":"))
        if self.rank == rank and meetings[0] == at:
            os.kill(os.getpid(), signal.SIGKILL)
    if first_attempt and IN_EXTENSION and self.rank == int(IN_EXTENSION):
        found = _extension_with_rows()
        if found:
            path, rows = found
            (_out().parent / "killed.json").write_text(json.dumps({"file": path.name, "rows": rows}))
            os.kill(os.getpid(), signal.SIGKILL)
    return _step(self, *args)


blocks.SampleBlocks.step = _fatal_step

if __name__ == "__main__":
    sys.exit(main())

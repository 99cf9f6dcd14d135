"""`python tests/paced_cli.py ARGS`: `diffsmooth ARGS` with two faults a test can plant (nothing else changes).

- The writer pauses after each row it writes to a race extension's file (`*_at*.tsv`), so a watcher sees such a
  pass unfinished however fast the machine (tests/engine/table/test_table_ranks.py kills a rank there; the other
  ranks wait at the next look's merge). The pause is DIFFSMOOTH_TEST_ROW_PAUSE seconds (default 0.5, 25 times the
  watcher's poll).
- DIFFSMOOTH_TEST_KILL_AT_MERGE=R:N: torchrun's rank R SIGKILLs itself as it reaches its N-th meeting with the
  other ranks (once per batch: in the middle of a look, its samples computed, not handed in), in torchrun's first
  attempt only, so `--max-restarts` has a rank to replace."""

import os
import signal
import sys
import time

from diffsmooth.cli.group import main
from diffsmooth.engine.certify import blocks
from diffsmooth.engine.runs import results

_write = results.ResultWriter.write
_step = blocks.SampleBlocks.step
PAUSE = float(os.environ.get("DIFFSMOOTH_TEST_ROW_PAUSE", "0.5"))
KILL = os.environ.get("DIFFSMOOTH_TEST_KILL_AT_MERGE")
merges = [0]


def _paced_write(self, **row) -> None:
    _write(self, **row)
    if "_at" in self.path.name:
        time.sleep(PAUSE)


def _fatal_step(self, *args):
    rank, at = (int(v) for v in KILL.split(":"))
    merges[0] += 1
    if self.rank == rank and merges[0] == at and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
        os.kill(os.getpid(), signal.SIGKILL)
    return _step(self, *args)


results.ResultWriter.write = _paced_write
if KILL:
    blocks.SampleBlocks.step = _fatal_step

if __name__ == "__main__":
    sys.exit(main())

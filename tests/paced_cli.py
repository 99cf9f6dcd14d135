"""`python tests/paced_cli.py ARGS`: `diffsmooth ARGS` with a rank's death planted (nothing else changes), in
torchrun's first attempt only, so `--max-restarts` has a rank to replace:

- DIFFSMOOTH_TEST_KILL_AT_MERGE=R:N: torchrun's rank R SIGKILLs itself as it reaches its N-th meeting with the
  other ranks (once per batch: in the middle of a look, its samples computed, not handed in).
- DIFFSMOOTH_TEST_KILL_IN_EXTENSION=R: rank R SIGKILLs itself at its first meeting after a race extension's file
  (`runs/*_at*.tsv` under `--out`) holds a row, having written `killed.json` beside `--out` (the file and its
  rows then), so a test can check that the pass was unfinished."""

import json
import os
import signal
import sys
from pathlib import Path

from diffsmooth.cli.group import main
from diffsmooth.engine.certify import blocks

_step = blocks.SampleBlocks.step
AT_MERGE = os.environ.get("DIFFSMOOTH_TEST_KILL_AT_MERGE")
IN_EXTENSION = os.environ.get("DIFFSMOOTH_TEST_KILL_IN_EXTENSION")
meetings = [0]


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

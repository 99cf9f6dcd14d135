"""`python tests/paced_cli.py ARGS`: `diffsmooth ARGS` whose ranks pause after each row they write to a race
extension's rank file (`*_at*.shard-*.tsv`), so a watcher sees such a pass unfinished on every rank however fast
the machine (tests/engine/table/test_table_ranks.py kills a rank there). The pause is DIFFSMOOTH_TEST_ROW_PAUSE
seconds (default 0.5, 25 times the watcher's poll); nothing else changes."""

import os
import sys
import time

from diffsmooth.cli.group import main
from diffsmooth.engine.runs import results

_write = results.ResultWriter.write
PAUSE = float(os.environ.get("DIFFSMOOTH_TEST_ROW_PAUSE", "0.5"))


def _paced_write(self, **row) -> None:
    _write(self, **row)
    if "_at" in self.path.name and ".shard-" in self.path.name:
        time.sleep(PAUSE)


results.ResultWriter.write = _paced_write

if __name__ == "__main__":
    sys.exit(main())

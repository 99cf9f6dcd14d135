"""The same `diffsmooth table` command with the race's extensions rerun from the first sample (as before
rows kept their states): LineRace.starts gives no state, so every extension starts each image afresh.

    python -m studies.table_rerun_from_first_sample table --demo --rows rs ... --out rerun

The command line runs as a child process, `python -c CHILD ARGS...`: CHILD patches the race, then runs
the command line as `python -m diffsmooth.cli` would; this study imports nothing of diffsmooth."""

import subprocess
import sys

CHILD = """
import runpy, sys

from diffsmooth.engine.table.race_build import LineRace

LineRace.starts = lambda self, sigma, radii, images: {}
sys.argv = ["diffsmooth", *sys.argv[1:]]
runpy.run_module("diffsmooth.cli", run_name="__main__")
"""

if __name__ == "__main__":
    sys.exit(subprocess.run([sys.executable, "-c", CHILD, *sys.argv[1:]]).returncode)

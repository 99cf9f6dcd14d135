"""The same `diffsmooth table` command with the race's extensions rerun from the first sample (as before
rows kept their states): LineRace.starts gives no state, so every extension starts each image afresh.

    python rerun_from_first_sample.py table --demo --rows rs ... --out rerun
"""

import sys

from diffsmooth.cli import main
from diffsmooth.engine.table.race_build import LineRace

LineRace.starts = lambda self, sigma, radii, images: {}
sys.exit(main(sys.argv[1:]))

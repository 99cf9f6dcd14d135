"""`python -m diffsmooth.cli ...` (what torchrun launches)."""

import sys

from diffsmooth.cli.group import main

if __name__ == "__main__":
    sys.exit(main())

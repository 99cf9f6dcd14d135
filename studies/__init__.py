"""One-off studies: simulations, measurements and analyses behind the docs' numbers (studies/README.md).

Not part of the installed package: run them from the repository root as `python -m studies.NAME`. They
import the engine as `diffsmooth.engine...` and each other as `studies.NAME`; nothing installed imports them.
"""

"""The `diffsmooth` command line: one module per command, loaded when that command is used."""

from diffsmooth.cli.group import main

__all__ = ["main"]

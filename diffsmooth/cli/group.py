"""The top-level `diffsmooth` group: a table of commands imported only when used, and one-line errors.

Every user-fixable problem (UserError) prints one line `error: ...` and exits with code 2; so does
a command whose module cannot be imported (a missing optional package), instead of vanishing.
"""

from __future__ import annotations

import importlib
import re
from typing import NamedTuple

import click
from click.utils import make_default_short_help

from diffsmooth.engine.errors import UserError, first_line


class Command(NamedTuple):
    """Where a command lives and the first sentence of its help (`diffsmooth --help` lists it unimported)."""

    module: str
    attribute: str
    short_help: str


COMMANDS = {
    "analyze": Command("diffsmooth.cli.analyze", "analyze",
                       "Certified accuracy at radii and ACR for result TSVs (either time format)."),
    "bench": Command("diffsmooth.cli.bench", "bench", "Time certification per image, stage by stage; "
                     "FLOP/s vs peak; engine vs reference-equivalent."),
    "build-engine": Command("diffsmooth.cli.build_engine", "build_engine", "Build (or reuse cached) TensorRT "
                            "plans of the graphs in --onnx-dir, inspect and validate them."),
    "certify": Command("diffsmooth.cli.certify", "certify", "CERTIFY each selected image; one TSV row per image "
                       "(idx label predict radius correct time)."),
    "demo": Command("diffsmooth.cli.demo", "demo", "Certify K shipped Fashion-MNIST images with rs, dds and "
                    "diffsmooth on the embedded models."),
    "env": Command("diffsmooth.cli.env", "env", "Versions, hardware and optional runtimes, for bug reports."),
    "export": Command("diffsmooth.cli.export", "export", "Export the denoiser (at --sigma) and the classifier "
                      "head to ONNX, validated against torch."),
    "merge": Command("diffsmooth.cli.merge", "merge", "Merge shard TSVs into OUT: sorted by idx, every index "
                     "once (conflicting rows are refused)."),
    "predict": Command("diffsmooth.cli.certify", "predict", "PREDICT each selected image (abstain = -1); "
                       "TSV rows idx label predict correct time."),
    "purify": Command("diffsmooth.cli.purify", "purify", "PNG grid: clean / noisy / one-shot denoised / "
                      "locally smoothed images (the paper's figure)."),
    "train-demo": Command("diffsmooth.cli.train_demo", "train_demo", "Train the embedded demo denoiser and "
                          "classifiers on Fashion-MNIST (CPU, fixed seeds)."),
    "validate": Command("diffsmooth.cli.validate", "validate", "Re-run torch vs ONNX Runtime on every graph "
                        "in --onnx-dir; results go into the manifests."),
}


class CLIError(click.ClickException):
    """One `error: ...` line on stderr, exit code 2."""

    exit_code = 2

    def show(self, file=None):
        click.echo(f"error: {self.message}", err=True)


def _unavailable(name: str, entry: Command, exc: ImportError) -> click.Command:
    """A stand-in that says why the command cannot run, whatever its arguments."""
    message = f"`diffsmooth {name}` is unavailable: importing {entry.module} failed ({first_line(exc)})"

    def fail(**_):
        raise CLIError(message)
    return click.Command(name, callback=fail, help=message, short_help=entry.short_help,
                         context_settings={"ignore_unknown_options": True, "allow_extra_args": True,
                                           "help_option_names": []})


def as_flags(message: str, command: click.Command | None) -> str:
    """Engine messages name settings as `name`; where the command has that option, show its flag."""
    if command is None:
        return message
    flags = {p.name: p.opts[0] for p in command.params if isinstance(p, click.Option)}
    return re.sub(r"`([a-z_][a-z0-9_]*)`", lambda m: flags.get(m.group(1), m.group(0)), message)


class LazyGroup(click.Group):
    """Loads a command's module when the command is used; maps UserError (and a few OS errors) to CLIError."""

    def list_commands(self, ctx):
        return sorted(COMMANDS)

    def get_command(self, ctx, name):
        entry = COMMANDS.get(name)
        if entry is None:
            return None
        try:
            module = importlib.import_module(entry.module)
        except ImportError as exc:
            return _unavailable(name, entry, exc)
        return getattr(module, entry.attribute)

    def format_commands(self, ctx, formatter):
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(len(name) for name in names)
        rows = [(name, make_default_short_help(COMMANDS[name].short_help, limit)) for name in names]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except UserError as exc:
            command = self.get_command(ctx, ctx.invoked_subcommand) if ctx.invoked_subcommand else None
            raise CLIError(as_flags(str(exc), command)) from None
        except (FileNotFoundError, IsADirectoryError, PermissionError) as exc:
            raise CLIError(f"{exc.strerror}: {exc.filename}") from None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="diffsmooth-engine")
def main():
    """DiffSmooth certification: diffusion denoiser + local smoothing, certified with CERTIFY."""

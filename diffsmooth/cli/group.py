"""The top-level `diffsmooth` group: a table of commands imported only when used, and one-line errors.

Every user-fixable problem (UserError) prints one line `error: ...` and exits with code 2; so do
click's own usage errors (a value that is not a number, out of range, a missing or unknown option),
running out of memory or disk, and a command whose module cannot be imported (a missing optional
package), instead of vanishing.
"""

from __future__ import annotations

import errno
import importlib
import re
import sys
from typing import NamedTuple

import click
from click.utils import make_default_short_help

from diffsmooth.engine.errors import Terminated, UserError, first_line
from diffsmooth.engine.host_memory import keep_freed_memory

TERMINATED_EXIT = 143                           # 128 + SIGTERM, as a shell reports a process SIGTERM ended
SETUP_EXIT = 3          # --strict: the set-up is wrong (a preflight finding), told apart from a bad invocation (2)


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
                            "engine files of the graphs in --onnx-dir, inspect and validate them."),
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
    "preflight": Command("diffsmooth.cli.preflight", "preflight", "Check the set-up on a small sample before any "
                         "certificate: data, accuracies, normalisation, labels, denoiser."),
    "purify": Command("diffsmooth.cli.purify", "purify", "PNG grid: clean / noisy / one-shot denoised / "
                      "locally smoothed images (the paper's figure)."),
    "serve": Command("diffsmooth.cli.serve", "serve", "Serve certified predictions over the Open Inference "
                     "Protocol (KServe v2) on HTTP."),
    "table": Command("diffsmooth.cli.table", "table", "The paper's table in one command: which sigma settles "
                     "which radius, the cost first, table.md/tex, curves.png."),
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


# `diffsmooth` alone prints the help (click >= 8.2 raises this UsageError for it): not an error line
_HELP_ON_NO_ARGS = getattr(click.exceptions, "NoArgsIsHelpError", ())


def usage_line(exc: click.UsageError) -> str:
    """click's usage error as one line: its message and where to read the command's options."""
    message = " ".join(exc.format_message().split())
    where = exc.ctx.command_path if exc.ctx is not None else None
    return f"{message} (see `{where} --help`)" if where else message


def _out_of_memory(exc: BaseException) -> bool:
    """torch's allocators raise RuntimeError (CPU) or OutOfMemoryError (CUDA) when memory runs out."""
    text = str(exc)
    return isinstance(exc, MemoryError) or "not enough memory" in text or "out of memory" in text


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


def _note_failure(line: str) -> None:
    """Under torchrun, leave this rank's error line where the other ranks read it (certify/agreement.py)."""
    if "diffsmooth.engine.certify.agreement" in sys.modules:
        from diffsmooth.engine.certify.agreement import note_failure
        note_failure(line)


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

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.UsageError as exc:         # `diffsmooth --bogus`: one line too
            if isinstance(exc, _HELP_ON_NO_ARGS):
                raise
            raise CLIError(usage_line(exc)) from None

    def invoke(self, ctx):
        try:
            return self._invoke(ctx)
        except CLIError as exc:                 # under torchrun the other ranks read it when their collective breaks
            _note_failure(exc.message)
            raise
        except Exception as exc:
            _note_failure(f"{type(exc).__name__}: {first_line(exc)}")
            raise

    def _invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:         # bad, missing or unknown options of a command
            if isinstance(exc, _HELP_ON_NO_ARGS):
                raise
            raise CLIError(usage_line(exc)) from None
        except Terminated as exc:               # SIGTERM: one line (rows kept, rerun to resume), exit 143
            click.echo(" ".join(str(exc).split()), err=True)
            if "torch.distributed" in sys.modules:      # torchrun's ranks: the launcher must not restart them
                from diffsmooth.engine.runs.sharding import keep_launcher_from_restarting
                keep_launcher_from_restarting()
            raise SystemExit(TERMINATED_EXIT) from None
        except UserError as exc:
            command = self.get_command(ctx, ctx.invoked_subcommand) if ctx.invoked_subcommand else None
            raise CLIError(as_flags(" ".join(str(exc).split()), command)) from None
        except (FileNotFoundError, IsADirectoryError, PermissionError) as exc:
            raise CLIError(f"{exc.strerror}: {exc.filename}") from None
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            where = f" writing {exc.filename}" if exc.filename else ""
            raise CLIError(f"no space left on the device{where} ({exc.strerror or exc}): free space and run the "
                           f"same command again (result files keep their finished rows and resume)") from None
        except (MemoryError, RuntimeError) as exc:
            if not _out_of_memory(exc):
                raise
            raise CLIError(f"out of memory ({first_line(exc, 160)}): lower --batch / --window or the image "
                           f"count, or use a larger machine") from None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="diffsmooth-engine")
def main():
    """DiffSmooth certification: diffusion denoiser + local smoothing, certified with CERTIFY."""
    keep_freed_memory()         # a CPU run's batches reuse their freed memory (engine/host_memory.py)

"""What every hostile-input test checks, in one place.

A refused input ends in exactly one line `error: ...` on stderr (nothing on stdout), exit code 2, no
traceback, and the output folder unchanged (its lock files aside: engine/runs/locks.py leaves them by
design). An accepted input reaches the command's heavy step, which the `stub_heavy_steps` fixture
(conftest.py) replaces by raising `Accepted`, so no model runs; the folder is unchanged then too.
"""

from __future__ import annotations

import math
from pathlib import Path

import reliability_ledger as ledger
import torch
from click.testing import CliRunner
from hypothesis import HealthCheck, settings

from diffsmooth.cli import main

# Small, repeatable example sets (derandomize: the same examples every run, so the reliability figure
# is a fixed count); no example database in the working tree.
FUZZ = settings(max_examples=40, deadline=None, derandomize=True, database=None, print_blob=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.filter_too_much])

DEMO_ASSETS = Path(__file__).resolve().parents[2] / "engine" / "demo" / "assets"
DEMO_CLASSIFIER = DEMO_ASSETS / "demo_classifier_s0.50.pt"
DEMO_CLASSIFIER_CLEAN = DEMO_ASSETS / "demo_classifier_s0.00.pt"
DEMO_UNET = DEMO_ASSETS / "demo_unet.pt"


class Accepted(Exception):
    """The command reached its heavy step: every option was accepted."""


def is_lock(path: Path) -> bool:
    return path.name == ".lock" or path.name.endswith(".lock")


def snapshot(folder) -> dict:
    """Every file under `folder` (lock files aside) and its bytes."""
    folder = Path(folder)
    if not folder.exists():
        return {}
    if folder.is_file():
        return {folder.name: folder.read_bytes()}
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file() and not is_lock(p)}


def invoke(args):
    """The CLI in-process; torch's thread count (an accepted --threads sets it) is restored after."""
    threads = torch.get_num_threads()
    try:
        return CliRunner().invoke(main, [str(a) for a in args])
    finally:
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)


def refused_properly(result) -> str | None:
    """None when `result` is a proper refusal, else what is wrong with it."""
    if result.exit_code != 2:
        return f"exit code {result.exit_code} (exception {result.exception!r})"
    if "Traceback" in result.output:
        return "a traceback"
    lines = result.stderr.splitlines()
    if len(lines) != 1 or not lines[0].startswith("error: "):
        return f"stderr is not one `error:` line: {result.stderr!r}"
    if result.stdout:
        return f"stdout is not empty: {result.stdout!r}"
    return None


def stopped_properly(result) -> str | None:
    """A run stopped mid-way by a fault: its progress log (`# ...` lines) and then exactly one `error:` line,
    exit code 2, no traceback. None when so, else what is wrong."""
    if result.exit_code != 2:
        return f"exit code {result.exit_code} (exception {result.exception!r})"
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error: ")]
    if "Traceback" in result.output or len(errors) != 1 or lines[-1] != errors[0] \
            or any(not (line.startswith("#") or line in errors) for line in lines):
        return f"stderr is not the log and one `error:` line: {result.stderr!r}"
    return None


def check(kind: str, args, must: bool | None, folder, *, ran_ok=None):
    """Run `args` and check the outcome: `must` True (accepted: Accepted reached, or exit 0 for commands
    that run for real), False (refused properly), None (either, but a refusal must be proper). The
    folder must be unchanged after a refusal (and after Accepted). Records the case in the ledger."""
    before = snapshot(folder)
    result = invoke(args)
    after = snapshot(folder)
    accepted = isinstance(result.exception, Accepted) or (result.exit_code == 0 and result.exception is None)
    problem = None if accepted else refused_properly(result)
    if accepted and must is False:
        problem = "accepted an invalid input"
    elif not accepted and must is True:
        problem = f"refused a valid input ({problem or result.stderr.strip()})"
    if not accepted and after != before:
        problem = problem or f"a refusal changed {folder}: {sorted(set(after) ^ set(before)) or 'contents'}"
    if isinstance(result.exception, Accepted) and after != before:
        problem = problem or f"accepted options wrote before the heavy step: {sorted(set(after) - set(before))}"
    category = "valid" if must is True or (must is None and accepted) else "hostile"
    ledger.record(category, kind, problem is None)
    assert problem is None, f"{' '.join(map(str, args))}: {problem}\n{result.output}"
    return result


# -- what click does with a number's text, for the oracles -----------------------------------------

def as_int(text: str):
    """click.INT's reading of `text` (int()), or None."""
    try:
        return int(text)
    except (ValueError, TypeError):
        return None


def as_float(text: str):
    """click.FLOAT's reading of `text` (float()), or None."""
    try:
        return float(text)
    except (ValueError, TypeError):
        return None


def finite_in(text: str, low=None, high=None, low_open=False, high_open=False):
    value = as_float(text)
    if value is None or not math.isfinite(value):
        return False
    if low is not None and (value <= low if low_open else value < low):
        return False
    return high is None or (value < high if high_open else value <= high)


def int_in(text: str, low=None, high=None):
    value = as_int(text)
    return value is not None and (low is None or value >= low) and (high is None or value <= high)


def radii_list(text: str):
    """The rule of `--radii`: comma-separated finite numbers >= 0, at least one, each once."""
    items = [t for t in text.split(",") if t.strip()]
    values = [as_float(t) for t in items]
    return bool(values) and all(v is not None and math.isfinite(v) and v >= 0 for v in values) \
        and len(set(values)) == len(values)

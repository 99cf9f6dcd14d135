"""A count of what the fuzz and fault tests tried, for the reliability figure (studies/reliability.py).

Every hostile input a test gives a command, every valid extreme it checks is accepted and every fault
it injects is recorded here with whether it ended as required; tests/fuzz/conftest.py writes the
counts to the JSON file named by $DIFFSMOOTH_RELIABILITY_JSON when the session ends (nothing is
written otherwise, so an ordinary test run leaves the tree unchanged). No pytest plugin is involved.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

ENV = "DIFFSMOOTH_RELIABILITY_JSON"

_tried = {"hostile": Counter(), "valid": Counter(), "fault": Counter(), "known_gap": Counter()}
_as_required = {"hostile": Counter(), "valid": Counter(), "fault": Counter(), "known_gap": Counter()}
_gap = []


@contextmanager
def known_gap():
    """Cases of a damage the engine does not handle yet (an xfail test): counted apart, as known gaps."""
    _gap.append(True)
    try:
        yield
    finally:
        _gap.pop()


def record(category: str, kind: str, ok: bool) -> None:
    """One case of `category` (hostile input refused, valid extreme accepted, fault survived) of `kind`."""
    category = "known_gap" if _gap else category
    _tried[category][kind] += 1
    if ok:
        _as_required[category][kind] += 1


def hostile(kind: str, ok: bool) -> None:
    record("hostile", kind, ok)


def valid(kind: str, ok: bool) -> None:
    record("valid", kind, ok)


def fault(kind: str, ok: bool) -> None:
    record("fault", kind, ok)


def summary(exitstatus: int | None = None, tests: dict | None = None) -> dict:
    categories = {}
    for category, counts in _tried.items():
        categories[category] = {
            "tried": sum(counts.values()), "as_required": sum(_as_required[category].values()),
            "by_kind": {kind: {"tried": n, "as_required": _as_required[category][kind]} for kind, n in sorted(counts.items())}}
    return {"schema": "diffsmooth-reliability/1",
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(sys.argv), "python": platform.python_version(), "platform": platform.platform(),
            "pytest_exitstatus": exitstatus, "tests": tests or {}, **categories,
            "every_one_as_required": all(c["tried"] == c["as_required"] for name, c in categories.items()
                                         if name != "known_gap")}


def write_if_asked(exitstatus: int | None = None, tests: dict | None = None) -> None:
    path = os.environ.get(ENV)
    if not path:
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(summary(exitstatus, tests), indent=1, sort_keys=True, allow_nan=False) + "\n")

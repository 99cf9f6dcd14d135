"""The reliability figure: how many hostile inputs the fuzz tests gave the commands, how many faults
they injected into running certifications, and whether every one ended as required (a refusal in one
`error:` line with exit code 2 and nothing written; a valid extreme accepted; a fault survived with
the finished rows intact and a rerun giving the uninterrupted run's rows).

    python -m studies.reliability            # tests/fuzz, the slow fault tests included
    python -m studies.reliability --fast     # hostile inputs only (-m "not slow")

Runs pytest on tests/fuzz with $DIFFSMOOTH_RELIABILITY_JSON set, so the tests' ledger
(tests/fuzz/reliability_ledger.py) is written to OUT/reliability.json; adds OUT/reliability.md. Needs a
source checkout (the tests are not installed) with pytest and hypothesis (pip install -e '.[test]').
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "bench" / "results" / "reliability"
CATEGORIES = (("hostile", "hostile inputs refused (one `error:` line, exit 2, nothing written)"),
              ("valid", "valid extremes accepted"),
              ("fault", "faults survived (rows intact, rerun = uninterrupted run)"),
              ("known_gap", "known gaps (xfail: damage the readers do not refuse yet)"))


def markdown(doc: dict) -> str:
    lines = [f"# Reliability ({doc['date'][:10]})", "", f"Command: `{doc['bench_command']}` "
             f"({doc['wall_seconds']:.0f} s; pytest exit status {doc['pytest_exitstatus']}; tests {doc['tests']}).", "",
             "| what | tried | as required |", "|---|---:|---:|"]
    for key, label in CATEGORIES:
        part = doc.get(key, {"tried": 0, "as_required": 0})
        lines.append(f"| {label} | {part['tried']:,} | {part['as_required']:,} |")
    lines += ["", f"Every one as required: {'yes' if doc['every_one_as_required'] else 'NO'}.", "", "## By kind", "",
              "| category | kind | tried | as required |", "|---|---|---:|---:|"]
    for key, _ in CATEGORIES:
        for kind, counts in doc.get(key, {}).get("by_kind", {}).items():
            lines.append(f"| {key} | {kind} | {counts['tried']} | {counts['as_required']} |")
    return "\n".join(lines) + "\n"


@click.command()
@click.option("--out", type=click.Path(file_okay=False), default=str(DEFAULT_OUT), show_default=True)
@click.option("--fast", is_flag=True, help="Skip the slow fault tests (subprocesses, real certify runs).")
def main(out, fast):
    """Run the fuzz and fault tests and write the reliability figure."""
    tests = ROOT / "tests" / "fuzz"
    if not tests.is_dir():
        raise click.ClickException(f"{tests} not found: run this from a source checkout")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ledger = out / "reliability.json"
    command = [sys.executable, "-m", "pytest", str(tests), "-q", "-p", "no:cacheprovider"] + (["-m", "not slow"] if fast else [])
    start = time.time()
    status = subprocess.call(command, cwd=ROOT, env=dict(os.environ, DIFFSMOOTH_RELIABILITY_JSON=str(ledger)))
    if not ledger.exists():
        raise click.ClickException(f"pytest wrote no ledger (exit status {status})")
    doc = json.loads(ledger.read_text())
    doc.update(bench_command="python -m studies.reliability" + (" --fast" if fast else ""),
               wall_seconds=round(time.time() - start, 1))
    ledger.write_text(json.dumps(doc, indent=1, sort_keys=True, allow_nan=False) + "\n")
    (out / "reliability.md").write_text(markdown(doc))
    click.echo(markdown(doc))
    sys.exit(0 if status == 0 and doc["every_one_as_required"] else 1)


if __name__ == "__main__":
    main()

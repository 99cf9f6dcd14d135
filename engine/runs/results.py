"""Result files in the reference TSV format (docs/compatibility.md): one row per image, flushed and fsynced
per row, resumable: a rerun continues after the finished indices and repairs a torn last line."""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path
from typing import Dict, Iterable, List, Sequence

from diffsmooth.engine.errors import UserError

CERTIFY_COLUMNS = ("idx", "label", "predict", "radius", "correct", "time")
PREDICT_COLUMNS = ("idx", "label", "predict", "correct", "time")


def format_radius(radius: float) -> str:
    """3 significant digits as the reference prints them ('{:.3}': 0.378, 1.23, 0.0)."""
    return "{:.3}".format(float(radius))


def format_time(seconds: float) -> str:
    """A timedelta string, as newer reference files have ('0:02:31.238689')."""
    return str(datetime.timedelta(seconds=float(seconds)))


def parse_time(text: str) -> float:
    """Seconds from either reference time format: '0:02:31.238689' or plain '15.4'."""
    text = text.strip()
    if ":" not in text:
        return float(text)
    days = 0.0
    if "day" in text:
        day_part, text = text.split(",")
        days = float(day_part.split()[0])
    h, m, s = text.strip().split(":")
    return days * 86400 + int(h) * 3600 + int(m) * 60 + float(s)


def repair_torn_tail(path: Path) -> None:
    """Cut an unterminated last line (a run killed mid-write) so it is never read as data."""
    with open(path, "rb+") as f:
        data = f.read()
        if data and not data.endswith(b"\n"):
            f.truncate(data.rfind(b"\n") + 1)


def read_rows(path) -> List[Dict[str, str]]:
    """All complete rows of a TSV result file as dicts keyed by its header."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"result file {path} does not exist")
    lines = path.read_text().split("\n")
    if lines and lines[-1] != "":
        lines = lines[:-1]                      # a torn last line is not data
    lines = [line for line in lines if line.strip()]
    if not lines:
        return []
    header = lines[0].split("\t")
    if "idx" not in header:
        raise UserError(f"{path} is not a result TSV (header {header!r} has no 'idx')")
    rows = []
    for number, line in enumerate(lines[1:], start=2):
        fields = line.split("\t")
        if len(fields) != len(header):
            raise UserError(f"{path}:{number}: expected {len(header)} tab-separated fields, got {len(fields)}")
        rows.append(dict(zip(header, fields)))
    return rows


class ResultWriter:
    """Appends rows to a TSV, writing the header once; `done` holds the indices already there."""

    def __init__(self, path, columns: Sequence[str] = CERTIFY_COLUMNS):
        self.path = Path(path)
        self.columns = tuple(columns)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.done = set()
        if self.path.exists() and self.path.stat().st_size > 0:
            repair_torn_tail(self.path)
            header = self.path.read_text().split("\n", 1)[0].split("\t")
            if tuple(header) != self.columns:
                raise UserError(f"{self.path} has columns {header}, not {list(self.columns)}: "
                                f"choose another `out` or remove the file")
            self.done = {int(row["idx"]) for row in read_rows(self.path)}
            self._file = open(self.path, "a")
        else:
            self._file = open(self.path, "w")
            self._write_line(self.columns)

    def _write_line(self, fields: Iterable) -> None:
        self._file.write("\t".join(str(f) for f in fields) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def write(self, **row) -> None:
        """Write one finished image; it is on disk when this returns."""
        self._write_line(row[c] for c in self.columns)
        self.done.add(int(row["idx"]))

    def close(self) -> None:
        self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def shard_path(out_path, shard: int, num_shards: int) -> Path:
    """Where shard `shard` of `num_shards` writes its rows: next to the merged file."""
    out = Path(out_path)
    return out.with_name(f"{out.stem}.shard-{shard}-of-{num_shards}{out.suffix or '.tsv'}")


def merge_results(shard_files: Sequence, out_path) -> int:
    """Write the rows of all shard files into one TSV sorted by idx, every index once.

    The same index in two shards must have identical rows (apart from time); otherwise the
    shards come from different runs and merging would mix them: that is a UserError.
    Written to a temporary file and renamed, so a crash never leaves half a merged file.
    """
    by_index: Dict[int, Dict[str, str]] = {}
    columns = None
    for f in shard_files:
        rows = read_rows(f)
        header = Path(f).read_text().split("\n", 1)[0].split("\t")
        if columns is None:
            columns = header
        elif header != columns:
            raise UserError(f"{f} has columns {header}, other shards have {columns}")
        for row in rows:
            index = int(row["idx"])
            seen = by_index.get(index)
            if seen is not None and {k: v for k, v in seen.items() if k != "time"} != \
                    {k: v for k, v in row.items() if k != "time"}:
                raise UserError(f"index {index} has different results in two shard files ({f}): "
                                f"they are not from the same run")
            by_index.setdefault(index, row)
    if columns is None:
        raise UserError("no shard files to merge")
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "w") as f:
        f.write("\t".join(columns) + "\n")
        for index in sorted(by_index):
            f.write("\t".join(by_index[index][c] for c in columns) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, out)
    return len(by_index)


def settings_path(out_path) -> Path:
    out = Path(out_path)
    return out.with_name(out.name + ".settings.json")


def check_or_record_settings(out_path, settings: dict, record: bool = True) -> None:
    """Resuming must not mix runs: record the settings next to a new result file, and refuse
    to append to one whose recorded settings differ (names the first differing setting).
    record=False only checks (before models load, so a failed start records nothing)."""
    path = settings_path(out_path)
    if path.exists():
        recorded = json.loads(path.read_text())
        for key in sorted(set(recorded) | set(settings)):
            if recorded.get(key) != settings.get(key):
                raise UserError(f"{out_path} was written with {key}={recorded.get(key)!r}, this run has "
                                f"{key}={settings.get(key)!r}: use another `out` to avoid mixing runs")
        return
    if not record:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(settings, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)

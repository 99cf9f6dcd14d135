"""Result files in the reference TSV format (docs/compatibility.md): one row per image, one append per row,
fsynced, one writer per file (engine/runs/locks.py), resumable: a rerun continues after the finished
indices and repairs a torn last line. Readers check every line and refuse a damaged file."""

from __future__ import annotations

import datetime
import decimal
import errno
import json
import math
import os
import re
from contextlib import ExitStack
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from diffsmooth.engine.errors import UserError
from diffsmooth.engine.runs.locks import hold_lock

CERTIFY_COLUMNS = ("idx", "label", "predict", "radius", "correct", "time")
PREDICT_COLUMNS = ("idx", "label", "predict", "correct", "time")
# Sequential rows: samples drawn, cA's estimation votes, and cA itself (the selected class, also where the
# row abstains). Files written before `selected` existed have the first two; they are read and resumed as they are.
SEQUENTIAL_EXTRA = ("samples", "top_votes", "selected")
SEQUENTIAL_EXTRA_BEFORE_SELECTED = ("samples", "top_votes")


# How result files print the radius (recorded in their settings; `format_radius`). Files whose
# settings lack it were written with the reference's rounding to nearest and are never resumed.
RADIUS_FORMAT_KEY = "radius_format"
RADIUS_FORMAT = "3 significant digits, rounded down"


def format_radius(radius: float) -> str:
    """3 significant digits in the reference's style ('{:.3}': 0.378, 1.23, 0.0504, 0.0, 1.0), but
    rounded DOWN (the reference rounds to nearest: 0.2496 -> 0.25): the largest 3-digit number not
    above the float, judged on its exact binary value (0.2496 -> 0.249, 0.9999 -> 0.999), so the
    printed radius, read back as a float, never exceeds the computed one. A float that is itself the
    nearest float of a 3-digit number (0.484 read back from a file) prints as that number, so printing
    a printed radius again changes nothing."""
    value = float(radius)
    if value == 0 or not math.isfinite(value):
        return "{:.3}".format(value)
    exact = decimal.Decimal(value)                       # the float's exact binary value
    unit = decimal.Decimal(1).scaleb(exact.adjusted() - 2)
    floored = exact.quantize(unit, rounding=decimal.ROUND_FLOOR)
    if float(floored + unit) <= value:                   # value is the float of floored + unit itself
        floored += unit
    # floored has at most 3 significant digits: '{:.3}' of its nearest float prints exactly them,
    # and that float is <= value (rounding to the nearest float is monotone and value is a float)
    return "{:.3}".format(float(floored))


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


# The headers a result file may have: certify (sequential rows add `samples` and `top_votes`, older
# sequential files `samples` alone) and predict. Anything else is not a result file of this project.
KNOWN_HEADERS = (CERTIFY_COLUMNS, CERTIFY_COLUMNS + SEQUENTIAL_EXTRA, CERTIFY_COLUMNS + SEQUENTIAL_EXTRA_BEFORE_SELECTED,
                 CERTIFY_COLUMNS + ("samples",), PREDICT_COLUMNS)
# An older header a writer keeps writing when it resumes a file that has it (the rows it writes drop the newer columns).
RESUMABLE_OLDER = {CERTIFY_COLUMNS + SEQUENTIAL_EXTRA: CERTIFY_COLUMNS + SEQUENTIAL_EXTRA_BEFORE_SELECTED}
_INTEGER = re.compile(r"-?[0-9]+")


def _field_problem(column: str, text: str) -> Optional[str]:
    """What is wrong with one field of a row (None: nothing)."""
    if column == "time":
        try:
            seconds = parse_time(text)
        except (ValueError, TypeError):
            seconds = float("nan")
        return None if math.isfinite(seconds) and seconds >= 0 else f"time {text!r} is not a duration"
    if column == "radius":
        try:
            radius = float(text)
        except ValueError:
            radius = float("nan")
        return None if math.isfinite(radius) and radius >= 0 else f"radius {text!r} is not a number >= 0"
    if not _INTEGER.fullmatch(text):
        return f"{column} {text!r} is not an integer"
    value = int(text)
    if column == "correct" and value not in (0, 1):
        return f"correct {text!r} is not 0 or 1"
    if column in ("idx", "label", "samples", "top_votes", "selected") and value < 0:
        return f"{column} {text!r} is negative"
    if column == "predict" and value < -1:
        return f"predict {text!r} is neither a class nor -1 (abstain)"
    return None


def read_result(path, torn_tail: str = "refuse") -> Tuple[Tuple[str, ...], List[Dict[str, str]]]:
    """(columns, rows) of a result file, every row checked: a known header, then lines of exactly its
    fields, none empty, numbers where numbers belong (idx, label, predict, radius, correct, samples,
    top_votes; time in either format) and every index once. Anything else is a UserError naming the
    file and line (`r.tsv:7: ...`): a damaged file is refused, never tabulated or resumed.
    An unterminated last line (a run killed mid-write) is refused too; `torn_tail="ignore"` leaves it
    out instead (resume: the writer of that file cuts it when it opens the file)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"result file {path} does not exist")
    text = path.read_bytes().decode("utf-8", "replace")
    if not text:
        return (), []
    lines = text.split("\n")
    if lines[-1] != "":                         # no newline at the end: a torn last line
        if torn_tail != "ignore":
            raise UserError(f"{path}:{len(lines)}: torn last line (no newline at the end of the file; a run was "
                            f"killed mid-row): rerun that run to repair it, or cut the line")
    lines = lines[:-1]
    header = tuple(lines[0].split("\t")) if lines else ()
    if header not in KNOWN_HEADERS:
        known = " | ".join(" ".join(h) for h in KNOWN_HEADERS)
        raise UserError(f"{path}:1: not a result file: header {' '.join(header)!r} is none of: {known}")
    rows, seen = [], {}
    for number, line in enumerate(lines[1:], start=2):
        fields = line.split("\t")
        if len(fields) != len(header):
            raise UserError(f"{path}:{number}: expected {len(header)} tab-separated fields, got {len(fields)} "
                            f"(a torn or malformed line)")
        for column, field in zip(header, fields):
            problem = "empty field " + column if field == "" else _field_problem(column, field)
            if problem:
                raise UserError(f"{path}:{number}: {problem}")
        row = dict(zip(header, fields))
        index = int(row["idx"])
        if index in seen:
            raise UserError(f"{path}:{number}: index {index} twice (also on line {seen[index]}): two runs wrote "
                            f"this file; it must not be used")
        seen[index] = number
        rows.append(row)
    return header, rows


def read_rows(path, torn_tail: str = "refuse") -> List[Dict[str, str]]:
    """All rows of a TSV result file as dicts keyed by its header, checked (read_result)."""
    return read_result(path, torn_tail)[1]


def _write_all(fd: int, data: bytes) -> None:
    """One write(2) of the whole line on an O_APPEND descriptor (looped only if the kernel writes part)."""
    while data:
        written = os.write(fd, data)
        data = data[written:]


class ResultWriter:
    """Appends rows to a TSV, writing the header once; `done` holds the indices already there.
    Holds the file's lock (engine/runs/locks.py) while open: one writer per result file. Each row is
    one append-mode write of the whole line, then fsync, so rows never interleave or tear."""

    def __init__(self, path, columns: Sequence[str] = CERTIFY_COLUMNS):
        self.path = Path(path)
        self.columns = tuple(columns)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.done = set()
        self._lock = ExitStack()
        self._lock.enter_context(hold_lock(self.path))
        try:
            self._open()
        except BaseException:
            self._lock.close()
            raise

    def _open(self) -> None:
        if self.path.exists() and self.path.stat().st_size > 0:
            repair_torn_tail(self.path)         # our own torn last line only; anything else is refused
        if self.path.exists() and self.path.stat().st_size > 0:
            header = self.path.read_bytes().split(b"\n", 1)[0].decode("utf-8", "replace").split("\t")
            if tuple(header) == RESUMABLE_OLDER.get(self.columns):
                self.columns = tuple(header)          # a file from before a column was added: resumed as it is
            if tuple(header) != self.columns:
                raise UserError(f"{self.path} has columns {header}, not {list(self.columns)}: "
                                f"choose another `out` or remove the file")
            self.done = {int(row["idx"]) for row in read_rows(self.path)}
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        else:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            self._write_line(self.columns)

    def _write_line(self, fields: Iterable) -> None:
        size = os.fstat(self._fd).st_size
        try:
            _write_all(self._fd, ("\t".join(str(f) for f in fields) + "\n").encode())
            os.fsync(self._fd)
        except OSError as exc:                  # a full disk (or quota) mid-row: cut the part written
            try:
                os.ftruncate(self._fd, size)
            except OSError:
                pass                            # a torn last line is cut when the file is next opened
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise UserError(f"no space left on the device writing {self.path} ({exc.strerror}): its "
                                f"{len(self.done)} finished rows are kept; free space and run the same command "
                                f"again to continue") from None
            raise

    def write(self, **row) -> None:
        """Write one finished image; it is on disk when this returns."""
        self._write_line(row[c] for c in self.columns)
        self.done.add(int(row["idx"]))

    def close(self) -> None:
        if getattr(self, "_fd", None) is not None:
            os.close(self._fd)
            self._fd = None
        self._lock.close()

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

    The same index in two shards must have identical rows (apart from time; a torchrun restart can
    repeat one); otherwise the shards come from different runs and merging would mix them: that is
    a UserError, as is a damaged shard (read_result). Holds OUT's lock (one writer per result file);
    written to a temporary file and renamed, so a crash never leaves half a merged file.
    """
    by_index: Dict[int, Dict[str, str]] = {}
    columns = None
    with hold_lock(out_path):
        for f in shard_files:
            header, rows = read_result(f)
            if not header:
                continue                        # an empty file (a shard that had no image yet)
            if columns is None:
                columns = header
            elif header != columns:
                raise UserError(f"{f} has columns {list(header)}, other shards have {list(columns)}")
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


def refuse_other_radius_format(recorded: dict, settings: dict, where) -> None:
    """Rows printed with the reference's rounding to nearest (recorded settings without
    RADIUS_FORMAT_KEY) are never appended to with radii rounded down: one file, one convention."""
    if RADIUS_FORMAT_KEY in settings and RADIUS_FORMAT_KEY not in recorded:
        raise UserError(f"{where} was written with radii rounded to nearest (its recorded settings have no "
                        f"{RADIUS_FORMAT_KEY}); this engine prints them rounded down ({RADIUS_FORMAT}), so that "
                        f"a printed radius never exceeds the certified one, and one file must not mix the two: "
                        f"use another `out` (`diffsmooth analyze` still reads the old file)")


def check_or_record_settings(out_path, settings: dict, record: bool = True) -> None:
    """Resuming must not mix runs: record the settings next to a new result file, and refuse
    to append to one whose recorded settings differ (names the first differing setting).
    record=False only checks (before models load, so a failed start records nothing)."""
    path = settings_path(out_path)
    if path.exists():
        recorded = read_json(path)
        refuse_other_radius_format(recorded, settings, out_path)
        for key in sorted(set(recorded) | set(settings)):
            if recorded.get(key) != settings.get(key):
                raise UserError(f"{out_path} was written with {key}={recorded.get(key)!r}, this run has "
                                f"{key}={settings.get(key)!r}: use another `out` to avoid mixing runs")
        return
    if not record:
        return
    try:
        text = json.dumps(settings, indent=1, sort_keys=True, allow_nan=False) + "\n"
    except ValueError as exc:                   # NaN / inf: settings files stay strict JSON
        raise UserError(f"the settings of {out_path} hold a number JSON cannot store ({exc}): check the options") from None
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)             # a full disk leaves no half-written settings behind
        raise


def read_json(path, what: str = "settings file") -> dict:
    """A JSON object the engine wrote (settings, index.json): strict JSON (no NaN / Infinity); a
    damaged or hand-edited one is a UserError naming the file."""
    path = Path(path)

    def refuse(constant):
        raise ValueError(f"{constant} is not strict JSON")
    try:
        value = json.loads(path.read_text(), parse_constant=refuse)
    except (ValueError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: damaged {what} (not strict JSON: {exc}); restore it, or use another `out`") from None
    if not isinstance(value, dict):
        raise UserError(f"{path}: damaged {what} (a JSON {type(value).__name__}, not an object); use another `out`")
    return value

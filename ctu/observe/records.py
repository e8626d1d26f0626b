"""A run's record files (``metrics.jsonl``, ``eval/history.jsonl``: one JSON object with an integer ``step`` per
line) read strictly: a damaged line is an error naming the file and the line; a torn last line (a write cut short by
a full disk or a crash) is told apart so that readers can leave it out and resume can repair it."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

Check = Callable[[dict[str, Any]], str | None]  # a record's problem (one phrase), or None


class RecordError(ValueError):
    """A damaged line inside a run's record file; the message names the file and the line."""


class Unreadable(RecordError):
    """A line that is not UTF-8 JSON at all (what a write cut short leaves)."""


def parse_record(path: Path, line_no: int, raw: bytes, check: Check | None = None) -> dict[str, Any]:
    """One record line: a JSON object with an integer ``step`` (and what ``check`` asks of it);
    :class:`RecordError` naming file and line."""
    where = f"{path}: line {line_no}"
    try:
        record = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise Unreadable(f"{where}: not valid UTF-8 (byte 0x{raw[exc.start]:02x} at offset {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise Unreadable(f"{where}: not JSON ({exc.msg} at column {exc.colno})") from None
    except RecursionError:  # JSON, but nested deeper than any record: refused, never taken for a torn write
        raise RecordError(f"{where}: nested too deeply to be a record") from None
    except ValueError:  # an integer of more digits than Python converts (4,300)
        raise RecordError(f"{where}: a number too long to be a record's") from None
    if not isinstance(record, dict) or type(record.get("step")) is not int:
        raise RecordError(f"{where}: not a record (a JSON object with an integer 'step')")
    problem = check(record) if check is not None else None
    if problem:
        raise RecordError(f"{where}: {problem}")
    return record


def split_records(path: Path, data: bytes, check: Check | None = None) -> tuple[list[dict[str, Any]], bytes | None]:
    """(records, torn tail or None) of a record file's bytes; blank lines are skipped, as the readers do.

    The tail after the last newline is a record written without its newline if it parses, torn if it is not
    JSON (a tail that is JSON but no record is refused like any other line)."""
    lines = data.split(b"\n")
    tail = lines.pop()
    records = [parse_record(path, n, line, check) for n, line in enumerate(lines, start=1) if line.strip()]
    if not tail.strip(b" \t\r\0"):
        return records, tail or None
    try:
        records.append(parse_record(path, len(lines) + 1, tail, check))
    except Unreadable:
        return records, tail
    return records, None


def read_records(path: Path, check: Check | None = None) -> list[dict[str, Any]]:
    """The records of one file (none if it does not exist), a torn last line left out."""
    if not path.exists():
        return []
    return split_records(path, path.read_bytes(), check)[0]


def number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def finite(value: Any) -> bool:
    try:
        return number(value) and math.isfinite(value)
    except OverflowError:  # an integer beyond any float
        return False

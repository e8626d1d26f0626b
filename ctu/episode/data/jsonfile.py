"""JSON data files read in one linear pass: JSON Lines, or one JSON array, each record with the line it starts on.

Every problem is a :class:`DataError` naming the file and the line: bytes that are not UTF-8, text that is not JSON,
an array missing a comma or its closing bracket, content after the array (a file is one array or JSON Lines, not
both), and nesting deeper than Python's JSON reader follows (a bare ``RecursionError`` otherwise).
"""

from __future__ import annotations

import codecs
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

TOO_DEEP = "nested too deeply: more levels of [ and { than Python's JSON reader follows"
_SURROGATE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")  # a \uD800-\uDFFF escape: maybe half a pair
_SPACE = re.compile(r"[ \t\r\n]*")  # JSON's whitespace, nothing else
_DECODER = json.JSONDecoder()


class DataError(ValueError):
    """A dataset that cannot be read or written; the message names the file and the line or row."""


def read_text(path: Path) -> str:
    """The file's text (UTF-8, a leading byte order mark dropped); bad bytes name their line."""
    data = path.read_bytes()
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8):]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise DataError(f"{path}:{line}: not valid UTF-8") from None


def value_problem(exc: ValueError) -> str:
    """What a ``ValueError`` of ``json.loads`` other than a syntax error means: an overlong integer."""
    if "integer string conversion" in str(exc):
        return f"an integer with more digits than Python reads ({sys.get_int_max_str_digits()})"
    return " ".join(str(exc).split())


def check_text(text: str, value: Any) -> Any:
    """``value`` (parsed from ``text``) if every string in it is text UTF-8 can hold; a ``ValueError`` for a lone
    surrogate (``"\\ud800"``), which JSON accepts and every tokenizer refuses."""
    if not _SURROGATE.search(text):
        return value
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            try:
                node.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise ValueError(f"a string holds a lone surrogate (\\u{ord(node[exc.start]):04x}): half of a UTF-16 "
                                 "pair, not text") from None
        elif isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return value


def parse_line(path: Path, line: int, text: str) -> Any:
    """One JSON Lines record; errors name ``path:line``."""
    try:
        return check_text(text, json.loads(text))
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}:{line}: not valid JSON ({exc.msg} at column {exc.colno})") from None
    except RecursionError:
        raise DataError(f"{path}:{line}: {TOO_DEEP}") from None
    except ValueError as exc:
        raise DataError(f"{path}:{line}: {value_problem(exc)}") from None


def records(path: Path) -> Iterator[tuple[int, Any]]:
    """(line, record) of a JSON Lines file or of a file holding one JSON array (each element's starting line)."""
    text = read_text(path)
    start = _SPACE.match(text).end()  # type: ignore[union-attr]  # matches the empty string
    if text.startswith("[", start):
        yield from _array(path, text, start)
        return
    for line, raw in enumerate(text.split("\n"), start=1):  # not splitlines: U+2028 may sit inside a string
        if raw.strip():
            yield line, parse_line(path, line, raw)


def load(path: Path) -> Any:
    """The one JSON value a file holds (an array read as :func:`records` reads one); errors name file and line."""
    text = read_text(path)
    start = _SPACE.match(text).end()  # type: ignore[union-attr]  # matches the empty string
    if text.startswith("[", start):
        return [value for _, value in _array(path, text, start)]
    try:
        return check_text(text, json.loads(text))
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg} at column {exc.colno})") from None
    except RecursionError:
        raise DataError(f"{path}:{_line_at(text, start)}: {TOO_DEEP}") from None
    except ValueError as exc:
        raise DataError(f"{path}:{_line_at(text, start)}: {value_problem(exc)}") from None


def _line_at(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _array(path: Path, text: str, pos: int) -> Iterator[tuple[int, Any]]:
    """The elements of the array opening at ``pos``; lines are counted once, forward (linear time)."""
    line, counted = _line_at(text, pos), pos
    pos = _SPACE.match(text, pos + 1).end()  # type: ignore[union-attr]  # matches the empty string
    while not text.startswith("]", pos):
        if pos >= len(text):
            raise DataError(f"{path}:{_line_at(text, len(text.rstrip()))}: the JSON array is not closed")
        line, counted = line + text.count("\n", counted, pos), pos
        try:
            value, end_pos = _DECODER.raw_decode(text, pos)
            value, pos = check_text(text[pos:end_pos], value), end_pos
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg} at column {exc.colno})") from None
        except RecursionError:
            raise DataError(f"{path}:{line}: {TOO_DEEP}") from None
        except ValueError as exc:
            raise DataError(f"{path}:{line}: {value_problem(exc)}") from None
        yield line, value
        pos = _SPACE.match(text, pos).end()  # type: ignore[union-attr]  # matches the empty string
        if text.startswith(",", pos):
            pos = _SPACE.match(text, pos + 1).end()  # type: ignore[union-attr]  # matches the empty string
            if text.startswith("]", pos):
                raise DataError(f"{path}:{_line_at(text, pos)}: not valid JSON (a comma before the array's ']')")
        elif pos < len(text) and not text.startswith("]", pos):
            raise DataError(f"{path}:{_line_at(text, pos)}: expected ',' or ']' after the record that starts on "
                            f"line {line}")
    end = line + text.count("\n", counted, pos)
    rest = _SPACE.match(text, pos + 1).end()  # type: ignore[union-attr]  # matches the empty string
    if rest < len(text):
        raise DataError(f"{path}:{end + text.count(chr(10), pos, rest)}: content after the JSON array that ends on "
                        f"line {end} (a file holds one JSON array, or JSON Lines: one object per line)")

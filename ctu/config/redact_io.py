"""Where output leaves the process, :func:`ctu.config.redact.redact` is applied: the console streams (every ``print``,
log record, warning, progress bar and traceback written through ``sys.stdout``/``sys.stderr``, and so what W&B
captures of the console) and the command line (``sys.argv``, which W&B and Ray record).

Output written straight to file descriptors 1 and 2 by native code or child processes is not seen here.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from ctu.config.redact import redact

_LAYER = "__ctu_redacting__"


def redact_stream(stream: TextIO) -> Callable[[], None]:
    """Route ``stream.write`` through :func:`redact`, on top of whatever wraps it now (W&B's console capture patches
    ``write`` the same way: what it records must come through this layer). Returns the undo; a stream whose ``write``
    is already this layer is left alone."""
    write = getattr(stream, "write", None)
    if write is None or getattr(write, _LAYER, False):
        return lambda: None
    had_own = "write" in getattr(stream, "__dict__", {})

    def redacting_write(data: Any) -> Any:
        if isinstance(data, str):
            write(redact(data))
            return len(data)
        return write(data)

    setattr(redacting_write, _LAYER, True)
    try:
        stream.write = redacting_write  # type: ignore[method-assign]
    except (AttributeError, TypeError):  # a stream that refuses: left as it is
        return lambda: None

    def undo() -> None:
        if vars(stream).get("write") is redacting_write:  # only while nothing was layered on top
            if had_own:
                stream.write = write  # type: ignore[method-assign]
            else:
                del stream.write

    return undo


@contextmanager
def redacted_console() -> Iterator[None]:
    """``sys.stdout`` and ``sys.stderr`` redacted inside the block."""
    undos = [redact_stream(sys.stdout), redact_stream(sys.stderr)]
    try:
        yield
    finally:
        for undo in reversed(undos):
            undo()


def redact_argv() -> None:
    """Replace ``sys.argv`` in place by its redacted form (after the command line is parsed): what W&B's metadata,
    Ray's job table and child processes record of it holds no credential."""
    sys.argv[:] = [redact(arg) for arg in sys.argv]


@contextmanager
def argv_redacted() -> Iterator[None]:
    """``sys.argv`` redacted inside the block (``wandb.init`` records it), restored after."""
    saved = list(sys.argv)
    redact_argv()
    try:
        yield
    finally:
        sys.argv[:] = saved

"""The ``calculate`` tool's arithmetic: Python's own, with every product and power bounded.

tau2's retail and airline ``calculate`` run ``eval`` on the expression (digits, ``+ - * / ( ) .`` and spaces only)
and answer ``str(round(float(value), 2))`` or the exception's message. ``eval`` has no bound: ``9**9**8`` holds
the GIL for minutes. :func:`evaluate` evaluates the same code with its integer constants as :class:`_Int`, an
``int`` (named ``int`` in messages) whose products and powers check their size first: the same order, values and
error messages as ``eval``, except that a step making an integer past :data:`MAX_BITS`, or steps whose work
together passes :data:`MAX_WORK`, are refused at once (:class:`TooLarge`). Nothing that large fits the float the
tool answers with, unless a division brings it back (``10**400/10**399`` is well within).
"""

from __future__ import annotations

import dis
import math
import re
from typing import Any

ALLOWED = frozenset("0123456789+-*/(). ")
MAX_BITS = 1 << 15  # the largest integer a product or power may make: 32,768 bits (9,864 digits)
MAX_WORK = 1 << 26  # the sum over products and powers of (64-bit words of the result) squared: ~0.2 s at most
TOO_LARGE = f"numbers in the expression grow past {MAX_BITS} bits"
TOO_MUCH = "the expression's products and powers take too long"
_SMALL_INTS = bytes([dis.opmap["LOAD_SMALL_INT"]]) if "LOAD_SMALL_INT" in dis.opmap else None
_INT_LITERAL = re.compile(r"(?<![\d.])\d+(?![\d.])")


class TooLarge(ArithmeticError):
    """A step would make an integer past :data:`MAX_BITS`, or the steps together would pass :data:`MAX_WORK`."""


def evaluate(expression: str) -> str:
    """tau2's answer to ``calculate(expression)``: the value rounded to 2 places, as text. Raises ``ValueError``
    for characters outside :data:`ALLOWED`, :class:`TooLarge`, or the exception ``eval`` would raise."""
    if not all(char in ALLOWED for char in expression):
        raise ValueError("Invalid characters in expression")
    code = compile(expression, "<string>", "eval")  # the same syntax, depth and digit-count errors as eval's
    names: dict[str, Any] = {"__builtins__": None}
    if "*" in expression:  # without products or powers, no step adds more than a bit
        budget = _Budget()
        if _SMALL_INTS is None or _SMALL_INTS not in code.co_code:  # every integer comes from the constants
            code = code.replace(co_consts=tuple(_Int(c, budget) if type(c) is int else c for c in code.co_consts))
        else:  # Python 3.14+ loads small integers without constants: call for each literal (slower to compile)
            names["_i"] = lambda value: _Int(value, budget)
            code = compile(_INT_LITERAL.sub(lambda m: f"_i({m.group()})", expression), "<string>", "eval")
    value = eval(code, names, {})  # noqa: S307 - characters restricted above, products and powers bounded
    return str(round(float(value), 2))


class _Budget:
    """The work of one evaluation's products and powers so far."""

    def __init__(self) -> None:
        self.work = 0

    def charge(self, bits: float) -> None:
        if bits > MAX_BITS:
            raise TooLarge(TOO_LARGE)
        self.work += (int(bits) // 64 + 1) ** 2
        if self.work > MAX_WORK:
            raise TooLarge(TOO_MUCH)


class _Int(int):
    """An integer literal of the expression and every integer made from it: ``int``'s arithmetic, each result
    wrapped again, products and powers checked before they run."""

    budget: _Budget

    def __new__(cls, value: int, budget: _Budget) -> _Int:
        made = super().__new__(cls, value)
        made.budget = budget
        return made

    def _wrap(self, value: Any) -> Any:
        return _Int(value, self.budget) if type(value) is int else value

    def __mul__(self, other: Any) -> Any:
        if isinstance(other, int):
            self.budget.charge(self.bit_length() + other.bit_length())
        return self._wrap(int.__mul__(self, other))

    __rmul__ = __mul__

    def __pow__(self, other: Any, modulo: None = None) -> Any:  # type: ignore[override]  # no modulo in eval
        if isinstance(other, int):
            _charge_power(self.budget, int(self), int(other))
        return self._wrap(int.__pow__(self, other))

    def __rpow__(self, other: Any, modulo: None = None) -> Any:  # type: ignore[override]
        if isinstance(other, int):
            _charge_power(self.budget, int(other), int(self))
        return self._wrap(int.__rpow__(self, other))

    def __add__(self, other: Any) -> Any:
        return self._wrap(int.__add__(self, other))

    def __radd__(self, other: Any) -> Any:
        return self._wrap(int.__radd__(self, other))

    def __sub__(self, other: Any) -> Any:
        return self._wrap(int.__sub__(self, other))

    def __rsub__(self, other: Any) -> Any:
        return self._wrap(int.__rsub__(self, other))

    def __floordiv__(self, other: Any) -> Any:
        return self._wrap(int.__floordiv__(self, other))

    def __rfloordiv__(self, other: Any) -> Any:
        return self._wrap(int.__rfloordiv__(self, other))

    def __neg__(self) -> Any:
        return self._wrap(int.__neg__(self))

    def __pos__(self) -> Any:
        return self._wrap(int.__pos__(self))


_Int.__name__ = _Int.__qualname__ = "int"  # type errors name the operand's type as eval's do


def _charge_power(budget: _Budget, base: int, exponent: int) -> None:
    if exponent > 0 and abs(base) > 1:
        budget.charge(MAX_BITS + 1 if exponent.bit_length() > 64 else exponent * math.log2(abs(base)))

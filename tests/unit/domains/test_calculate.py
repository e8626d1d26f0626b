"""retail and airline ``calculate``: tau2's answers (eval's), with products and powers bounded in time and size."""

import gzip
import json
import time
import warnings
from pathlib import Path

import pytest

from ctu.domains import get_domain
from ctu.domains.base import arith, run_tool

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "tau2_reference"

# eval's corner cases: calls of non-callables, tuples, Ellipsis, complex powers, overflow, deep chains, digits
CASES = ["2 + 2", "10 / 3", "(1 + 2) * 3.5", "1/0", "7//2", "-7//2", "2**0.5", "(-2)**2", "-2**2", "2**-1", "0**-1",
         "0**0", "(-8)**(1/3)", "9.0**999", "2**1023*2", "2**1024", "10**400/10**399", "2**10000//2**9999",
         "1e308", "1.5.5", "1 2", "", "()", "...", "...+1", "()+()", "()*(10**30)", "(1)(2)", "()()", "(1)(*())",
         "(1)(**())", "(1/0)(2)", "(1)(1/0)", "--+-5", "100*1.075", ".1+.2", "(2**.5)**2", "(-1)**(10**30)",
         "1" * 4000, "1" * 5000, "(" * 300 + "1" + ")" * 300, "+".join(["2*3"] * 900), "-" * 5000 + "1"]


def _eval(expression):  # tau2's calculate, less its "Invalid characters" check
    try:
        if not all(char in "0123456789+-*/(). " for char in expression):
            raise ValueError("Invalid characters in expression")
        return str(round(float(eval(expression, {"__builtins__": None}, {})), 2))  # noqa: S307 - the reference
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"


def _evaluate(expression):
    try:
        return arith.evaluate(expression)
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"


@pytest.mark.parametrize("small_ints", [False, True], ids=["constants", "literal-calls"])
def test_answers_and_errors_are_evals(monkeypatch, small_ints):
    if small_ints:  # the path Python 3.14+ takes, where small integers are not constants
        monkeypatch.setattr(arith, "_SMALL_INTS", b"")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)
        assert [_evaluate(e) for e in CASES] == [_eval(e) for e in CASES]


def test_answers_recorded_from_tau2_are_kept():
    pairs = set()
    for name in ("retail", "airline"):
        with gzip.open(FIXTURES / f"{name}.jsonl.gz", "rt") as f:
            for line in f:
                calls = {}
                for message in json.loads(line)["messages"]:
                    for call in message.get("tool_calls") or []:
                        if call["function"]["name"] == "calculate":
                            calls[call["id"]] = json.loads(call["function"]["arguments"])["expression"]
                    if message["role"] == "tool" and message.get("tool_call_id") in calls:
                        pairs.add((calls[message["tool_call_id"]], message["content"]))
    assert len(pairs) >= 10
    assert [arith.evaluate(e) for e, _ in sorted(pairs)] == [answer for _, answer in sorted(pairs)]


@pytest.mark.parametrize("domain", ["retail", "airline"])
@pytest.mark.parametrize("expression", ["9**9**8", "9**9**9", "9**1500000", "2**(2**2000)", "(7**9000)*(7**9000)"])
def test_huge_products_and_powers_are_refused_at_once(domain, expression):
    world = get_domain(domain)
    started = time.perf_counter()
    result = run_tool(world.tool("calculate"), world.new_db(), {"expression": expression}, "calculate")
    assert time.perf_counter() - started < 0.05
    assert result.error and result.content == f"Error: {arith.TOO_LARGE}"


def test_total_work_is_bounded():
    expression = "+".join(["3**20000//3**19999"] * 1000)  # each step allowed, all together ~0.7 s of eval
    started = time.perf_counter()
    with pytest.raises(arith.TooLarge, match="take too long"):
        arith.evaluate(expression)
    assert time.perf_counter() - started < 0.5
    assert arith.evaluate("+".join(["3**2000//3**1999"] * 100)) == "300.0"

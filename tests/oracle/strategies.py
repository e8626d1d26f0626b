"""Hypothesis strategies drawing transcripts for a tau2 task, per domain, from tau2's own task data.

A drawn :class:`Plan` is the task's gold calls with edits applied (an argument perturbed, a call dropped,
repeated or moved, failing calls inserted, an unknown argument added), grouped into messages (several calls in
one message, text next to calls), the facts to communicate (some left out or rewritten), and an ending (a user
stop token, an agent stop, or a premature end). For telecom the user's own gold calls stay on the user's side:
user messages with ``tool_calls`` answered by ``tool`` messages with ``"requestor": "user"``.
Every choice is a hypothesis draw, so a disagreement shrinks to the fewest edits on the smallest task.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

USER_STOPS = ("###STOP###", "Thanks, that's all. ###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###",
              "ok ###STOP### bye")
PREMATURE = ("max_steps", "too_many_errors", "agent_error", "user_error", None)
EDITS = ("perturb", "drop", "repeat", "move", "fail", "extra_arg")


@dataclass(frozen=True)
class Call:
    name: str
    arguments: dict[str, Any]
    requestor: str = "assistant"


@dataclass(frozen=True)
class Turn:
    """One message: ``role`` speaks ``text`` and/or makes ``calls`` (answered by one tool message each)."""

    role: str
    text: str | None = None
    calls: tuple[Call, ...] = ()


@dataclass(frozen=True)
class Plan:
    domain: str
    task_id: str
    kind: str
    turns: tuple[Turn, ...]
    termination: str | None = None
    notes: tuple[str, ...] = field(default=())


@dataclass(frozen=True)
class DomainPool:
    """What strategies draw from for one domain: gold calls per task, facts, argument values, failing calls."""

    name: str
    gold: dict[str, tuple[Call, ...]]
    facts: dict[str, tuple[str, ...]]
    values: dict[tuple[str, str], tuple[Any, ...]]
    failing: tuple[Call, ...]


def build_pool(name: str, tasks: dict[str, Any], failing: tuple[Call, ...]) -> DomainPool:
    """Index tau2 tasks: each task's gold calls and facts, and every value any gold call gives each argument."""
    gold: dict[str, tuple[Call, ...]] = {}
    facts: dict[str, tuple[str, ...]] = {}
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    for task_id, task in tasks.items():
        crit = task.evaluation_criteria
        actions = (crit.actions or []) if crit else []
        gold[task_id] = tuple(Call(a.name, dict(a.arguments), a.requestor) for a in actions)
        facts[task_id] = tuple((crit.communicate_info or []) if crit else [])
        for a in actions:
            for key, value in a.arguments.items():
                seen.setdefault((a.name, key), {})[json.dumps(value, sort_keys=True)] = value
    values = {k: tuple(v[s] for s in sorted(v)) for k, v in seen.items()}
    return DomainPool(name, gold, facts, values, failing)


def _nearby(value: Any) -> list[Any]:
    """Valid-looking neighbours of a value: case, a changed character, one list element less, off by one."""
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int | float):
        return [value + 1, value * 2, str(value)]
    if isinstance(value, str):
        out = [value.upper(), value + "0", value[:-1]] if value else ["x"]
        return [v for v in out if v != value]
    if isinstance(value, list):
        return [value[:-1], list(reversed(value)), value + value[:1]] if value else [["x"]]
    if isinstance(value, dict):
        return [{}, {**value, "extra": 1}]
    return ["x"]


@st.composite
def _perturbed(draw, pool: DomainPool, call: Call) -> Call:
    if not call.arguments:
        return Call(call.name, {"unexpected": draw(st.sampled_from(["x", 1]))}, call.requestor)
    key = draw(st.sampled_from(sorted(call.arguments)))
    current = call.arguments[key]
    options = [v for v in pool.values.get((call.name, key), ()) if v != current] + _nearby(current)
    new = draw(st.sampled_from(options))
    return Call(call.name, {**call.arguments, key: new}, call.requestor)


@st.composite
def _edited_calls(draw, pool: DomainPool, task_id: str) -> tuple[list[Call], list[str]]:
    calls = list(pool.gold[task_id])
    # half the draws edit the calls (every task's untouched gold transcript is also checked on its own)
    edits = draw(st.one_of(st.just([]), st.lists(st.sampled_from(EDITS), min_size=1, max_size=3)))
    notes = []
    for edit in edits:
        if edit == "fail" or not calls:
            bad = draw(st.sampled_from(pool.failing))
            calls.insert(draw(st.integers(0, len(calls))), bad)
            notes.append(f"fail:{bad.name}")
            continue
        i = draw(st.integers(0, len(calls) - 1))
        if edit == "perturb":
            calls[i] = draw(_perturbed(pool, calls[i]))
        elif edit == "drop":
            calls.pop(i)
        elif edit == "repeat":
            calls.insert(draw(st.integers(i + 1, len(calls))), calls[i])
        elif edit == "move":
            call = calls.pop(i)
            calls.insert(draw(st.integers(0, len(calls))), call)
        elif edit == "extra_arg":
            calls[i] = Call(calls[i].name, {**calls[i].arguments, "note": "extra"}, calls[i].requestor)
        notes.append(f"{edit}@{i}")
    return calls, notes


def _reformat(fact: str, how: str) -> str:
    if how == "upper":
        return fact.upper()
    if how == "commas":  # 1234.5 -> 1,234.5 (tau2 strips commas from the message before matching)
        head, dot, tail = fact.partition(".")
        if head.isdigit() and len(head) > 3:
            return f"{int(head):,}{dot}{tail}"
        return fact
    if how == "digit":
        for i, ch in enumerate(fact):
            if ch.isdigit():
                return fact[:i] + str((int(ch) + 1) % 10) + fact[i + 1:]
        return fact + "!"
    if how == "dollar":
        return f"${fact}"
    if how == "punct":
        return fact.replace(".", ",") if "." in fact else fact + "."
    return fact


@st.composite
def _facts_text(draw, pool: DomainPool, task_id: str) -> tuple[str | None, list[str]]:
    facts = pool.facts[task_id]
    hows = draw(st.lists(st.sampled_from(("as_is", "as_is", "omit", "upper", "commas", "digit", "dollar", "punct")),
                         min_size=len(facts), max_size=len(facts)))
    parts = [_reformat(f, how) for f, how in zip(facts, hows, strict=True) if how != "omit"]
    notes = [f"fact:{how}" for how in hows if how != "as_is"]
    text = draw(st.sampled_from(["Done. " + "; ".join(parts), " ".join(parts), "", "   "])) if parts else \
        draw(st.sampled_from(["Done.", "", None]))
    return text, notes


@st.composite
def _grouped(draw, calls: list[Call]) -> list[Turn]:
    """Consecutive calls of one side may share a message (parallel calls); some carry text."""
    turns: list[Turn] = []
    for call in calls:
        role = "assistant" if call.requestor == "assistant" else "user"
        joins = turns and turns[-1].calls and turns[-1].role == role and draw(st.booleans())
        if joins:
            last = turns.pop()
            turns.append(Turn(role, last.text, (*last.calls, call)))
        else:
            text = draw(st.sampled_from([None, None, "", "Let me check."]))
            turns.append(Turn(role, text, (call,)))
    return turns


@st.composite
def _ending(draw) -> tuple[list[Turn], str | None, str]:
    how = draw(st.sampled_from(("user_stop", "user_stop", "agent_stop", "premature")))
    if how == "user_stop":
        recorded = draw(st.sampled_from([None, "user_stop"]))
        return [Turn("user", draw(st.sampled_from(USER_STOPS)))], recorded, "user_stop"
    if how == "agent_stop":
        return [Turn("assistant", "Goodbye. ###STOP###")], "agent_stop", "agent_stop"
    recorded = draw(st.sampled_from(PREMATURE))
    last = draw(st.sampled_from([[], [Turn("user", "STOP please, no wait")], [Turn("assistant", "Anything else?")]]))
    return last, recorded, f"premature:{recorded}"


@st.composite
def transcripts(draw, pool: DomainPool, task_ids: list[str]) -> Plan:
    task_id = draw(st.sampled_from(task_ids))
    calls, notes = draw(_edited_calls(pool, task_id))
    turns = [Turn("assistant", "Hi! How can I help you today?"), Turn("user", "I need help with my request.")]
    turns += draw(_grouped(calls))
    facts, fact_notes = draw(_facts_text(pool, task_id))
    if facts is not None:
        where = draw(st.sampled_from(("own_message", "own_message", "with_last_call")))
        if where == "with_last_call" and turns[-1].calls and turns[-1].role == "assistant":
            last = turns.pop()
            turns.append(Turn("assistant", facts, last.calls))
        else:
            turns.append(Turn("assistant", facts))
    tail, recorded, ending = draw(_ending())
    turns += tail
    kind = "+".join(n.split("@")[0].split(":")[0] for n in notes) or "gold"
    return Plan(pool.name, task_id, kind, tuple(turns), recorded, (*notes, *fact_notes, ending))


def gold_plan(pool: DomainPool, task_id: str, stop: bool = True) -> Plan:
    """The gold transcript: every gold call in order, every fact, a user stop (or no stop: a premature end)."""
    turns = [Turn("assistant", "Hi! How can I help you today?"), Turn("user", "I need help with my request.")]
    turns += [Turn("assistant" if c.requestor == "assistant" else "user", None, (c,)) for c in pool.gold[task_id]]
    turns.append(Turn("assistant", "Done. " + "; ".join(pool.facts[task_id])))
    if stop:
        turns.append(Turn("user", "Thanks, that's all. ###STOP###"))
    return Plan(pool.name, task_id, "gold" if stop else "no_stop", tuple(turns), None if stop else "max_steps")

"""tau2-bench's reward: DB, ENV_ASSERTION, ACTION, COMMUNICATE and NL_ASSERTION components.

The reward is the product of the components named in the task's ``reward_basis``.
An episode that did not end by a user or agent stop scores 0 (components are still
reported). NL_ASSERTION needs a judge; without one it is reported as skipped and left
out of the product, never counted as passed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ctu.domains.base import DBView, Domain, Task, run_tool

NORMAL_ENDINGS = ("user_stop", "agent_stop")
COMPONENTS = ("DB", "ENV_ASSERTION", "ACTION", "COMMUNICATE", "NL_ASSERTION")


Verdicts = list[tuple[bool, str]]


class NLJudge(Protocol):
    """Decides natural-language assertions over a conversation: (met, reason) for each."""

    async def judge(self, assertions: Sequence[str], messages: Sequence[Mapping[str, Any]]) -> Verdicts: ...


async def nl_verdicts(judge: NLJudge | None, task: Task, messages: Sequence[Mapping[str, Any]]) -> Verdicts | None:
    """The judge's verdicts on the task's NL assertions, or None when there is no judge or nothing to judge."""
    if judge is None or not task.nl_assertions or "NL_ASSERTION" not in task.reward_basis:
        return None
    verdicts = await judge.judge(task.nl_assertions, messages)
    if len(verdicts) != len(task.nl_assertions):
        raise ValueError(f"judge returned {len(verdicts)} verdicts for {len(task.nl_assertions)} assertions")
    return verdicts


@dataclass(frozen=True)
class Reward:
    """An episode's reward with each component and the reasons checks failed."""

    reward: float
    components: dict[str, float]
    skipped: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()
    termination: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "reward": self.reward,
            "components": dict(self.components),
            "skipped": list(self.skipped),
            "reasons": list(self.reasons),
            "termination": self.termination,
        }


@dataclass(frozen=True)
class CalledTool:
    """A tool call taken from a transcript (arguments as the model gave them)."""

    name: str
    arguments: Any


def gold_db(domain: Domain, task: Task) -> DBView:
    """The DB after replaying the task's gold actions on a fresh copy (cached per task)."""
    cache = domain.__dict__.setdefault("_gold_dbs", {})
    view = cache.get(task.id)
    if view is None:
        view = domain.new_db()
        for action in task.actions:
            run_tool(domain.tool(action.name), view, dict(action.arguments), action.name)
        cache[task.id] = view
    return view


def replay(domain: Domain, calls: Iterable[CalledTool]) -> DBView:
    """A fresh DB with the state-changing calls of a transcript re-executed in order.

    As in tau2's replay, read-only tools and unknown tool names are skipped; recorded
    outputs are ignored.
    """
    view = domain.new_db()
    for call in calls:
        tool = domain.tool(call.name)
        if tool is not None and tool.mutates:
            run_tool(tool, view, call.arguments, call.name)
    return view


def assistant_tool_calls(messages: Sequence[Mapping[str, Any]]) -> list[CalledTool]:
    """Tool calls of the assistant messages, in order; JSON-string arguments decoded."""
    calls = []
    for msg in messages:
        if msg.get("role") != "assistant":
            continue
        for tc in msg.get("tool_calls") or []:
            fn = tc.get("function", tc)
            args = fn.get("arguments", {})
            if isinstance(args, str):
                try:
                    args = json.loads(args) if args.strip() else {}
                except json.JSONDecodeError:
                    pass  # stays a string: the replay reports it as invalid arguments
            calls.append(CalledTool(name=str(fn.get("name", "")), arguments=args))
    return calls


def _db_component(domain: Domain, task: Task, final_db: DBView) -> tuple[float, list[str]]:
    if not task.checks_db:
        return 1.0, []
    differing = final_db.diff(gold_db(domain, task))
    if not differing:
        return 1.0, []
    shown = ", ".join(f"{t}/{k}" for t, k in differing[:5])
    more = f" (+{len(differing) - 5} more)" if len(differing) > 5 else ""
    return 0.0, [f"DB: records differ from the gold outcome: {shown}{more}"]


def _env_assertion_component(domain: Domain, task: Task, final_db: DBView) -> tuple[float, list[str]]:
    reasons = []
    for assertion in task.env_assertions:
        fn = domain.assertions.get(assertion.func_name)
        if fn is None:
            reasons.append(f"ENV_ASSERTION: unknown assertion function '{assertion.func_name}'")
            continue
        if bool(fn(final_db, **assertion.arguments)) != assertion.assert_value:
            reasons.append(f"ENV_ASSERTION: {assertion.message or assertion.func_name} failed")
    return (0.0 if reasons else 1.0), reasons


def _action_component(task: Task, calls: Sequence[CalledTool]) -> tuple[float, list[str]]:
    reasons = []
    for action in task.actions:
        if not any(isinstance(c.arguments, dict) and action.matches(c.name, c.arguments) for c in calls):
            reasons.append(f"ACTION: expected call {action.name}({json.dumps(action.arguments, sort_keys=True)}) not made")
    return (0.0 if reasons else 1.0), reasons


def communicated(info: str, messages: Sequence[Mapping[str, Any]]) -> bool:
    """tau2's check: ``info`` lowercased is in some assistant text, lowercased, commas removed."""
    needle = info.lower()
    for msg in messages:
        content = msg.get("content")
        if msg.get("role") == "assistant" and isinstance(content, str) and content.strip():
            if needle in content.lower().replace(",", ""):
                return True
    return False


def _communicate_component(task: Task, messages: Sequence[Mapping[str, Any]]) -> tuple[float, list[str]]:
    reasons = [f"COMMUNICATE: '{info}' was not communicated" for info in task.communicate_info
               if not communicated(info, messages)]
    return (0.0 if reasons else 1.0), reasons


def compute_reward(
    domain: Domain,
    task: Task,
    messages: Sequence[Mapping[str, Any]],
    final_db: DBView,
    termination: str | None,
    verdicts: Verdicts | None = None,
) -> Reward:
    """Score an episode: its clean messages, its final DB and how it ended.

    ``verdicts`` are a judge's answers for the task's NL assertions (see :func:`nl_verdicts`);
    without them NL_ASSERTION is skipped, never counted as passed.
    """
    if not task.has_criteria:
        reward = 1.0 if termination in NORMAL_ENDINGS else 0.0
        return Reward(reward, {}, termination=termination)
    basis = task.reward_basis
    calls = assistant_tool_calls(messages)
    components: dict[str, float] = {}
    reasons: list[str] = []
    skipped: list[str] = []
    checks = {
        "DB": lambda: _db_component(domain, task, final_db),
        "ENV_ASSERTION": lambda: _env_assertion_component(domain, task, final_db),
        "ACTION": lambda: _action_component(task, calls),
        "COMMUNICATE": lambda: _communicate_component(task, messages),
    }
    for name in basis:
        if name in checks:
            value, why = checks[name]()
        elif name == "NL_ASSERTION":
            if not task.nl_assertions:
                value, why = 1.0, []  # tau2: nothing to evaluate counts as met
            elif verdicts is None:
                skipped.append(name)
                continue
            else:
                why = [f"NL_ASSERTION: '{a}' not met: {r}"
                       for a, (ok, r) in zip(task.nl_assertions, verdicts, strict=True) if not ok]
                value = 0.0 if why else 1.0
        else:
            raise ValueError(f"task {task.id}: unknown reward_basis component '{name}'")
        components[name] = value
        reasons.extend(why)
    reward = 1.0
    for value in components.values():
        reward *= value
    if termination not in NORMAL_ENDINGS:
        reasons.insert(0, f"episode ended by '{termination}', not by a user or agent stop: reward 0")
        reward = 0.0
    return Reward(reward, components, tuple(skipped), tuple(reasons), termination)


def score_transcript(
    domain: Domain,
    task: Task,
    messages: Sequence[Mapping[str, Any]],
    termination: str | None,
    verdicts: Verdicts | None = None,
) -> Reward:
    """Score a recorded transcript: its tool calls are re-executed on a fresh DB."""
    final_db = replay(domain, assistant_tool_calls(messages))
    return compute_reward(domain, task, messages, final_db, termination, verdicts)

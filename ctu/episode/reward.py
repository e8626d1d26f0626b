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

from ctu.domains.base import DBView, Domain, Task

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
    """A tool call taken from a transcript (arguments as the model gave them); ``requestor``: who called it."""

    name: str
    arguments: Any
    requestor: str = "assistant"


def gold_db(domain: Domain, task: Task) -> DBView:
    """The DB after replaying the task's gold actions (each on its side) on the task's initial state (cached).

    As tau2's gold environment: the actions run without the sync that live tool calls get.
    """
    cache = domain.__dict__.setdefault("_gold_dbs", {})
    view = cache.get(task.id)
    if view is None:
        view = domain.initial_db(task)
        for action in task.actions:
            domain.call(action.requestor, action.name, dict(action.arguments), view, sync=False)
        cache[task.id] = view
    return view


def replay(domain: Domain, calls: Iterable[CalledTool], task: Task | None = None) -> DBView:
    """The task's initial DB with the calls of a transcript re-executed in order, each on its side.

    As in tau2's replay, unknown tool names fail without effect and recorded outputs are ignored;
    read-only tools are skipped unless the domain couples the two sides (their success syncs them).
    """
    view = domain.initial_db(task) if task is not None else domain.new_db()
    for call in calls:
        tool = domain.tool(call.name) if call.requestor == "assistant" else domain.user_tool(call.name)
        if tool is not None and (tool.mutates or domain.sync is not None):
            domain.call(call.requestor, call.name, call.arguments, view)
    return view


def assistant_tool_calls(messages: Sequence[Mapping[str, Any]]) -> list[CalledTool]:
    """Tool calls of the assistant messages, in order; JSON-string arguments decoded."""
    return [c for c in tool_calls(messages) if c.requestor == "assistant"]


def tool_calls(messages: Sequence[Mapping[str, Any]]) -> list[CalledTool]:
    """Tool calls of the assistant's and the user's messages (dual control), in order; arguments decoded."""
    calls = []
    for msg in messages:
        if msg.get("role") not in ("assistant", "user"):
            continue
        for tc in msg.get("tool_calls") or []:
            fn = tc.get("function", tc)
            args = fn.get("arguments", {})
            if isinstance(args, str):
                try:
                    args = json.loads(args) if args.strip() else {}
                except json.JSONDecodeError:
                    pass  # stays a string: the replay reports it as invalid arguments
            calls.append(CalledTool(name=str(fn.get("name", "")), arguments=args, requestor=msg["role"]))
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
        fn = domain.function(assertion.env_type, assertion.func_name)
        if fn is None:
            reasons.append(f"ENV_ASSERTION: unknown {assertion.env_type} assertion function '{assertion.func_name}'")
            continue
        what = f"{assertion.env_type} {assertion.func_name}({_args_text(assertion.arguments)})"
        what += f" ({assertion.message})" if assertion.message else ""
        try:
            met = fn(final_db, **assertion.arguments) == assertion.assert_value
        except Exception as exc:  # tau2's assertion functions raise on a missing record: not met
            reasons.append(f"ENV_ASSERTION: {what} raised: {exc}")
            continue
        if not met:
            reasons.append(f"ENV_ASSERTION: {what} failed")
    return (0.0 if reasons else 1.0), reasons


def _args_text(arguments: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in arguments.items())


def _action_component(task: Task, calls: Sequence[CalledTool]) -> tuple[float, list[str]]:
    reasons = []
    for action in task.actions:
        if not any(isinstance(c.arguments, dict) and action.matches(c.name, c.arguments) for c in calls):
            reasons.append(f"ACTION: expected call {action.name}({json.dumps(action.arguments, sort_keys=True)}) not made")
    return (0.0 if reasons else 1.0), reasons


def communicated(info: str, messages: Sequence[Mapping[str, Any]], to_user: bool = False) -> bool:
    """tau2's check: ``info`` lowercased is in some assistant text, lowercased, commas removed; ``to_user``
    (``Domain.communicate_to_user``): in the text of an assistant message with no tool call, one the user got."""
    needle = info.lower()
    for msg in messages:
        content = msg.get("content")
        if to_user and msg.get("tool_calls"):
            continue
        if msg.get("role") == "assistant" and isinstance(content, str) and content.strip():
            if needle in content.lower().replace(",", ""):
                return True
    return False


def _communicate_component(task: Task, messages: Sequence[Mapping[str, Any]],
                           to_user: bool) -> tuple[float, list[str]]:
    reasons = [f"COMMUNICATE: '{info}' was not communicated" for info in task.communicate_info
               if not communicated(info, messages, to_user)]
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
    calls = tool_calls(messages)  # tau2 matches gold actions against the user's tool calls too
    components: dict[str, float] = {}
    reasons: list[str] = []
    skipped: list[str] = []
    checks = {
        "DB": lambda: _db_component(domain, task, final_db),
        "ENV_ASSERTION": lambda: _env_assertion_component(domain, task, final_db),
        "ACTION": lambda: _action_component(task, calls),
        "COMMUNICATE": lambda: _communicate_component(task, messages, domain.communicate_to_user),
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
    """Score a recorded transcript: its tool calls (agent's and user's) are re-executed on the task's initial DB."""
    final_db = replay(domain, tool_calls(messages), task)
    return compute_reward(domain, task, messages, final_db, termination, verdicts)

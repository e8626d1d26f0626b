"""tau2-bench 1.0.1's own cost of a banking_knowledge episode (for benchmarks/env_throughput.py --tau2).

The same episode as ctu's: an environment for the task (bm25 variant, the task's read-log allowlist) in its initial
state, the KB_search calls, every gold action (agent's and user's) through ``Environment.get_response``, and
tau2's reward: ``evaluate_simulation`` on the recorded messages, with the env kwargs tau2's runner passes. tau2
builds a fresh environment (the knowledge base read from its 698 files, a BM25 index) for the live episode and
for each of the evaluator's three; ``cached=True`` loads the knowledge base and builds each pipeline once instead,
to show tau2's cost without that.
"""

from __future__ import annotations

import functools
import time

from loguru import logger
from tau2.data_model.message import AssistantMessage, ToolCall, UserMessage
from tau2.data_model.simulation import SimulationRun, TerminationReason
from tau2.domains.banking_knowledge import environment as tau2_env
from tau2.domains.banking_knowledge import retrieval as tau2_retrieval
from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation
from tau2.runner.build import _derive_read_log_allowlist

logger.remove()  # tau2 logs every tool response at DEBUG; its runner logs at a chosen level (ERROR here)
logger.add(lambda message: None, level="ERROR")


def cache_knowledge_base() -> None:
    """Load the knowledge base once, and build each retrieval pipeline once (same content every time)."""
    tau2_env.get_knowledge_base = functools.cache(tau2_env.get_knowledge_base)
    built: dict = {}
    original = tau2_retrieval._create_kb_pipeline

    def pipeline(spec, knowledge_base):
        key = (repr(spec), id(knowledge_base))
        if key not in built:
            built[key] = original(spec, knowledge_base)
        return built[key]

    tau2_retrieval._create_kb_pipeline = pipeline


def episode(task, queries: list[str]) -> float:
    kwargs = {"retrieval_variant": "bm25", "read_log_allowlist": _derive_read_log_allowlist(task)}
    env = tau2_env.get_environment(task=task, **kwargs)
    init = task.initial_state
    env.set_state(initialization_data=init.initialization_data if init else None,
                  initialization_actions=init.initialization_actions if init else None, message_history=[])
    messages = [AssistantMessage(role="assistant", content="Hi! How can I help you today?"),
                UserMessage(role="user", content="I need help.")]
    calls = [("KB_search", {"query": q}, "assistant") for q in queries]
    calls += [(a.name, dict(a.arguments), a.requestor) for a in task.evaluation_criteria.actions or []]
    for n, (name, arguments, requestor) in enumerate(calls):
        call = ToolCall(id=f"c{n}", name=name, arguments=arguments, requestor=requestor)
        cls = AssistantMessage if requestor == "assistant" else UserMessage
        messages.append(cls(role=requestor, content=None, tool_calls=[call]))
        messages.append(env.get_response(call))
    messages += [AssistantMessage(role="assistant", content="Done."), UserMessage(role="user", content="###STOP###")]
    run = SimulationRun(id="b", task_id=task.id, start_time="", end_time="", duration=0.0,
                        termination_reason=TerminationReason.USER_STOP, messages=messages)
    return evaluate_simulation(run, task, EvaluationType.ALL, solo_mode=False, domain="banking_knowledge",
                               env_kwargs=kwargs).reward


def throughput(n: int, queries_of, cached: bool) -> tuple[float, int]:
    """(episodes per second, episodes with reward 1.0) over ``n`` episodes cycling through the tasks."""
    if cached:
        cache_knowledge_base()
    tasks = [t for t in tau2_env.get_tasks() if "NL_ASSERTION" not in [r.value for r in
                                                                      t.evaluation_criteria.reward_basis]]
    started = time.perf_counter()
    perfect = sum(episode(tasks[i % len(tasks)], queries_of(tasks[i % len(tasks)])) == 1.0 for i in range(n))
    return n / (time.perf_counter() - started), perfect

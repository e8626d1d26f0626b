"""tau2-bench's banking_knowledge domain: a bank's customer service where the policy is in a knowledge base.

ctu's own implementation of tau2-bench 1.0.1's semantics over the data of a tau2-bench checkout (see
:mod:`.data`): 97 tasks, 698 knowledge-base documents, the bank's 23 tables. The agent has 14 base tools
(:mod:`.agent_tools`) plus retrieval tools that depend on the variant (:mod:`.retrieval`; default ``bm25``:
``KB_search``), and 44 discoverable tools the knowledge base documents, unlocked with
``unlock_discoverable_agent_tool`` and run with ``call_discoverable_agent_tool``. The user has 6 tools and 4
discoverable ones the agent gives them (:mod:`.user_tools`) — dual control, as telecom.

Tools answer exactly as tau2's (texts, errors and error flags; see :mod:`.toolkit`), ids are tau2's deterministic
hashes (:mod:`.ids`), and the reward is tau2's: the DB (the task's gold actions replayed, read calls to
discoverable tools logged only when the gold actions make them) or the gold ACTIONs. There is no train/test split:
the split ``all`` holds the 97 tasks.
"""

from __future__ import annotations

from ctu.domains.banking_knowledge.agent_tools import AGENT, BASE_TOOLS, DISCOVERABLE_TOOLS
from ctu.domains.banking_knowledge.data import (
    apply_initialization_data,
    find_data_dir,
    read_db,
    read_documents,
    read_tasks,
)
from ctu.domains.banking_knowledge.retrieval import (
    DEFAULT_VARIANT,
    KnowledgeBase,
    grep_method,
    kb_search_method,
    policy_builder,
    resolve_variant,
)
from ctu.domains.banking_knowledge.store import start_session
from ctu.domains.banking_knowledge.toolkit import USER, as_tool
from ctu.domains.base import DBView, Domain, Task

__all__ = ["BASE_TOOLS", "DISCOVERABLE_TOOLS", "load", "read_log_allowlist"]


def read_log_allowlist(task: Task) -> frozenset[str]:
    """The discoverable tools the task's gold actions call (tau2 1.0.1's ``_derive_read_log_allowlist``)."""
    return frozenset(a.arguments.get("agent_tool_name") for a in task.actions  # type: ignore[misc]
                     if a.name == "call_discoverable_agent_tool" and a.arguments.get("agent_tool_name"))


def _prepare(task: Task, view: DBView) -> None:
    apply_initialization_data(task, view)
    start_session(view, read_log_allowlist(task))


def load(data_dir: str | None = None, retrieval_variant: str | None = None) -> Domain:
    """The domain over the data of a tau2-bench checkout, with a retrieval variant (default ``bm25``)."""
    variant = resolve_variant(retrieval_variant or DEFAULT_VARIANT)
    folder = find_data_dir(data_dir)
    kb = KnowledgeBase(read_documents(folder))
    tasks, required = read_tasks(folder)
    policy, task_policy = policy_builder(variant, folder / "prompts", kb, lambda task_id: required.get(task_id, ()))
    retrieval = ([kb_search_method(kb)] if variant.kb_search else []) + ([grep_method(kb)] if variant.grep else [])
    tools = tuple(as_tool(m) for m in [*retrieval, *(AGENT[name] for name in BASE_TOOLS)])
    user_tools = tuple(as_tool(m) for m in USER.values() if not m.discoverable)
    # tau2's toolkits also run a discoverable tool called directly by its name (no unlock, no log entry)
    unlisted = tuple(as_tool(AGENT[name]) for name in DISCOVERABLE_TOOLS)
    unlisted_user = tuple(as_tool(m) for m in USER.values() if m.discoverable)
    return Domain(name="banking_knowledge", policy=policy, tools=tools, db=read_db(folder), tasks=tasks, splits={},
                  transfer_tool=None, user_tools=user_tools, prepare=_prepare, unlisted_tools=unlisted,
                  unlisted_user_tools=unlisted_user,
                  task_policy=None if task_policy is None else (lambda task: task_policy(task.id)))

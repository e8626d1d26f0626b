"""banking_knowledge: ctu against tau2-bench 1.0.1's own environment and evaluator (``nox -s oracle``).

Every transcript is recorded from tau2's live environment (bm25_grep variant, so KB_search and grep answer), then
ctu re-runs every call (agent's and user's, in order) on its own environment: each output must equal tau2's
(KB_search's wall-clock timing string aside) with the same error flag; and ctu's reward and components must equal
tau2's ``evaluate_simulation`` with the task's read-log allowlist. Transcripts are every task's gold transcript and
hypothesis draws: gold calls perturbed, dropped, repeated, moved, with wrong arguments, failing calls inserted
(unknown and discoverable tools called directly, calls before unlocking, bad JSON, user-side calls), and gold
transcripts with their unlocks removed. task_102's reward needs an LLM judge (NL_ASSERTION): it is left out.
Also equal to tau2's: the tool schemas and the agent's policy of each offline variant, every discoverable tool's
unlock and give texts, and KB_search/grep answers to a set of queries.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os

import pytest

pytest.importorskip("tau2.domains.banking_knowledge", reason="tau2-bench 1.0.1 is not installed (run `nox -s oracle`)")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from ctu.domains.banking_knowledge import load  # noqa: E402
from ctu.domains.banking_knowledge.agent_tools import DISCOVERABLE_TOOLS  # noqa: E402
from ctu.domains.banking_knowledge.retrieval import VARIANTS  # noqa: E402
from ctu.domains.banking_knowledge.toolkit import USER  # noqa: E402
from ctu.episode.reward import score_transcript  # noqa: E402
from ctu.episode.transcripts import ending, parse_line  # noqa: E402
from tests.oracle import bridge, conftest  # noqa: E402
from tests.oracle.banking_bridge import LIVE_VARIANT, BankingOracle, policy, schemas, untimed  # noqa: E402
from tests.oracle.strategies import Call, build_pool, gold_plan, transcripts  # noqa: E402

EXAMPLES = int(os.environ.get("ORACLE_EXAMPLES", 300))
DATA = os.environ.get("TAU2_DATA_DIR")
STATEMENT = json.dumps({"user_id": "u1", "credit_card_account_id": "cc_1", "amount": "ten", "reason": "other"})
FAILING = (
    Call("no_such_tool", {"x": 1}), Call("freeze_debit_card_3892", {"card_id": "dbc_x"}),
    Call("call_discoverable_agent_tool", {"agent_tool_name": "freeze_debit_card_3892",
                                          "arguments": json.dumps({"card_id": "dbc_x"})}),
    Call("unlock_discoverable_agent_tool", {"agent_tool_name": "apply_statement_credit_8472"}),
    Call("call_discoverable_agent_tool", {"agent_tool_name": "apply_statement_credit_8472", "arguments": STATEMENT}),
    Call("call_discoverable_agent_tool", {"agent_tool_name": "apply_statement_credit_8472", "arguments": "{oops"}),
    Call("unlock_discoverable_agent_tool", {"agent_tool_name": "no_such_tool_1234"}),
    Call("get_user_information_by_id", {}), Call("get_user_information_by_id", {"user_id": 42}),
    Call("log_verification", {"name": "x"}), Call("KB_search", {"query": "credit card annual fee"}),
    Call("KB_search", {"query": 7}), Call("grep", {"pattern": "fee|charge"}), Call("grep", {"pattern": "("}),
    Call("give_discoverable_user_tool", {"discoverable_tool_name": "deposit_check_3847",
                                         "arguments": json.dumps({"account_id": "x"})}),
    Call("give_discoverable_user_tool", {"discoverable_tool_name": "nope"}),
    Call("transfer_to_human_agents", {"summary": "s", "reason": "not_a_reason"}),
    Call("list_discoverable_agent_tools", {}), Call("get_current_time", {"tool_name": "x"}),
    Call("call_discoverable_user_tool", {"discoverable_tool_name": "deposit_check_3847",
                                         "arguments": json.dumps({"account_id": "x", "check_amount": 5})}, "user"),
    Call("call_discoverable_user_tool", {"discoverable_tool_name": "get_referral_link",
                                         "arguments": json.dumps(["user_id", "card_name"])}, "user"),
    Call("request_human_agent_transfer", {}, "user"), Call("list_discoverable_user_tools", {}, "user"),
    Call("apply_for_credit_card", {"card_type": "Gold Rewards Card", "customer_name": "X", "annual_income": "lots"},
         "user"),
    Call("submit_transaction", {"user_id": "u", "credit_card_type": "Gold Rewards Card", "merchant_name": "m",
                                "amount": "12", "category": "Travel"}, "user"),
    Call("transfer_to_human_agents", {"summary": "x"}, "user"),
)


@functools.cache
def _oracle():
    oracle = BankingOracle()
    pool = build_pool("banking_knowledge", oracle.tasks, FAILING)
    usable = [tid for tid, t in oracle.tasks.items() if "NL_ASSERTION" not in [r.value for r in
                                                                              t.evaluation_criteria.reward_basis]]
    no_unlock = dataclasses.replace(pool, gold={tid: tuple(c for c in calls if c.name != "unlock_discoverable_agent_tool")
                                                for tid, calls in pool.gold.items()})
    return oracle, pool, no_unlock, usable


@functools.cache
def _ctu(variant: str = LIVE_VARIANT):
    return load(DATA, variant)


def _ctu_outputs(task_id: str, messages: list) -> dict[str, tuple[str, bool]]:
    """ctu's output and error flag for every call of the transcript, run in order on ctu's live environment."""
    domain = _ctu()
    view = domain.initial_db(domain.task(task_id))
    out = {}
    for msg in messages:
        for tc in msg.get("tool_calls") or []:
            fn = tc["function"]
            result = domain.call("user" if msg["role"] == "user" else "assistant", fn["name"],
                                 json.loads(fn["arguments"]), view)
            out[tc["id"]] = (result.content, result.error)
    return out


def check_agreement(plan) -> None:
    oracle, _, _, _ = _oracle()
    messages, errors = oracle.materialize(plan)
    domain = _ctu()
    record = parse_line(json.dumps({"task_id": plan.task_id, "messages": messages, "termination": plan.termination}))
    ours = score_transcript(domain, domain.task(record.task_id), record.messages,
                            ending(record.messages, record.termination))
    theirs = oracle.score(plan.task_id, messages, plan.termination)
    problems = []
    if ours.reward != theirs.reward:
        problems.append(f"reward: ctu {ours.reward} vs tau2 {theirs.reward}")
    if ours.components != theirs.components:
        problems.append(f"components: ctu {ours.components} vs tau2 {theirs.components}")
    if ours.skipped:
        problems.append(f"ctu skipped {list(ours.skipped)}")
    recorded = {m["tool_call_id"]: m["content"] for m in messages if m["role"] == "tool"}
    for call_id, (content, error) in _ctu_outputs(plan.task_id, messages).items():
        if untimed(content) != untimed(recorded[call_id]) or error != errors[call_id]:
            problems.append(f"output of {call_id} (error ctu {error}, tau2 {errors[call_id]}): "
                            f"ctu {content[:300]!r} vs tau2 {recorded[call_id][:300]!r}")
    key = hashlib.sha256(json.dumps([plan.task_id, messages, plan.termination]).encode()).hexdigest()
    conftest.record("banking_knowledge", plan.kind, key, theirs.reward, not problems,
                    f"task {plan.task_id}: {problems[:1]}")
    if problems:
        raise AssertionError(f"ctu and tau2 disagree on task {plan.task_id} ({plan.kind}; {list(plan.notes)}):\n  "
                             + "\n  ".join(problems[:5]) + f"\n  ctu reasons: {list(ours.reasons)}\n"
                             + bridge.dump(messages, plan.termination))


def test_every_gold_transcript_agrees():
    _, pool, _, usable = _oracle()
    assert len(usable) == 96
    for task_id in usable:
        check_agreement(gold_plan(pool, task_id))


@st.composite
def _plans(draw):
    _, pool, no_unlock, usable = _oracle()
    if draw(st.integers(0, 4)) == 0:  # a fifth: the gold calls without their unlocks, then the usual edits
        plan = draw(transcripts(no_unlock, usable))
        return dataclasses.replace(plan, kind=f"no_unlock+{plan.kind}")
    return draw(transcripts(pool, usable))


@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(_plans())
def test_ctu_and_tau2_agree_on_drawn_transcripts(plan):
    check_agreement(plan)


def test_the_oracle_sees_a_wrong_score():
    oracle, pool, _, usable = _oracle()
    task_id = next(t for t in usable if any(c.name == "call_discoverable_agent_tool" for c in pool.gold[t]))
    messages, _ = oracle.materialize(gold_plan(pool, task_id))
    assert oracle.score(task_id, messages, None).reward == 1.0
    dropped = [m for m in messages if not (m.get("tool_calls") or m["role"] == "tool")]
    assert oracle.score(task_id, dropped, None).reward == 0.0


def _shape(schema: dict) -> dict:
    """An OpenAI tool schema without pydantic's titles (ctu writes none) and an empty 'required' list."""
    fn = schema["function"]
    params = fn["parameters"]
    props = {name: {k: v for k, v in p.items() if k != "title"} for name, p in params["properties"].items()}
    return {"name": fn["name"], "description": fn["description"], "properties": props,
            "required": sorted(params.get("required", []))}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_tool_schemas_equal_tau2s(variant):
    oracle, *_ = _oracle()
    agent, user = schemas(variant, oracle)
    domain = _ctu(variant)
    assert [_shape(s) for s in domain.openai_tools()] == [_shape(s) for s in agent]
    assert [_shape(s) for s in domain.openai_user_tools()] == [_shape(s) for s in user]


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_policies_equal_tau2s(variant):
    oracle, _, _, usable = _oracle()
    domain = _ctu(variant)
    if variant == "golden_retrieval":
        for task_id in oracle.tasks:
            assert domain.policy_for(domain.task(task_id)) == policy(variant, task_id, oracle), task_id
    else:
        assert domain.policy == policy(variant, None, oracle)


def test_unlock_and_give_texts_equal_tau2s_for_every_discoverable_tool():
    oracle, _, _, usable = _oracle()
    env = oracle.initial_environment(usable[0])
    domain = _ctu()
    view = domain.initial_db(domain.task(usable[0]))
    calls = [("unlock_discoverable_agent_tool", {"agent_tool_name": n}) for n in DISCOVERABLE_TOOLS]
    calls += [("give_discoverable_user_tool", {"discoverable_tool_name": n, "arguments": "{}"})
              for n, m in USER.items() if m.discoverable]
    assert len(calls) == 48
    for i, (name, args) in enumerate(calls):
        theirs = env.get_response(bridge.ToolCall(id=str(i), name=name, arguments=args, requestor="assistant"))
        ours = domain.call("assistant", name, args, view)
        assert (ours.content, ours.error) == (theirs.content, theirs.error), name


def test_kb_search_and_grep_answer_as_tau2s():
    """Queries: the first words of every task's user instructions, and a few patterns and edge cases."""
    oracle, _, _, usable = _oracle()
    env = oracle.initial_environment(usable[0])
    domain = _ctu()
    view = domain.new_db()
    queries = [" ".join(str(t.user_scenario.instructions).split()[:n]) for t in oracle.tasks.values()
               for n in (6, 25)]
    calls = [("KB_search", {"query": q}) for q in [*queries, "", "   ", "zzqx", "fee", 0, None]]
    calls += [("grep", {"pattern": p}) for p in ["fee|charge", "credit.*card", "(", "zzqx", "", "Rho-Bank+", "\\d{4}"]]
    for i, (name, args) in enumerate(calls):
        theirs = env.get_response(bridge.ToolCall(id=str(i), name=name, arguments=args, requestor="assistant"))
        ours = domain.call("assistant", name, args, view)
        assert (untimed(ours.content), ours.error) == (untimed(theirs.content), theirs.error), args

"""banking_knowledge: data lookup, gold rewards, discoverable tools and their logging, retrieval variants, BM25.

Agreement with tau2 itself (outputs, rewards) is tests/oracle/test_banking_oracle.py's job (``nox -s oracle``).
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ctu.domains import get_domain
from ctu.domains.banking_knowledge import load, read_log_allowlist
from ctu.domains.banking_knowledge.retrieval import BM25Okapi
from ctu.episode.reward import score_transcript
from ctu.episode.transcripts import gold_transcript


@pytest.fixture(scope="module")
def bank(tau2_bench_data):
    return get_domain("banking_knowledge", tau2_bench_data)


def call(domain, db, name, requestor="assistant", **arguments):
    return domain.call(requestor, name, arguments, db)


def test_every_task_scores_one_on_its_gold_actions(bank):
    """What `ctu env check banking_knowledge` checks: 97 tasks, every one 1.0 on its gold actions."""
    assert len(bank.tasks) == 97
    failed = []
    for task in bank.tasks:
        reward = score_transcript(bank, task, gold_transcript(bank, task), "user_stop")
        if not all(v == 1.0 for v in reward.components.values()):
            failed.append((task.id, reward.reasons))
    assert failed == []


def test_the_reward_sees_a_wrong_db(bank):
    """The DB comparison can fail: a gold transcript without its last write scores 0."""
    task = next(t for t in bank.tasks if t.reward_basis == ("DB",) and t.actions[-1].name == "call_discoverable_agent_tool")
    messages = gold_transcript(bank, task)
    last_call = max(i for i, m in enumerate(messages) if m.get("tool_calls"))
    cut = messages[:last_call] + messages[last_call + 2:]
    assert score_transcript(bank, task, cut, "user_stop").components["DB"] == 0.0


def test_counts_of_tools(bank):
    from ctu.domains.banking_knowledge import BASE_TOOLS, DISCOVERABLE_TOOLS
    from ctu.domains.banking_knowledge.toolkit import USER

    assert len(BASE_TOOLS) == 14 and len(DISCOVERABLE_TOOLS) == 44
    assert [t.name for t in bank.tools][:2] == ["KB_search", "transfer_to_human_agents"]
    assert sum(m.discoverable for m in USER.values()) == 4 and len(bank.user_tools) == 6


def test_without_data_the_error_says_what_to_clone(monkeypatch, tmp_path):
    monkeypatch.delenv("TAU2_DATA_DIR", raising=False)
    monkeypatch.delenv("CTU_TAU2_DATA_DIR", raising=False)
    with pytest.raises(FileNotFoundError) as info:
        load(str(tmp_path))
    text = str(info.value)
    assert "\n" not in text and "git clone https://github.com/sierra-research/tau2-bench" in text
    assert "TAU2_DATA_DIR" in text and str(tmp_path) in text


def test_tau2_data_dir_variable_finds_the_checkout(monkeypatch, tau2_bench_data):
    monkeypatch.setenv("TAU2_DATA_DIR", tau2_bench_data)
    assert len(load(None, "no_knowledge").tasks) == 97


@pytest.mark.parametrize("name", ["alltools", "openai_embeddings", "bm25_reranker", "terminal_use"])
def test_a_variant_that_needs_the_network_is_refused_in_one_line(tau2_bench_data, name):
    with pytest.raises(ValueError) as info:
        load(tau2_bench_data, name)
    text = str(info.value)
    assert "\n" not in text and name in text
    assert "no_knowledge, full_kb, golden_retrieval, grep_only, bm25, bm25_grep" in text


@pytest.mark.parametrize("variant, tools", [("no_knowledge", []), ("full_kb", []), ("golden_retrieval", []),
                                            ("grep_only", ["grep"]), ("bm25", ["KB_search"]),
                                            ("bm25_grep", ["KB_search", "grep"])])
def test_each_variant_gives_its_retrieval_tools_first(tau2_bench_data, variant, tools):
    domain = load(tau2_bench_data, variant)
    names = [t.name for t in domain.tools]
    assert names[:len(tools)] == tools and len(names) == 14 + len(tools)


def test_full_kb_inlines_every_document_and_golden_only_the_tasks(tau2_bench_data):
    full = load(tau2_bench_data, "full_kb")
    assert full.policy.count("\n---\n") >= 697 and "{{full_knowledge_base}}" not in full.policy
    golden = load(tau2_bench_data, "golden_retrieval")
    task = golden.task("task_001")
    policy = golden.policy_for(task)
    assert "## Gold Rewards Card" in policy and policy.count("\n---\n") < 10
    assert golden.policy_for(golden.task("task_002")) != policy


def test_a_discoverable_tool_runs_only_once_unlocked(bank):
    db = bank.initial_db(bank.task("task_001"))
    args = json.dumps({"user_id": "x"})
    locked = call(bank, db, "call_discoverable_agent_tool", agent_tool_name="get_user_dispute_history_7291",
                  arguments=args)
    assert locked.content.startswith("Error: Tool 'get_user_dispute_history_7291' has not been unlocked.")
    assert not locked.error  # tau2 returns the text: not a failed call
    unlocked = call(bank, db, "unlock_discoverable_agent_tool", agent_tool_name="get_user_dispute_history_7291")
    assert unlocked.content.startswith("Tool unlocked: get_user_dispute_history_7291\nDescription: Retrieve")
    ran = call(bank, db, "call_discoverable_agent_tool", agent_tool_name="get_user_dispute_history_7291",
               arguments=args)
    assert "No transaction disputes found for this user." in ran.content


def test_reads_are_logged_only_when_the_gold_actions_make_them(bank):
    """Extra discoverable reads leave the compared DB alone; a read the gold trajectory makes is logged."""
    import inspect

    from ctu.domains.banking_knowledge.toolkit import AGENT

    reads = {name for name, m in AGENT.items() if m.discoverable and not m.mutates}
    task = next(t for t in bank.tasks if read_log_allowlist(t) & reads)
    read = sorted(read_log_allowlist(task) & reads)[0]
    arguments = json.dumps({p: "x" for p in list(inspect.signature(AGENT[read].fn).parameters)[1:]})
    gold = bank.initial_db(task)
    other = next(t for t in bank.tasks if read not in read_log_allowlist(t))
    for t, logged in ((task, 1), (other, 0)):
        db = bank.initial_db(t)
        call(bank, db, "unlock_discoverable_agent_tool", agent_tool_name=read)
        call(bank, db, "call_discoverable_agent_tool", agent_tool_name=read, arguments=arguments)
        assert len(list(db.keys("agent_discoverable_tools"))) == logged, t.id
    assert gold.diff(bank.initial_db(task)) == []  # the unlock itself is session state, never compared


def test_python_argument_errors_read_as_tau2s(bank):
    db = bank.new_db()
    missing = call(bank, db, "get_user_information_by_id")
    assert missing.error and missing.content == ("Error: KnowledgeTools.get_user_information_by_id() missing 1 "
                                                 "required positional argument: 'user_id'")
    clash = call(bank, db, "get_current_time", tool_name="x")
    assert clash.content == "Error: Environment.make_tool_call() got multiple values for argument 'tool_name'"
    call(bank, db, "unlock_discoverable_agent_tool", agent_tool_name="freeze_debit_card_3892")
    listed = call(bank, db, "call_discoverable_agent_tool", agent_tool_name="freeze_debit_card_3892", arguments="[1]")
    assert listed.content == ("Error: Invalid arguments: tau2.domains.banking_knowledge.tools.KnowledgeTools."
                              "freeze_debit_card_3892() argument after ** must be a mapping, not list")


def test_the_user_gets_the_tasks_own_user_tools(bank):
    task = bank.task("task_001")
    assert task.user_tools == ("apply_for_credit_card",)
    assert [t.name for t in bank.user_tools_for(task)] == ["apply_for_credit_card"]


def test_initialization_data_is_merged_into_the_db(bank):
    task = bank.task("task_026")  # turns automatic cash back dispute resolution on
    assert bank.initial_db(task).get("task_config", "dispute_settings") == {"auto_resolve_disputes": True}
    assert bank.new_db().get("task_config", "dispute_settings") is None


def _reference_scores(corpus, query, k1=1.5, b=0.75, epsilon=0.25):
    """rank_bm25's BM25Okapi.get_scores written out document by document (no inverted index)."""
    nd: dict[str, int] = {}
    for doc in corpus:
        for word in dict.fromkeys(doc):
            nd[word] = nd.get(word, 0) + 1
    n = len(corpus)
    idf = {w: math.log(n - f + 0.5) - math.log(f + 0.5) for w, f in nd.items()}
    eps = epsilon * (sum(idf.values()) / len(idf))
    idf = {w: (eps if v < 0 else v) for w, v in idf.items()}
    avgdl = sum(len(d) for d in corpus) / n
    scores = [0.0] * n
    for q in query:
        for i, doc in enumerate(corpus):
            tf = doc.count(q)
            scores[i] += (idf.get(q) or 0) * (tf * (k1 + 1) / (tf + k1 * (1 - b + b * len(doc) / avgdl)))
    return scores


WORDS = st.sampled_from(["fee", "card", "credit", "the", "a", "dispute", "atm", "gold"])


@given(st.lists(st.lists(WORDS, min_size=1, max_size=12), min_size=1, max_size=8), st.lists(WORDS, max_size=5))
def test_bm25_scores_equal_the_document_by_document_formula(corpus, query):
    assert BM25Okapi(corpus).scores(query) == _reference_scores(corpus, query)


def test_bm25_top_keeps_document_order_on_ties():
    index = BM25Okapi([["x"], ["y"], ["x"], ["z"], ["w"]])
    assert [i for i, _ in index.top(["x"], 3)] == [0, 2, 1]


def test_a_discoverable_tool_called_by_name_runs_unlisted_and_unlocked(bank):
    """tau2's toolkits run a discoverable tool called directly (the oracle found it): no unlock, no log entry, and
    the tool is in no schema the agent or the user is given."""
    db = bank.new_db()
    direct = call(bank, db, "freeze_debit_card_3892", card_id="dbc_x")
    assert (direct.content, direct.error) == ("Error: Debit card 'dbc_x' not found.", False)
    assert "freeze_debit_card_3892" not in [t["function"]["name"] for t in bank.openai_tools()]
    by_user = call(bank, db, "deposit_check_3847", "user", account_id="x", check_amount=5)
    assert by_user.content.startswith("Error: Tool 'deposit_check_3847' has not been given to you by the agent.")
    assert list(db.keys("agent_discoverable_tools")) == []


def test_the_throughput_benchmarks_episodes_search_and_solve_their_tasks(bank):
    """benchmarks/env_throughput.py's banking episodes: two KB_search calls, the gold turns, reward 1.0."""
    import asyncio

    from benchmarks.env_throughput import queries, run_episodes

    tasks = [t for t in bank.tasks if not t.nl_assertions][:4]
    assert all(len(q.split()) == 12 for q in queries(tasks[0], 2))
    assert asyncio.run(run_episodes(bank, tasks, 4, 4, searches=2)) == 4

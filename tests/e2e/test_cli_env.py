"""`ctu env check` and `ctu score`: their output lines and exit codes are a contract."""

import json
import subprocess
import sys

import pytest

from ctu.app.cli import build_parser, main
from ctu.domains import get_domain
from ctu.episode.transcripts import gold_transcript


def test_every_subcommand_has_help():
    for argv in (["--help"], ["env", "--help"], ["env", "check", "--help"], ["score", "--help"]):
        out = subprocess.run([sys.executable, "-m", "ctu", *argv], capture_output=True, text=True)
        assert out.returncode == 0 and "usage: ctu" in out.stdout, argv
    # every registered subparser is reachable from the top-level help
    assert {"env", "score"} <= set(build_parser()._subparsers._group_actions[0].choices)


@pytest.mark.parametrize("domain", ["mini", "retail", "airline"])
def test_env_check_passes_on_every_domain(domain, capsys):
    assert main(["env", "check", domain]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    n = len(get_domain(domain).tasks)
    assert len(out) == n + 1
    assert out[-1].startswith(f"{domain}: {n}/{n} tasks pass")


def test_env_check_telecom_passes_with_user_side_gold_actions(capsys):
    # gold actions on both sides (the agent's records, the user's phone) satisfy all 2,285 tasks' assertions (~5 s)
    assert main(["env", "check", "telecom"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    n = len(get_domain("telecom").tasks)
    assert n == 2285 and len(out) == n + 1
    assert out[-1].startswith(f"telecom: {n}/{n} tasks pass on gold actions (0 failed") and "ENV_ASSERTION=1.0" in out[0]


def test_env_check_banking_knowledge_passes_on_all_97_tasks(tau2_bench_data, capsys):
    """tau2-bench 1.0.1's banking_knowledge from a checkout's data: every task's gold actions score 1.0 (task_102's
    NL_ASSERTION needs a judge and is reported skipped)."""
    assert main(["env", "check", "banking_knowledge", "--data-dir", tau2_bench_data]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 98
    assert out[-1] == ("banking_knowledge: 97/97 tasks pass on gold actions (0 failed; NL_ASSERTION skipped on 1 "
                       "without a judge)")


def test_banking_knowledge_without_data_or_with_an_online_variant_is_one_line(monkeypatch, tmp_path, capsys,
                                                                              tau2_bench_data):
    monkeypatch.delenv("TAU2_DATA_DIR", raising=False)
    monkeypatch.delenv("CTU_TAU2_DATA_DIR", raising=False)
    assert main(["env", "check", "banking_knowledge", "--data-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "git clone https://github.com/sierra-research/tau2-bench" in err
    assert main(["env", "check", "banking_knowledge", "--data-dir", tau2_bench_data,
                 "--retrieval-variant", "openai_embeddings"]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "'openai_embeddings' needs network access" in err and "bm25_grep" in err


def _line(task_id, messages, **extra):
    return json.dumps({"task_id": task_id, "messages": messages, **extra})


def test_score_json_reports_each_line_and_names_bad_lines(tmp_path, capsys):
    retail = get_domain("retail")
    task = retail.tasks[0]
    gold = gold_transcript(retail, task)
    no_stop = gold[:-1]
    mini = get_domain("mini")
    lines = [
        _line(task.id, gold),
        "{not json",
        _line(task.id, no_stop),
        json.dumps({"messages": gold}),
        _line("no-such-task", gold),
        _line(mini.tasks[0].id, gold_transcript(mini, mini.tasks[0]), domain="mini"),
        _line(task.id, no_stop, termination="agent_stop"),
        _line(task.id, [{"role": "robot", "content": "hi"}]),
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    rc = main(["score", "--domain", "retail", str(path), "--json"])
    captured = capsys.readouterr()
    rows = [json.loads(x) for x in captured.out.strip().splitlines()]
    assert rc == 1
    assert [r["line"] for r in rows] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert rows[0]["reward"] == 1.0 and rows[0]["components"]["DB"] == 1.0
    # task 0 has NL_ASSERTION in its reward basis but no assertions: tau2 counts that as met, nothing is skipped
    assert task.nl_assertions == () and "NL_ASSERTION" in task.reward_basis
    assert rows[0]["components"]["NL_ASSERTION"] == 1.0 and rows[0]["skipped"] == []
    assert "error" in rows[1] and "error" in rows[3] and "error" in rows[4] and "error" in rows[7]
    assert rows[2]["reward"] == 0.0 and rows[2]["components"]["DB"] == 1.0  # no stop: scored 0, components kept
    assert rows[5]["reward"] == 1.0  # per-line domain overrides the flag
    assert rows[6]["reward"] == 1.0  # recorded termination agent_stop counts as normal
    assert f"{path}:2: error: not valid JSON" in captured.err
    assert f"{path}:4: error: field 'task_id'" in captured.err
    assert f"{path}:8: error: messages[0].role" in captured.err


def test_score_text_output_and_exit_zero_when_all_lines_are_good(tmp_path, capsys):
    airline = get_domain("airline")
    path = tmp_path / "a.jsonl"
    path.write_text("\n".join(_line(t.id, gold_transcript(airline, t)) for t in airline.tasks[:3]) + "\n")
    assert main(["score", "--domain", "airline", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("line 1 task ") and "reward=1.0" in out[0]
    assert out[-1].startswith("scored 3 transcript(s), mean reward 1.000; 0 bad line(s)")

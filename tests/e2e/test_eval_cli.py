"""`ctu eval` and `ctu play` end to end on CPU with tiny-random; written trajectories re-score identically."""

import asyncio
import io
import json

import httpx
import respx

from ctu.app.cli import main
from ctu.app.evaluate import write_report
from ctu.engines.base import SamplingParams
from ctu.episode.users.scripted import ScriptedUser
from ctu.rollout.loop import EpisodeSpec, RolloutLimits, rollout
from tests.unit.rollout.test_rollout import GOLD_TURNS, MINI, TASK, ScriptedModel

FAST = ["model.path=tiny-random", "sampling.max_tokens=12", "env.max_turns=2", "eval.max_tasks=3"]


def test_eval_on_mini_writes_every_file(tmp_path, capsys):
    run_dir = tmp_path / "eval"
    assert main(["eval", *FAST, f"run.dir={run_dir}", "eval.samples_per_task=2", "eval.save_tokens=true"]) == 0
    for name in ("report.json", "report.md", "trajectories.jsonl", "pass_k.png", "config.yaml"):
        assert (run_dir / name).is_file(), name
    report = json.loads((run_dir / "report.json").read_text())
    assert set(report) == {"mini", "overall"} and report["overall"]["episodes"] == 6
    assert set(report["overall"]["pass^k"]) == {"1", "2"} and "stop_reasons" in report["overall"]
    rows = [json.loads(line) for line in (run_dir / "trajectories.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and {"domain", "task_id", "messages", "reward", "components", "stop_reason"} <= set(rows[0])
    assert {"prompt_ids", "response_ids", "loss_mask"} <= set(rows[0])
    assert "| overall |" in (run_dir / "report.md").read_text()
    assert "overall: success" in capsys.readouterr().out


def test_written_trajectories_rescore_to_the_same_reward(tmp_path, capsys, chat_format):
    specs = [EpisodeSpec(MINI, TASK, 0), EpisodeSpec(MINI, TASK, 1)]
    engine = ScriptedModel(chat_format, GOLD_TURNS[:1] + ["Sorry, no."] * 3)
    trajectories = asyncio.run(rollout(specs, chat_format, engine, ScriptedUser(), SamplingParams(), RolloutLimits()))
    good = asyncio.run(rollout([EpisodeSpec(MINI, TASK, 2)], chat_format, ScriptedModel(chat_format, GOLD_TURNS),
                               ScriptedUser(), SamplingParams(), RolloutLimits()))
    write_report(tmp_path, trajectories + good)
    main(["score", str(tmp_path / "trajectories.jsonl"), "--json"])
    rescored = [json.loads(line)["reward"] for line in capsys.readouterr().out.splitlines()]
    assert rescored == [t.reward for t in trajectories + good] and 1.0 in rescored


@respx.mock
def test_eval_on_retail_with_a_mocked_llm_user(tmp_path, monkeypatch):
    monkeypatch.setenv("SIM_KEY", "k")
    respx.post("http://sim.test/v1/chat/completions").mock(return_value=httpx.Response(200, json={
        "id": "x", "object": "chat.completion", "created": 0, "model": "u", "choices": [
            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "Thanks ###STOP###"}}]}))
    run_dir = tmp_path / "retail"
    assert main(["eval", *FAST, "env.domains=[retail]", "user.kind=llm", "user.base_url=http://sim.test/v1",
                 "user.api_key_env=SIM_KEY", f"run.dir={run_dir}", "env.max_context_tokens=8192"]) == 0
    report = json.loads((run_dir / "report.json").read_text())
    assert report["retail"]["episodes"] == 3 and report["retail"]["errored"] == 0


def test_play_as_a_human(monkeypatch, capsys):
    oid = TASK.actions[0].arguments["order_id"]
    lines = [f'{{"name": "get_order", "arguments": {{"order_id": "{oid}"}}}}',
             f'<tool_call>{{"name": "cancel_order", "arguments": {{"order_id": "{oid}"}}}}</tool_call>',
             "Your order is cancelled."]
    # the keyboard is stdin: ctu.app.play binds the builtin input() as a default argument when first imported, so
    # patching builtins.input would depend on whether an earlier test already imported it
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(lines) + "\n"))
    assert main(["play", "--domain", "mini", "--task", TASK.id, "--human"]) == 0
    out = capsys.readouterr().out
    assert "tool get_order ->" in out and "episode ended: user_stop; reward 1.0" in out


def test_play_with_a_model(capsys):
    assert main(["play", "--domain", "mini", "--task", TASK.id, "--model", "tiny-random", "sampling.max_tokens=8",
                 "env.max_turns=2"]) == 0
    assert "episode ended:" in capsys.readouterr().out


@respx.mock
def test_eval_fails_with_one_line_when_no_episode_could_be_scored(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SIM_KEY", "k")
    respx.post("http://sim.test/v1/chat/completions").mock(return_value=httpx.Response(401, json={"error": "no"}))
    run_dir = tmp_path / "errored"
    assert main(["eval", *FAST, "env.domains=[retail]", "user.kind=llm", "user.base_url=http://sim.test/v1",
                 "user.api_key_env=SIM_KEY", f"run.dir={run_dir}", "env.max_context_tokens=8192"]) == 1
    report = json.loads((run_dir / "report.json").read_text())
    assert report["overall"]["episodes"] == 3 and report["overall"]["errored"] == 3
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip() and "Loading weights" not in line]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("ctu: error: no episode could be scored: all 3 episode(s) errored")
    assert "HTTP 401" in lines[0] and "SIM_KEY" not in lines[0]


BANK = ["env.domains=[banking_knowledge]", "eval.splits=[all]", "env.max_context_tokens=16384"]


def test_eval_on_banking_knowledge_with_bm25_and_the_scripted_user(tmp_path, tau2_bench_data):
    run_dir = tmp_path / "bank"
    assert main(["eval", *FAST, *BANK, f"env.tau2_data_dir={tau2_bench_data}", "env.retrieval_variant=bm25",
                 "eval.max_tasks=2", f"run.dir={run_dir}"]) == 0
    report = json.loads((run_dir / "report.json").read_text())
    assert report["banking_knowledge"]["episodes"] == 2 and report["banking_knowledge"]["errored"] == 0
    rows = [json.loads(line) for line in (run_dir / "trajectories.jsonl").read_text().splitlines()]
    assert [r["task_id"] for r in rows] == ["task_001", "task_002"]
    assert "KB_search" in rows[0]["messages"][0]["content"]  # the bm25 variant's policy


@respx.mock
def test_eval_on_banking_knowledge_gives_an_llm_user_the_tasks_own_tools(tmp_path, monkeypatch, tau2_bench_data):
    monkeypatch.setenv("SIM_KEY", "k")
    route = respx.post("http://sim.test/v1/chat/completions").mock(return_value=httpx.Response(200, json={
        "id": "x", "object": "chat.completion", "created": 0, "model": "u", "choices": [
            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "Thanks ###STOP###"}}]}))
    run_dir = tmp_path / "bank_llm"
    assert main(["eval", *FAST, *BANK, f"env.tau2_data_dir={tau2_bench_data}", "eval.max_tasks=1", "user.kind=llm",
                 "user.base_url=http://sim.test/v1", "user.api_key_env=SIM_KEY", f"run.dir={run_dir}"]) == 0
    sent = json.loads(route.calls[0].request.content)
    assert [t["function"]["name"] for t in sent["tools"]] == ["apply_for_credit_card"]  # task_001's user_tools
    assert json.loads((run_dir / "report.json").read_text())["banking_knowledge"]["errored"] == 0


@respx.mock
def test_eval_with_a_user_server_replying_malformed_json_errors_episodes_not_the_command(tmp_path, monkeypatch, capsys):
    # it ended the command at the first reply: "ctu: error: Expecting property name enclosed in double quotes"
    monkeypatch.setenv("SIM_KEY", "k")
    route = respx.post("http://sim.test/v1/chat/completions").mock(return_value=httpx.Response(
        200, text='{"choices": [{bad', headers={"content-type": "application/json"}))
    run_dir = tmp_path / "malformed"
    assert main(["eval", *FAST, "user.kind=llm", "user.base_url=http://sim.test/v1?sig=qs-secret-2718",
                 "user.api_key_env=SIM_KEY", "user.max_retries=1", "user.backoff_initial=0.01",
                 "user.backoff_max=0.01", f"run.dir={run_dir}"]) == 1
    assert json.loads((run_dir / "report.json").read_text())["overall"]["errored"] == 3
    assert len(route.calls) == 6 and all(c.request.url.params["sig"] == "qs-secret-2718" for c in route.calls)
    err = capsys.readouterr().err
    (line,) = [x for x in err.splitlines() if x.startswith("ctu: error:")]
    assert "failed after 2 attempts" in line and "malformed reply (not JSON" in line and """'{"choices": [{bad'""" in line
    assert "http://sim.test/v1?sig=<redacted>" in line and "qs-secret-2718" not in err


def test_eval_with_nothing_to_evaluate_fails_in_one_line_before_any_model(tmp_path, capsys):
    empty = tmp_path / "tasks.json"
    empty.write_text("[]\n")
    (tmp_path / "split_tasks.json").write_text('{"test": [], "train": []}\n')  # a tasks file whose splits are empty
    for extra in (["eval.splits=[]"], [f"env.tasks.mini={empty}"]):
        run_dir = tmp_path / f"run{len(extra[0])}"
        assert main(["eval", "model.path=no-such-model", f"run.dir={run_dir}", *extra]) == 1
        err = capsys.readouterr().err
        assert err.startswith("ctu: error: nothing to evaluate: ") and err.count("\n") == 1, err
        assert "mini" in err and "0 episodes" in err
        assert not (run_dir / "report.json").exists()

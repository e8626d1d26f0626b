"""Every exit point goes through ctu's one redaction function: the CLI's error line (a config error, an exception
quoting a URL or a piece of one), W&B's files (its config, the command line it records, the console it captures),
reports, trajectories and examples. Only ctu's public entry points are used, so that these tests also run against
older code."""

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from ctu.app import cli
from ctu.app.cli import main
from ctu.app.evaluate import write_report
from ctu.episode.llm_api import ChatAPIConfig, ChatClient
from ctu.observe.tracking import Tracker
from ctu.rollout.loop import Trajectory
from tests.fakes.chat_server import StubChatServer

ROOT = Path(__file__).resolve().parents[3]
SECRETS = ("s3cr", "etPW", "Pa55word", "Acc3ssTok", "Tok3nValue", "Sig4ture")
URL = "https://user:Pa55word@host:1/v1?accessToken=Acc3ssTok;api_key=Tok3nValue"
BARE = "user:Sig4ture@localhost:1/v1"  # no scheme


def leaks(root: Path) -> list[str]:
    """'path: secret' for every file under ``root`` holding one of SECRETS."""
    found = []
    for path in sorted(p for p in Path(root).rglob("*") if p.is_file()):
        data = path.read_bytes()
        found += [f"{path}: {secret}" for secret in SECRETS if secret.encode() in data]
    return found


def assert_clean(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, text


@pytest.mark.parametrize("url", ["https://user:s3cr/etPW@host:1/v1", "https://user:s3cr#etPW@host:1/v1",
                                 "https://user:s3cr?etPW@host:1/v1", "user:s3cr3tPW@localhost:1/v1",
                                 "https://user:s3cr etPW@host/v1"])
def test_a_url_whose_credentials_could_leak_is_refused_naming_the_key(tmp_path, capsys, url):
    run_dir = tmp_path / "run"
    assert main(["eval", "model.path=tiny-random", f"run.dir={run_dir}", "user.kind=llm", f"user.base_url={url}",
                 "user.max_retries=0", "eval.max_tasks=1", "env.max_turns=1", "sampling.max_tokens=4"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("ctu: config error: user.base_url: ") and err.count("\n") == 1, err
    assert_clean(err)
    assert not run_dir.exists()  # nothing written, no config.yaml holding the URL


def test_an_exception_quoting_a_piece_of_a_url_prints_redacted(tmp_path, monkeypatch, capsys):
    bad = "https://user:s3cr/etPW@host:1/v1"  # a client built in code (no config check) is given it

    def evaluate(config):
        ChatClient(ChatAPIConfig("m", base_url=bad))
        httpx.URL(bad)  # InvalidURL: Invalid port: 's3cr'

    monkeypatch.setattr(cli, "_evaluate", evaluate)
    assert main(["eval", f"run.dir={tmp_path}"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("ctu: error: InvalidURL: Invalid port") and err.count("\n") == 1, err
    assert_clean(err)


def test_an_exception_quoting_a_url_prints_redacted(tmp_path, monkeypatch, capsys):
    with StubChatServer([(404, "no such model", {})]) as server:
        url = server.base_url.replace("http://", "http://user:Pa55word@") + "?accessToken=Acc3ssTok;api_key=Tok3nValue"
        monkeypatch.setattr(cli, "_evaluate", lambda config: httpx.post(url).raise_for_status())
        assert main(["eval", f"run.dir={tmp_path}"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("ctu: error: HTTPStatusError: Client error '404") and "127.0.0.1" in err, err
    assert_clean(err)


def test_the_ctu_programs_debug_traceback_is_redacted():
    done = subprocess.run([sys.executable, "-m", "ctu", "--debug", "plan", f"model.path={URL}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "Traceback" in done.stderr, done.stderr
    assert "ValueError: model.path 'https://<redacted>@host:1/v1?accessToken=<redacted>" in done.stderr
    assert_clean(done.stdout + done.stderr)


def test_wandb_records_no_secret_of_config_command_line_or_console(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setattr(sys, "argv", ["ctu", "train", f"user.base_url={URL}", f"shaping.base_url={BARE}"])
    config = {"user": {"base_url": URL}, "shaping": {"base_url": BARE}, "judge": {"api_key": "Tok3nValue"}}
    with Tracker(tmp_path, config=config, wandb_enabled=True, wandb_mode="offline") as tracker:
        print(f"connecting to {URL}")
        print(f"connecting to {BARE}", file=sys.stderr)
        tracker.log(1, {"x": 1.0})
    assert list((tmp_path / "wandb").rglob("*.wandb"))
    captured = "".join(p.read_text() for p in (tmp_path / "wandb").rglob("output.log"))
    assert "connecting to https://<redacted>@host:1/v1?accessToken=<redacted>" in captured  # W&B saw the console
    assert leaks(tmp_path) == []
    assert sys.argv[2] == f"user.base_url={URL}"  # the command line is given back as it was


def trajectory(error: str, text: str) -> Trajectory:
    return Trajectory(domain="mini", task_id="t1", sample=0, prompt_ids=[1], response_ids=[2], loss_mask=[1],
                      logprobs=[0.0], assistant_spans=[], messages=[{"role": "user", "content": text}], reward=0.0,
                      components={}, skipped=[], reasons=[text], stop_reason="error", termination="user_error",
                      turns=1, parse_failures=0, tool_calls=0, error=error)


def test_reports_trajectories_and_examples_hold_no_secret(tmp_path):
    rows = [trajectory(f"user: POST {URL} failed", f"my server is {BARE}"),
            trajectory(f"judge: {BARE} refused", f"try {URL}")]
    write_report(tmp_path / "eval", rows, save_tokens=True)
    Tracker(tmp_path).examples(1, [t.to_json() for t in rows])
    assert (tmp_path / "eval" / "trajectories.jsonl").is_file() and (tmp_path / "examples" / "step_1.jsonl").is_file()
    assert leaks(tmp_path) == []

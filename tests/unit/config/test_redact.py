"""Credentials in URLs (userinfo, secret query parameters) never reach a saved config, W&B's config, a repr or an
error line."""

import asyncio
import dataclasses
from pathlib import Path

import pytest
import yaml

from ctu.app.cli import main
from ctu.config.redact import redact
from ctu.config.schema import load_config, save_config, to_dict
from ctu.engines.vllm.remote import RemoteEngine
from ctu.episode.judge import LLMJudge
from ctu.episode.llm_api import ChatAPIConfig, ChatClient, LLMCallError

SECRET_URL = "https://alice:s3cr3t-pw@llm.example.com:8443/v1?api_key=k3y-value&model=m&sig=zzsig"


@pytest.mark.parametrize("url,expected", [
    (SECRET_URL, "https://<redacted>@llm.example.com:8443/v1?api_key=<redacted>&model=m&sig=<redacted>"),
    ("http://tok3n@[::1]:8000/v1", "http://<redacted>@[::1]:8000/v1"),
    ("https://host/v1?token=abc&access_token=def&x=1#frag", "https://host/v1?token=<redacted>&access_token=<redacted>"
                                                             "&x=1#frag"),
    ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1"),
    ("https://host/v1?Password=pw&empty", "https://host/v1?Password=<redacted>&empty"),
    ("not a url", "not a url"),
])
def test_redact_url(url, expected):
    assert redact(url) == expected


def test_redact_urls_in_free_text():
    text = f"model 'm' at {SECRET_URL} failed; see 'http://u:p@h/x'."
    out = redact(text)
    for secret in ("s3cr3t-pw", "k3y-value", "zzsig", "alice", "u:p@"):
        assert secret not in out
    assert out.startswith("model 'm' at https://<redacted>@llm.example.com:8443/v1?") and "'http://<redacted>@h/x'." in out


def assert_clean(text: str) -> None:
    for secret in ("s3cr3t-pw", "k3y-value", "zzsig", "alice"):
        assert secret not in text, text


def test_saved_config_and_wandb_config_hold_no_url_credentials(tmp_path):
    config = load_config(None, [f"user.base_url={SECRET_URL}", f"judge.base_url={SECRET_URL}",
                                f"engine.base_url={SECRET_URL}", f"shaping.base_url={SECRET_URL}"])
    assert_clean(str(to_dict(config)))  # what the trainer hands W&B
    save_config(config, tmp_path / "config.yaml")
    saved = (tmp_path / "config.yaml").read_text()
    assert_clean(saved)
    assert yaml.safe_load(saved)["user"]["base_url"] == redact(SECRET_URL)
    assert load_config(tmp_path / "config.yaml").user.base_url == redact(SECRET_URL)


def test_reprs_and_api_errors_hold_no_url_credentials(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-never-shown")
    url = "http://alice:s3cr3t-pw@127.0.0.1:9/v1?api_key=k3y-value"
    assert_clean(repr(RemoteEngine(url, "m")))
    assert_clean(repr(LLMJudge("m", base_url=url)))
    client = ChatClient(ChatAPIConfig("m", base_url=url, max_retries=0, timeout=2.0))
    with pytest.raises(LLMCallError) as caught:
        asyncio.run(client.complete([{"role": "user", "content": "hi"}]))
    assert "127.0.0.1:9" in str(caught.value)
    assert_clean(str(caught.value))


def test_an_error_line_never_shows_url_credentials(tmp_path, capsys):
    assert main(["eval", f"run.dir={tmp_path}", f"user.kind={SECRET_URL}"]) == 1  # the value is quoted back
    err = capsys.readouterr().err
    assert err.startswith("ctu: config error: user.kind: must be one of") and "llm.example.com" in err
    assert_clean(err)


@pytest.mark.parametrize("preset", [None, *sorted(str(p) for p in Path("configs").glob("*.yaml"))])
def test_a_config_without_credentials_is_saved_unchanged(preset):
    config = load_config(preset)
    assert to_dict(config) == dataclasses.asdict(config)


WORDY = "http://u:Xy%2Fmini%2Ftest%2Fstep@127.0.0.1:9/v1"  # a password made of words the records use elsewhere


def test_a_password_of_common_words_redacts_itself_and_no_other_text(tmp_path):
    from ctu.config.redact import forget

    try:
        config = load_config(None, ["env.domains=[mini]", "user.kind=llm", f"user.base_url={WORDY}"])
        save_config(config, tmp_path / "config.yaml")
        assert load_config(tmp_path / "config.yaml").env.domains == ["mini"]  # the saved config reruns
        assert redact("mini test step 1: a test of the mini domain") == "mini test step 1: a test of the mini domain"
        for form in ("Xy/mini/test/step", "Xy%2Fmini%2Ftest%2Fstep", "Xy%2fmini%2ftest%2fstep"):
            assert redact(f"password {form}!") == "password <redacted>!", form
    finally:
        forget()


def test_an_unchecked_url_split_in_the_wrong_place_loses_the_pieces_a_parser_quotes():
    from ctu.config.redact import forget, remember_in

    try:
        remember_in("https://user:s3cr/etPW@host:1/v1")  # raw '/': a parser reads port 's3cr'
        assert redact("Invalid port: 's3cr'") == "Invalid port: '<redacted>'"
        remember_in("https://user:Ab%2Fmini%2Fword@host:1/v1")  # well formed: no parser splits it
        assert redact("mini word") == "mini word"
    finally:
        forget()

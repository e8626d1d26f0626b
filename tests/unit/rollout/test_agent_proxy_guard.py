"""The agent proxy against callers that are not the episode's agent: other episodes' agents, a web page (DNS
rebinding, a form post), malformed or oversized requests, and rewards out of range."""

from __future__ import annotations

import json
import socket

import httpx
import pytest

from ctu.domains import get_domain
from ctu.engines.base import SamplingParams
from ctu.episode.users.scripted import ScriptedUser
from ctu.rollout.agent_proxy import AgentProxy
from ctu.rollout.external import ExternalEpisodes
from ctu.rollout.loop import EpisodeSpec, RolloutLimits
from tests.unit.rollout.test_agent_proxy import ScriptEngine


@pytest.fixture
def two(chat_format):
    """A proxy with episodes ep1 and ep2 open: ``(proxy, {id: token})``."""
    episodes = ExternalEpisodes(chat_format, ScriptEngine(chat_format, ["Hello."] * 4), ScriptedUser(),
                                RolloutLimits(4, 5, 4096))
    proxy = AgentProxy(episodes).start()
    proxy.call(lambda: episodes.begin(SamplingParams(max_tokens=16, seed=0)))
    domain = get_domain("mini")
    opened = {i: proxy.call(episodes.open(i, EpisodeSpec(domain, domain.task("mini-0000")), seed=0))
              for i in ("ep1", "ep2")}
    tokens = {i: getattr(state, "token", "no-token") for i, state in opened.items()}
    yield proxy, tokens
    proxy.close()


def bearer(token):
    return {"Authorization": f"Bearer {token}"}


def raw(proxy, head: str, body: bytes = b"") -> tuple[int, dict]:
    """One request written by hand on its own connection: ``(status, JSON body)``."""
    port = int(proxy.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(head.replace("\n", "\r\n").encode() + b"\r\n" + body)
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    header, _, payload = data.partition(b"\r\n\r\n")
    return int(header.split()[1]), json.loads(payload)


def test_tokens_are_unguessable_and_each_opens_only_its_episode(two):
    proxy, tokens = two
    assert len(set(tokens.values())) == 2 and all(len(t) >= 40 for t in tokens.values())
    http = httpx.Client()
    for action in ("start", "step", "tool", "user", "reward"):
        url = f"{proxy.env_url('ep1')}/{action}"
        assert http.post(url, json={}).status_code == 401, action
        assert http.post(url, json={}, headers=bearer("r0-e0")).status_code == 401, action
        other = http.post(url, json={"reward": 1.0}, headers=bearer(tokens["ep2"]))
        assert other.status_code == 403 and other.json()["error"]["code"] == "wrong_episode", action
    assert http.get(proxy.base_url + "/models").status_code == 401
    assert http.get(proxy.base_url + "/models", headers=bearer(tokens["ep2"])).status_code == 200
    opening = http.post(proxy.env_url("ep1") + "/start", headers=bearer(tokens["ep1"])).json()
    request = {"model": "ctu", "messages": opening["messages"]}
    stolen = http.post(proxy.base_url + "/chat/completions", json=request,
                       headers={**bearer(tokens["ep2"]), "X-Episode-Id": "ep1"})
    assert stolen.status_code == 403
    mine = http.post(proxy.base_url + "/chat/completions", json=request, headers=bearer(tokens["ep1"]))
    assert mine.status_code == 200 and mine.json()["choices"][0]["message"]["content"] == "Hello."
    assert len(proxy.episodes.episodes["ep1"].records) == 1 and proxy.episodes.episodes["ep2"].records == []


@pytest.mark.parametrize("reward", ["Infinity", "-Infinity", "NaN", "1e999", "1.5", "-0.5", "1" + "0" * 400, "true"])
def test_a_posted_reward_is_finite_and_within_the_rewards_range(two, reward):
    proxy, tokens = two
    posted = httpx.post(proxy.env_url("ep1") + "/reward", content=f'{{"reward": {reward}}}',
                        headers={**bearer(tokens["ep1"]), "content-type": "application/json"})
    assert posted.status_code == 400 and "\n" not in posted.json()["error"]["message"]
    assert proxy.episodes.episodes["ep1"].agent_reward is None
    ok = httpx.post(proxy.env_url("ep1") + "/reward", json={"reward": 1}, headers=bearer(tokens["ep1"]))
    assert ok.json()["reward"] == 1.0


def test_malformed_requests_are_one_line_400s_and_print_no_traceback(two, capfd):
    proxy, tokens = two
    host = proxy.url.removeprefix("http://")
    start = f"POST /ctu/episodes/ep1/start HTTP/1.1\nHost: {host}\nAuthorization: Bearer {tokens['ep1']}\n" \
            "Content-Type: application/json\nConnection: close\n"
    deep = b"[" * 10_000 + b"]" * 10_000
    cases = [(start + "Content-Length: abc\n", b"{}"), (start + "Content-Length: -5\n", b"{}"),
             (start + "Content-Length: 99999999999999999999999\n", b"{}"),
             (start + f"Content-Length: {(32 << 20) + 1}\n", b"{}"),
             (start + "Content-Length: 2\nContent-Length: 3\n", b"{}"),
             (start + "Transfer-Encoding: chunked\n", b"2\r\n{}\r\n0\r\n\r\n"),
             (start + f"Content-Length: {len(deep)}\n", deep), (start + "Content-Length: 9\n", b"\xff\xfe{}[]...")]
    for head, body in cases:
        status, payload = raw(proxy, head, body)
        message = payload["error"]["message"]
        assert status == 400 and "\n" not in message and len(message) < 300, (head, message)
    assert "Traceback" not in capfd.readouterr().err
    status, payload = raw(proxy, start + "Content-Length: 2\n", b"{}")
    assert status == 200 and payload["episode_id"] == "ep1"  # the proxy still serves


def test_a_request_for_another_host_or_not_json_is_refused(two):
    proxy, tokens = two
    port = proxy.url.rsplit(":", 1)[1]
    url = proxy.env_url("ep1") + "/start"
    rebound = httpx.post(url, json={}, headers={**bearer(tokens["ep1"]), "Host": f"attacker.example:{port}"})
    assert rebound.status_code == 403 and "Host" in rebound.json()["error"]["message"]
    assert httpx.post(url, json={}, headers={**bearer(tokens["ep1"]), "Host": f"localhost:{port}"}).status_code == 200
    form = httpx.post(url, content=b'{"a": 1}', headers={**bearer(tokens["ep1"]), "content-type": "text/plain"})
    assert form.status_code == 415 and "application/json" in form.json()["error"]["message"]


def test_an_episode_its_evaluator_cannot_score_is_errored_alone(two, monkeypatch):
    proxy, tokens = two

    def unreadable(*args, **kwargs):  # a fault of the evaluator on this transcript
        raise KeyError("payment_history")

    monkeypatch.setattr("ctu.rollout.external.compute_reward", unreadable)
    trajectory = proxy.call(proxy.episodes.finish("ep1"))
    assert trajectory.stop_reason == "error" and trajectory.error == "reward: KeyError: 'payment_history'"
    assert trajectory.reward == 0.0 and "ep2" in proxy.episodes.episodes

"""The bring-your-own-agent proxy: an OpenAI-compatible HTTP endpoint in front of any ctu engine (docs/agents.md).

A small HTTP server on 127.0.0.1 (stdlib, a thread per connection) in front of :class:`ExternalEpisodes`, which
runs on the proxy's own asyncio loop in a background thread (so concurrent agents' requests are batched into one
engine call, as ctu's loop batches its episodes). Routes:

- ``POST /v1/chat/completions``: OpenAI chat completions with ``tools``, for the episode whose token the request
  carries (a header ``X-Episode-Id`` or the request's ``user`` field, if sent, must name that episode).
  ``GET /v1/models`` lists one model.
- ``GET|POST /ctu/episodes/{id}/start``: the episode's opening ``messages`` (system prompt with the policy, the
  greeting, the user's first message), its ``tools`` (OpenAI schemas), domain and task id.
- ``POST /ctu/episodes/{id}/step`` ``{"message": <the assistant message>}``: the environment takes the turn (runs
  its tool calls, or sends its text to the simulated user) and returns ``observations`` (the tool/user messages to
  append), ``done`` and ``termination``. ``/tool`` ``{"name", "arguments", "id"}`` and ``/user`` ``{"content"}``
  are one-call / one-text shorthands for a step (each is one turn).
- ``POST /ctu/episodes/{id}/reward`` ``{"reward": 0.5}``: the agent's own reward replaces the environment's.

Every request carries its episode's token (``Authorization: Bearer <CTU_EPISODE_TOKEN>``; the OpenAI SDK sends
``OPENAI_API_KEY``, which holds it): 401 without one, 403 with another episode's. The ``Host`` header must name the
address the proxy listens on (403 otherwise: DNS rebinding), a POST body must be ``application/json`` (415: a
browser's form or ``text/plain`` post) of at most :data:`MAX_BODY` bytes with a plain ``Content-Length``; a malformed
request is 400 with one line, and the connection is closed. Errors are OpenAI-shaped
``{"error": {"message", "type", "param", "code"}}`` with one line naming the field.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import Callable, Mapping
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ctu.episode.env import AgentTurn, ToolCall
from ctu.rollout.external import ExternalEpisodes, agent_turn, tool_arguments
from ctu.rollout.openai_wire import WireError

MAX_BODY = 32 << 20  # bytes of a request body: a long conversation with its tools is well under a megabyte
READ_TIMEOUT_S = 300.0  # a connection that sends nothing (a body shorter than its Content-Length) for this long ends
_EPISODE_ROUTE = re.compile(r"^/ctu/episodes/([^/]+)/(start|step|tool|user|reward)$")
Headers = Mapping[str, str] | Message  # a plain mapping (tests) or http.server's headers


class AgentProxy:
    """The HTTP server and the asyncio loop it hands work to; ``with AgentProxy(...)`` starts and stops both."""

    def __init__(self, episodes: ExternalEpisodes, host: str = "127.0.0.1", port: int = 0):
        self.episodes = episodes
        self.loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self.loop.run_forever, name="ctu-agent-proxy-loop", daemon=True)
        self.httpd = _Server((host, port), _handler(self))
        port = self.httpd.server_address[1]
        names = {host, "localhost", "127.0.0.1"} if host in ("127.0.0.1", "localhost") else {host}
        self.hosts = frozenset(f"{name}:{port}".lower() for name in names)  # the Host values a request may send
        self._http_thread = threading.Thread(target=self.httpd.serve_forever, name="ctu-agent-proxy-http",
                                             daemon=True)
        self.url = f"http://{host}:{self.httpd.server_address[1]}"
        self.started = False

    @property
    def base_url(self) -> str:
        """What an OpenAI client takes as ``base_url`` (``OPENAI_BASE_URL``)."""
        return f"{self.url}/v1"

    def env_url(self, episode_id: str) -> str:
        return f"{self.url}/ctu/episodes/{episode_id}"

    def start(self) -> AgentProxy:
        if not self.started:
            self._loop_thread.start()
            self._http_thread.start()
            self.started = True
        return self

    def call(self, work: Callable[[], Any] | Any, timeout: float | None = None) -> Any:
        """Run a coroutine (or a plain function) on the proxy's loop and wait for its result."""
        async def run() -> Any:
            return await work if asyncio.iscoroutine(work) else work()

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout)

    def close(self) -> None:
        if self.started:
            self.httpd.shutdown()
            self.call(self.episodes.end)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._loop_thread.join(timeout=5)
            self.started = False
        self.httpd.server_close()

    def __enter__(self) -> AgentProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- requests ------------------------------------------------------------------------------
    def handle(self, method: str, path: str, headers: Headers, body: Any) -> tuple[int, dict[str, Any]]:
        """``(status, JSON body)`` of one request; the server thread waits here for the loop."""
        try:
            return 200, self._route(method, path.split("?", 1)[0].rstrip("/"), headers, body)
        except WireError as exc:
            return exc.status, exc.body()
        except Exception as exc:  # the engine or the environment failed: the agent learns why, in one line
            text = " ".join(f"{type(exc).__name__}: {exc}".split())
            return 500, WireError(500, f"ctu proxy: {text}").body()

    def _route(self, method: str, path: str, headers: Headers, body: Any) -> dict[str, Any]:
        token = _bearer(headers.get("Authorization"))
        if path == "/v1/models" and method == "GET":
            self.episodes.authorize(token)
            return {"object": "list", "data": [{"id": self.episodes.model_name, "object": "model", "created": 0,
                                                "owned_by": "ctu"}]}
        if path == "/v1/chat/completions" and method == "POST":
            named = headers.get("X-Episode-Id") or (body.get("user") if isinstance(body, dict) else None)
            episode_id = self.episodes.authorize(token, named if isinstance(named, str) and named else None).id
            reply: dict[str, Any] = self.call(self.episodes.complete(episode_id, body))
            return reply
        match = _EPISODE_ROUTE.match(path)
        if match is None:
            raise WireError(404, f"no route {method} {path[:200]} (see docs/agents.md)")
        episode_id, action = match.groups()
        self.episodes.authorize(token, episode_id)
        if action == "start":
            started: dict[str, Any] = self.call(lambda: self.episodes.start_info(episode_id))
            return started
        if method != "POST":
            raise WireError(405, f"{path}: use POST")
        if action == "reward":
            rewarded: dict[str, Any] = self.call(lambda: self.episodes.post_reward(episode_id, body))
            return rewarded
        if not isinstance(body, dict):
            raise WireError(400, "the request body must be a JSON object")
        stepped: dict[str, Any] = self.call(self._step(episode_id, action, body))
        return stepped

    async def _step(self, episode_id: str, action: str, body: dict[str, Any]) -> dict[str, Any]:
        if action == "step":
            turn = agent_turn(body.get("message"))
        elif action == "tool":
            if not isinstance(body.get("name"), str):
                raise WireError(400, "name: the tool's name is required", "name")
            call = ToolCall(body["name"], tool_arguments(body.get("arguments")), body.get("id") or "")
            turn = AgentTurn(tool_calls=(call,))
        else:
            if not isinstance(body.get("content"), str):
                raise WireError(400, "content: the message to the user is required", "content")
            turn = AgentTurn(content=body["content"])
        out = await self.episodes.step(episode_id, turn)
        if action != "step":
            kind = "tool" if action == "tool" else "user"
            texts = [m.get("content") for m in out["observations"] if m.get("role") == kind]
            out["content"] = texts[-1] if texts else None
        return out


def _bearer(authorization: str | None) -> str | None:
    scheme, _, value = (authorization or "").strip().partition(" ")
    return value.strip() or None if scheme.lower() == "bearer" else None


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection that broke (a client gone mid-reply): nothing to print, the run goes on."""


def _refusal(proxy: AgentProxy, method: str, headers: Message) -> tuple[int, str] | int:
    """``(status, one line)`` for a request refused before its body is read, else the body's length."""
    host = (headers.get("host") or "").strip().lower()
    if host not in proxy.hosts:
        return 403, f"Host {host[:100]!r} is not this proxy's address ({min(proxy.hosts)})"
    if headers.get("transfer-encoding"):
        return 400, "Transfer-Encoding is not accepted: send the body with a Content-Length"
    length = (headers.get("content-length") or "0").strip()
    if not (length.isascii() and length.isdigit()) or len(headers.get_all("content-length") or []) > 1:
        return 400, f"Content-Length: must be one whole number of bytes, got {length[:40]!r}"
    if int(length) > MAX_BODY:
        return 400, f"Content-Length: {int(length) if len(length) < 20 else length[:20] + '...'} bytes is over " \
                    f"the proxy's limit of {MAX_BODY}"
    kind = (headers.get("content-type") or "").partition(";")[0].strip().lower()
    if method == "POST" and int(length) and kind != "application/json":
        return 415, f"Content-Type: must be application/json, got {kind[:60]!r}"
    return int(length)


def _handler(proxy: AgentProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: the OpenAI SDK pools its connection
        timeout = READ_TIMEOUT_S

        def _serve(self, method: str) -> None:
            refused = _refusal(proxy, method, self.headers)
            if isinstance(refused, tuple):
                self._reply(refused[0], WireError(refused[0], refused[1]).body(), close=True)
                return
            raw = self.rfile.read(refused) if refused else b""
            if len(raw) < refused:
                self._reply(400, WireError(400, f"the body ended after {len(raw)} of its {refused} bytes").body(),
                            close=True)
                return
            try:
                body = json.loads(raw) if raw.strip() else {}
            except RecursionError:
                status, payload = 400, WireError(400, "the request body is not JSON ctu reads: nested too deep").body()
            except ValueError as exc:
                status, payload = 400, WireError(400, f"the request body is not JSON: {str(exc)[:200]}").body()
            else:
                status, payload = proxy.handle(method, self.path, self.headers, body)
            self._reply(status, payload)

        def _reply(self, status: int, payload: dict[str, Any], close: bool = False) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            if close:  # what follows on this connection cannot be trusted to start a request
                self.send_header("connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            self._serve("GET")

        def do_POST(self) -> None:  # noqa: N802
            self._serve("POST")

        def log_message(self, *args: Any) -> None:  # quiet: the run's logs are ctu's own
            pass

    return Handler

"""A local OpenAI-compatible user simulator with a remote model's latency, for measuring asynchronous RL.

ctu's LLM user (``user.kind=llm``) talks to it as to any chat-completions server; every reply waits
``--latency LOW HIGH`` seconds (uniform; seeded per request) and then says what ctu's scripted user would say at
that point of the conversation, so held-out success stays comparable with the scripted user's while each user turn
costs what a remote simulator costs. The task is recognised from the simulator's system prompt (it quotes the
scenario; ``mini`` requests name their order, so each prompt names one task).

    python benchmarks/slow_user_server.py --port 8765 --latency 1 2 &
    ctu train configs/quickstart.yaml user.kind=llm user.base_url=http://127.0.0.1:8765/v1 user.model=slow-user
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ctu.domains.base import Domain
from ctu.episode.users.scripted import ScriptedUser


def task_index(domains: list[Domain]) -> list[tuple[str, object, object]]:
    """(the scenario text the simulator's prompt quotes, the domain, the task) for every task."""
    out = []
    for domain in domains:
        for task in domain.tasks:
            instructions = (task.user_scenario or {}).get("instructions")
            key = instructions.get("reason_for_call") if isinstance(instructions, dict) else instructions
            if key:
                out.append((str(key).strip(), domain, task))
    return sorted(out, key=lambda t: -len(t[0]))  # the longest quote wins where one contains another


def scripted_reply(index, messages: list[dict], patience: int = 8) -> str:
    """The scripted user's reply after the agent messages in ``messages`` (the simulator's own history: the
    agent speaks as ``user``, the customer as ``assistant``), replayed from the start so the server keeps no
    state between requests."""
    system = next((m.get("content") or "" for m in messages if m.get("role") == "system"), "")
    found = next(((d, t) for key, d, t in index if key in system), None)
    if found is None:
        raise LookupError("no task's scenario appears in the system prompt")
    domain, task = found
    session = ScriptedUser(patience).start(domain, task, seed=0)
    agent_turns = [m.get("content") or "" for m in messages if m.get("role") == "user"]

    async def replay() -> str:
        reply = ""
        for said in agent_turns:
            reply = await session.reply(said)
        return reply

    return asyncio.run(replay())


def make_handler(index, latency: tuple[float, float], stats: dict):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # quiet: one line per request would drown the benchmark's output
            pass

        def _send(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path.rstrip("/").endswith("/models"):
                self._send(200, {"object": "list", "data": [{"id": "slow-user", "object": "model"}]})
            else:
                self._send(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self) -> None:
            if not self.path.rstrip("/").endswith("/chat/completions"):
                self._send(404, {"error": {"message": f"no route {self.path}"}})
                return
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                text = scripted_reply(index, body["messages"])
            except (LookupError, ValueError, TypeError) as exc:
                self._send(400, {"error": {"message": f"slow user: {exc}"}})
                return
            digest = hashlib.sha256(json.dumps(body["messages"], sort_keys=True).encode()).digest()
            wait = random.Random(digest).uniform(*latency)  # the same conversation waits the same
            time.sleep(wait)
            with stats["lock"]:
                stats["requests"] += 1
                stats["waited_s"] += wait
            self._send(200, {
                "id": "chatcmpl-slow", "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model", "slow-user"),
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": text}}],
                "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}})

    return Handler


def serve(domains: list[Domain], port: int = 0, latency: tuple[float, float] = (1.0, 2.0)):
    """Start the server in a thread: (server, its base URL, its stats). ``server.shutdown()`` stops it."""
    stats = {"requests": 0, "waited_s": 0.0, "lock": threading.Lock()}
    server = ThreadingHTTPServer(("127.0.0.1", port), make_handler(task_index(domains), latency, stats))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/v1", stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--latency", type=float, nargs=2, default=(1.0, 2.0), metavar=("LOW", "HIGH"))
    ap.add_argument("--domains", nargs="*", default=["mini"])
    args = ap.parse_args()
    from ctu.domains import get_domain

    server, url, stats = serve([get_domain(name) for name in args.domains], args.port, tuple(args.latency))
    print(f"slow user at {url} (replies wait {args.latency[0]}-{args.latency[1]} s)", flush=True)
    try:
        while True:
            time.sleep(60)
            print(f"{stats['requests']} replies, {stats['waited_s']:.0f} s waited", flush=True)
    except KeyboardInterrupt:
        server.shutdown()


if __name__ == "__main__":
    main()

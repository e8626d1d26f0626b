"""A real HTTP/1.1 keep-alive server on 127.0.0.1 (stdlib) that answers OpenAI chat completions from a script.

Unlike respx it goes through real sockets and httpx's connection pool, which is what the "Event loop is
closed" bug needs. ``script`` is a list of ``(status, body_or_text, headers)`` served in order (the last
one repeats), each ``delay`` seconds after its request; every request's JSON body is kept in ``requests``. :class:`SilentServer` accepts requests and never
answers.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def completion(text: str) -> dict:
    return {"id": "x", "object": "chat.completion", "created": 0, "model": "stub", "choices": [
        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}]}


class StubChatServer:
    def __init__(self, script=None, delay: float = 0.0):
        self.script = list(script or [(200, completion("hello"), {})])
        self.delay = delay  # seconds before each answer (a slow model behind the API)
        self.requests: list[dict] = []
        self.connections = 0
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive: clients pool the connection

            def setup(self):
                super().setup()
                stub.connections += 1

            def do_POST(self):  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                stub.requests.append(json.loads(body or b"{}"))
                time.sleep(stub.delay)
                status, payload, headers = stub.script[min(len(stub.requests), len(stub.script)) - 1]
                data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "text/plain" if isinstance(payload, str) else "application/json")
                self.send_header("content-length", str(len(data)))
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> StubChatServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class SilentServer:
    """Accepts connections and reads requests (GET and POST), never answers (until closed, or 10 s)."""

    def __init__(self):
        self.release = threading.Event()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's naming
                stub.release.wait(10)

            do_GET = do_POST

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()

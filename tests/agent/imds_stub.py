"""An IMDSv2 stub on the loopback: the token flow, spot notices the test arms, and instance tags.

- `PUT /latest/api/token` needs `X-aws-ec2-metadata-token-ttl-seconds` (1..21600), else 400; it
  answers a new token valid for that many seconds.
- Every `GET /latest/...` needs a valid `X-aws-ec2-metadata-token`, else 401.
- `meta-data/spot/instance-action` and `meta-data/events/recommendations/rebalance` answer 404 until
  the test arms them; `meta-data/tags/instance/<key>` answers the tags the test sets.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"


class ImdsStub:
    def __init__(self) -> None:
        self.tags: dict[str, str] = {}
        self.values: dict[str, str] = {"meta-data/placement/region": "us-east-1", "meta-data/instance-id": "i-0stub"}
        self.instance_action: dict[str, str] | None = None
        self.rebalance: dict[str, str] | None = None
        self.tokens: dict[str, float] = {}  # token -> expiry (monotonic)
        self.token_requests = 0
        self.gets: dict[str, int] = {}  # path -> GETs answered (with a valid token)
        self.rejected: list[tuple[str, int]] = []  # (path, status) of requests refused (400, 401, 405)
        self.lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def endpoint(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def arm_interruption(self, action: str = "terminate", at: str = "2026-11-30T12:02:00Z") -> None:
        with self.lock:
            self.instance_action = {"action": action, "time": at}

    def arm_rebalance(self, notice_time: str = "2026-11-30T12:00:00Z") -> None:
        with self.lock:
            self.rebalance = {"noticeTime": notice_time}

    def get_count(self, path: str) -> int:
        with self.lock:
            return self.gets.get(path, 0)

    def revoke_tokens(self) -> None:
        with self.lock:
            self.tokens.clear()

    # --- the server ---------------------------------------------------------------------------------

    def answer(self, method: str, path: str, headers: dict[str, str]) -> tuple[int, str]:
        with self.lock:
            if method == "PUT":
                if path != "/latest/api/token":
                    return 405, ""
                ttl = headers.get(TTL_HEADER.lower(), "")
                if not ttl.isdigit() or not 1 <= int(ttl) <= 21600:
                    return 400, "missing or invalid TTL header"
                new_token = secrets.token_urlsafe(24)
                self.tokens[new_token] = time.monotonic() + int(ttl)
                self.token_requests += 1
                return 200, new_token
            token = headers.get(TOKEN_HEADER.lower())
            if token is None or self.tokens.get(token, 0) < time.monotonic():
                return 401, ""
            if not path.startswith("/latest/"):
                return 404, ""
            key = unquote(path.removeprefix("/latest/"))
            self.gets[key] = self.gets.get(key, 0) + 1
            if key == "meta-data/spot/instance-action":
                return (404, "") if self.instance_action is None else (200, json.dumps(self.instance_action))
            if key == "meta-data/events/recommendations/rebalance":
                return (404, "") if self.rebalance is None else (200, json.dumps(self.rebalance))
            if key.startswith("meta-data/tags/instance/"):
                value = self.tags.get(key.removeprefix("meta-data/tags/instance/"))
                return (404, "") if value is None else (200, value)
            value = self.values.get(key)
            return (404, "") if value is None else (200, value)

    @contextmanager
    def running(self) -> Iterator[ImdsStub]:
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                headers = {k.lower(): v for k, v in self.headers.items()}
                status, body = stub.answer(self.command, self.path, headers)
                if status in {400, 401, 405}:
                    with stub.lock:
                        stub.rejected.append((self.path, status))
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = _serve
            do_PUT = _serve

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        thread = threading.Thread(target=self._server.serve_forever, name="imds-stub", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._server.shutdown()
            self._server.server_close()
            thread.join(timeout=5)

"""Local receivers that alerts are really delivered to: an HTTP server (Apprise ``json://`` and
runyard's signed webhook) and an SMTP server (aiosmtpd, for Apprise ``mailto://``), each in a
thread of the test process."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from aiosmtpd.controller import Controller


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class HttpReceiver:
    port: int
    posts: list[Received] = field(default_factory=list)
    delay_s: float = 0.0  # a slow channel: each answer waits this long
    status: int = 200

    def url(self, scheme: str, path: str) -> str:
        return f"{scheme}://127.0.0.1:{self.port}{path}"

    def on(self, path: str) -> list[Received]:
        return [p for p in self.posts if p.path == path]

    def wait_for(self, count: int, timeout: float = 10.0) -> list[Received]:
        deadline = time.monotonic() + timeout
        while len(self.posts) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        return list(self.posts)


@contextmanager
def http_receiver(delay_s: float = 0.0, status: int = 200) -> Iterator[HttpReceiver]:
    box: dict[str, HttpReceiver] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            receiver = box["r"]
            if receiver.delay_s:
                time.sleep(receiver.delay_s)
            receiver.posts.append(Received(self.path, {k: v for k, v in self.headers.items()}, body))
            self.send_response(receiver.status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    box["r"] = HttpReceiver(port=server.server_address[1], delay_s=delay_s, status=status)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield box["r"]
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def smtp_receiver() -> Iterator[tuple[int, list[Any]]]:
    """An SMTP server on a free local port; yields (port, the messages it received)."""
    messages: list[Any] = []

    class Handler:
        async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
            messages.append(envelope)
            return "250 OK"

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    controller = Controller(Handler(), hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield port, messages
    finally:
        controller.stop()

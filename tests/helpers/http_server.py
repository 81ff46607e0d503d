"""A real HTTP server on 127.0.0.1 for download tests, with the failures networks produce.

    with LocalServer() as server:
        server.route("/a/b.json", Reply(b"{...}"))                  # 200 with that body
        server.route("/x", Reply(status=500), Reply(b"ok"))          # 500 first, then 200 (last repeats)
        server.route("/y", Reply(b"...", fault="truncate"))          # half the body, then close
        fetch(server.url("/a/b.json"))
        server.hits["/x"]                                            # requests seen per path

Faults: "truncate" (declares the full Content-Length, sends half, closes), "reset" (closes with
TCP RST before answering), "stall" (sends nothing until `stall_s` passes or the server stops),
"stall_body" (headers and half the body, then nothing).
`hold_until(n)` makes every request wait until n requests are in flight, so tests can prove two
downloads really overlapped. Everything is bounded: the server thread and stalled handlers end
when the context exits.
"""

from __future__ import annotations

import collections
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Reply:
    body: bytes = b""
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    fault: str | None = None  # None | "truncate" | "reset" | "stall" | "stall_body" | "trickle"


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


App = Callable[[Request], Reply | None]


class LocalServer:
    def __init__(self, app: App | None = None, stall_s: float = 20.0):
        self.app, self.stall_s = app, stall_s
        self.routes: dict[str, list[Reply]] = {}
        self.hits: collections.Counter[str] = collections.Counter()
        self.requests: list[Request] = []
        self.stop = threading.Event()
        self._barrier: threading.Barrier | None = None
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def url(self, path: str) -> str:
        return self.base_url + path

    def route(self, path: str, *replies: Reply) -> None:
        self.routes[path] = list(replies)

    def hold_until(self, n: int, timeout: float = 10.0) -> None:
        self._barrier = threading.Barrier(n, timeout=timeout)

    def reply_for(self, request: Request) -> Reply:
        with self._lock:
            self.hits[request.path] += 1
            self.requests.append(request)
            queue = self.routes.get(request.path)
            if queue:
                return queue.pop(0) if len(queue) > 1 else queue[0]
        reply = self.app(request) if self.app else None
        return reply or Reply(b"not found", status=404)

    def wait_for_peers(self) -> None:
        if self._barrier is not None:
            try:
                self._barrier.wait()
            except threading.BrokenBarrierError:
                pass

    def __enter__(self) -> LocalServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        if self._barrier is not None:
            self._barrier.abort()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


def _handler_for(server: LocalServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # keep test output quiet
            pass

        def _serve(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            request = Request(self.command, self.path.split("?")[0], dict(self.headers), body)
            reply = server.reply_for(request)
            server.wait_for_peers()
            _send(self, reply, server)

        do_GET = do_HEAD = do_POST = do_PUT = _serve

    return Handler


def _send(handler: BaseHTTPRequestHandler, reply: Reply, server: LocalServer) -> None:
    if reply.fault == "reset":
        handler.request.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        handler.request.close()
        return
    if reply.fault == "stall":
        server.stop.wait(server.stall_s)
        return
    handler.send_response(reply.status)
    headers = {"Content-Length": str(len(reply.body)), **reply.headers}
    for key, value in headers.items():
        handler.send_header(key, value)
    handler.end_headers()
    if handler.command == "HEAD":
        return
    if reply.fault == "trickle":  # a byte every 50 ms, until the client or the test gives up
        for byte in reply.body:
            if server.stop.wait(0.05):
                return
            try:
                handler.wfile.write(bytes([byte]))
                handler.wfile.flush()
            except OSError:
                return
        return
    body = reply.body[: len(reply.body) // 2] if reply.fault in ("truncate", "stall_body") else reply.body
    handler.wfile.write(body)
    handler.wfile.flush()
    if reply.fault == "stall_body":
        server.stop.wait(server.stall_s)
    if reply.fault in ("truncate", "stall_body"):
        handler.close_connection = True

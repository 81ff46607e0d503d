"""A `duocal serve` app on a real socket in this process (so a test sees its pool), and plain HTTP to it."""

from __future__ import annotations

import contextlib
import http.client
import json
import threading
import time

import uvicorn

from duocal.serving.startup import ServeSettings, listening_socket, prepare_server, server_url

NAME = "duocal/demo-model"
SMALL_POOL = {"sparsity": 0.5, "num_blocks": 128, "max_batch_tokens": 2048, "page_size": 16}


@contextlib.contextmanager
def running_server(host="127.0.0.1", **settings):
    """(ServedModel, base URL) of the demo model served on `host`; stopped within 30 s whatever happens."""
    served, _ = prepare_server(ServeSettings(**{**SMALL_POOL, **settings}))
    sock = listening_socket(host, 0)
    app = uvicorn.Server(uvicorn.Config(served.app, log_level="critical"))
    thread = threading.Thread(target=app.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.perf_counter() + 30
    while not app.started and time.perf_counter() < deadline:
        time.sleep(0.05)
    try:
        yield served, server_url(host, sock.getsockname()[1])
    finally:
        app.should_exit = True
        thread.join(timeout=30)
        served.manager.stop(block=True, hard_stop=True, timeout=10)
        served.runtime.remove()


def call(base, method, path, body=None, timeout=60) -> tuple[int, bytes, dict]:
    """(status, raw body, headers) of one request over a fresh connection (IPv6 bases too)."""
    host, port = base.removeprefix("http://").rsplit(":", 1)
    connection = http.client.HTTPConnection(host.strip("[]"), int(port), timeout=timeout)
    data = None if body is None else json.dumps(body).encode()
    try:
        connection.request(method, path, data, {"content-type": "application/json"})
        response = connection.getresponse()
        return response.status, response.read(), dict(response.getheaders())
    finally:
        connection.close()

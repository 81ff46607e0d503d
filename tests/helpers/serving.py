"""A `duocal serve` app on a real socket in this process (so a test sees its pool), and plain HTTP to it."""

from __future__ import annotations

import contextlib
import http.client
import json
import threading
import time

from duocal.serving.addresses import listening_socket, server_url
from duocal.serving.startup import ServeSettings, prepare_server

NAME = "duocal/demo-model"
SMALL_POOL = {"sparsity": 0.5, "num_blocks": 128, "max_batch_tokens": 2048, "page_size": 16}  # the demo model's


def pool_is_whole(served, seconds=20) -> bool:
    """Every page of a served model's pool is free again (polled for `seconds`)."""
    cache, deadline = served.manager.cache, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        if cache.free_sectors() == cache.num_sectors:
            return True
        time.sleep(0.05)
    return False


@contextlib.contextmanager
def served_over_http(settings, log_level="warning", host="127.0.0.1"):
    """`prepare_server(settings)` listening on a free port of `host` from a thread of this process (so a
    test sees the pool): yields (served, pool summary, base URL); stopped within 30 s whatever happens."""
    import uvicorn

    served, summary = prepare_server(settings)
    sock = listening_socket(host, 0)
    app = uvicorn.Server(uvicorn.Config(served.app, log_level=log_level))
    thread = threading.Thread(target=app.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.perf_counter() + 30
    while not app.started and time.perf_counter() < deadline:
        time.sleep(0.05)
    try:
        yield served, summary, server_url(host, sock.getsockname()[1])
    finally:
        app.should_exit = True
        thread.join(timeout=30)
        served.manager.stop(block=True, hard_stop=True, timeout=10)
        served.runtime.remove()


@contextlib.contextmanager
def running_server(host="127.0.0.1", **settings):
    """`served_over_http` of the demo model (SMALL_POOL, unless `settings` say otherwise) on `host`: (ServedModel,
    pool summary, base URL); stopped within 30 s whatever happens."""
    with served_over_http(ServeSettings(**{**SMALL_POOL, **settings}), "critical", host) as running:
        yield running


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

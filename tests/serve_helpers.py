"""A `duocal serve` app on a real socket in this process (so a test sees its pool), and plain HTTP to it."""

from __future__ import annotations

import contextlib
import http.client
import json

from duocal.serving.startup import ServeSettings

from helpers import served_over_http

NAME = "duocal/demo-model"
SMALL_POOL = {"sparsity": 0.5, "num_blocks": 128, "max_batch_tokens": 2048, "page_size": 16}


@contextlib.contextmanager
def running_server(host="127.0.0.1", **settings):
    """(ServedModel, base URL) of the demo model served on `host`; stopped within 30 s whatever happens."""
    with served_over_http(ServeSettings(**{**SMALL_POOL, **settings}), "critical", host) as (served, _, base):
        yield served, base


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

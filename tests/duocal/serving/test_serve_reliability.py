"""A `duocal serve` no request can kill (issue 36), against a real server on 127.0.0.1: empty prompts,
one X-Request-ID twice, transformers' admin routes, bodies over the limit, malformed and deeply nested
JSON, a failing handler, clients that go away while queued; every error in OpenAI's shape, the worker
still serving after each, and its pages all back."""

import gc
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from duocal.serving.startup import ServeSettings, prepare_server
from duocal_runtime.paged.manager import PlanRequestError

from helpers.serving import pool_is_whole

NAME = "duocal/demo-model"
LIMIT = 64 * 1024


def client(base):
    return openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=120)


def nested(levels: int):
    value = 1
    for _ in range(levels):
        value = [value]
    return value


def request(base, method, path, body=b"", headers=None, timeout=60) -> tuple[int, dict, dict]:
    """(status, JSON body, headers) of one request over a fresh connection."""
    host, port = base.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        connection.request(method, path, body, {"content-type": "application/json", **(headers or {})})
        response = connection.getresponse()
        return response.status, json.loads(response.read() or b"null"), dict(response.getheaders())
    finally:
        connection.close()


def post(base, path, body, headers=None):
    return request(base, "POST", path, body if isinstance(body, bytes) else json.dumps(body).encode(), headers)


def assert_error(status, body, want_status, words="", param=None):
    assert status == want_status, body
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert words in body["error"]["message"], body
    assert body["error"]["param"] == param, body


def still_serving(served, base):
    """The worker answers a valid request with tokens, /health is 200, no handler or page is left."""
    status, body, _ = post(base, "/v1/completions", {"model": NAME, "prompt": "abc", "max_tokens": 4})
    assert status == 200 and body["usage"]["completion_tokens"] == 4, body
    assert request(base, "GET", "/health")[0] == 200
    assert pool_is_whole(served)
    deadline = time.perf_counter() + 10
    while served.manager.output_router.result_handlers and time.perf_counter() < deadline:
        time.sleep(0.05)
    assert not served.manager.output_router.result_handlers  # none leaked


@pytest.mark.parametrize("body", [{"prompt": ""}, {}, {"prompt": None}], ids=["empty", "missing", "null"])
def test_an_empty_or_missing_prompt_is_a_400_and_the_worker_keeps_serving(demo_server, body):
    served, _, base = demo_server
    status, answer, _ = post(base, "/v1/completions", {"model": NAME, "max_tokens": 3, **body})
    assert_error(status, answer, 400, "prompt must be a non-empty string", "prompt")
    with pytest.raises(PlanRequestError, match="the prompt is empty"):
        served.manager.add_request([], max_new_tokens=3)
    still_serving(served, base)


def test_requests_with_one_x_request_id_all_complete(demo_server):
    served, _, base = demo_server
    body = {"model": NAME, "prompt": "the passkey is", "max_tokens": 8}

    def one(i):
        if i % 2:  # streams and plain requests, all with the same header
            stream = client(base).with_options(default_headers={"X-Request-ID": "same"})
            return next(c.id for c in stream.completions.create(**body, stream=True))
        status, answer, headers = post(base, "/v1/completions", body, {"X-Request-ID": "same"})
        assert status == 200 and answer["usage"]["completion_tokens"] == 8, answer
        assert headers["x-request-id"] == answer["id"]
        return answer["id"]

    with ThreadPoolExecutor(6) as pool:
        ids = list(pool.map(one, range(6), timeout=60))
    assert len(set(ids)) == 6 and all(i.startswith("same-") for i in ids)
    still_serving(served, base)


@pytest.mark.parametrize(
    "method, path, status",
    [
        ("POST", "/reset", 404),
        ("POST", "/load_model", 404),
        ("POST", "/v1/systemone", 404),
        ("POST", "/v1/audio/transcriptions", 404),
        ("GET", "/docs", 404),
        ("GET", "/v1/completions", 405),
    ],
)
def test_only_the_routes_we_mean_exist(demo_server, method, path, status):
    served, _, base = demo_server
    got, answer, _ = request(base, method, path, b'{"model": "' + NAME.encode() + b'"}')
    assert_error(got, answer, status)
    assert request(base, "GET", "/v1/models")[1]["data"][0]["id"] == NAME
    still_serving(served, base)


def test_health_is_503_once_the_worker_is_gone():
    from starlette.testclient import TestClient

    served, _ = prepare_server(ServeSettings(sparsity=0.5, num_blocks=32, max_batch_tokens=256, page_size=16))
    try:
        with TestClient(served.app) as http:
            assert http.get("/health").status_code == 200
            served.manager.stop(block=True, hard_stop=True, timeout=10)
            status, answer = (lambda r: (r.status_code, r.json()))(http.get("/health"))
            assert_error(status, answer, 503, "the batching worker is not running")
    finally:
        served.manager.stop(block=True, hard_stop=True, timeout=10)
        served.runtime.remove()


def test_a_body_over_the_limit_is_a_413(demo_server):
    served, _, base = demo_server
    big = json.dumps({"model": NAME, "prompt": "a" * (LIMIT + 10), "max_tokens": 3}).encode()
    status, answer, _ = post(base, "/v1/completions", big)
    assert_error(status, answer, 413, f"({LIMIT:,} bytes)")
    assert answer["error"]["code"] == "request_too_large"
    status, answer, _ = request(base, "POST", "/v1/completions", b"", {"content-length": str(10**9)})
    assert_error(status, answer, 413, f"({LIMIT:,} bytes)")
    still_serving(served, base)


@pytest.mark.parametrize(
    "path, body, words, param",
    [
        ("/v1/completions", b'{"prompt": ' + b"[" * 20_000 + b"]" * 20_000 + b"}", "nested more than", None),
        ("/v1/completions", {"prompt": nested(40)}, "nested more than", None),
        ("/v1/completions", b"[1, 2]", "must be a JSON object", None),
        ("/v1/completions", b"\xff\xfe", "not valid JSON", None),
        ("/v1/completions", {"prompt": "a", "temperature": "hot"}, "temperature must be a number", "temperature"),
        ("/v1/completions", {"prompt": "a", "top_p": 7}, "top_p must be a number", "top_p"),
        ("/v1/completions", {"prompt": "a", "stream": "yes"}, "stream must be true or false", "stream"),
        ("/v1/completions", {"prompt": "a", "max_tokens": True}, "max_tokens must be a positive integer", "max_tokens"),
        ("/v1/completions", {"prompt": "a", "seed": 1.5}, "seed must be an integer", "seed"),
        ("/v1/completions", {"prompt": "a", "stop": [1]}, "stop must be a non-empty string", "stop"),
        ("/v1/completions", {"prompt": "a", "model": 5}, "model must be a string", "model"),
        ("/v1/completions", {"prompt": "a", "generation_config": "{}"}, "not accepted", "generation_config"),
        ("/v1/completions", {"prompt": 5}, "prompt must be a non-empty string", "prompt"),
        ("/v1/completions", {"prompt": "a", "surprise": 1}, "Unexpected fields", None),
        ("/v1/chat/completions", {"messages": "hi"}, "messages must be a non-empty list", "messages"),
        ("/v1/chat/completions", {"messages": [{"content": "hi"}]}, "messages[0].role must be", "messages"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, "content must be", "messages"),
        ("/v1/responses", {"input": 5}, "input must be a non-empty list", "input"),
        ("/v1/responses", {"input": [{"type": "input_text", "text": 3}]}, "text parts need", "input"),
    ],
)
def test_malformed_bodies_are_a_400_that_names_the_field(demo_server, path, body, words, param):
    served, _, base = demo_server
    status, answer, _ = post(base, path, body)
    assert_error(status, answer, 400, words, param)
    still_serving(served, base)


def test_a_handler_that_fails_is_a_500_in_the_error_shape(demo_server, monkeypatch):
    from transformers.cli.serving.completion import CompletionHandler

    served, _, base = demo_server

    async def broken(self, body, request_id):
        raise KeyError("a bug")

    monkeypatch.setattr(CompletionHandler, "handle_request", broken)
    status, answer, _ = post(base, "/v1/completions", {"model": NAME, "prompt": "abc"})
    assert_error(status, answer, 500, "KeyError")
    monkeypatch.undo()
    still_serving(served, base)


def test_a_client_that_goes_away_before_its_answer_cancels_its_generation(demo_server):
    """Non-streaming: no byte is written before the end, so only the watch on the connection sees it go."""
    served, _, base = demo_server
    cache = served.manager.cache
    host, port = base.removeprefix("http://").split(":")
    body = {"model": NAME, "prompt": "x" * 200, "max_tokens": 1500}
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    connection.request("POST", "/v1/completions", json.dumps(body), {"content-type": "application/json"})
    deadline = time.perf_counter() + 20
    while cache.free_sectors() == cache.num_sectors and time.perf_counter() < deadline:
        time.sleep(0.01)
    assert cache.free_sectors() < cache.num_sectors  # it is generating
    connection.sock.shutdown(socket.SHUT_RDWR)
    connection.close()
    gone = time.perf_counter()
    assert pool_is_whole(served, seconds=5)
    assert time.perf_counter() - gone < 5  # cancelled: 1500 tokens take far longer
    still_serving(served, base)


def wait_for_port(port: int, process, seconds=90) -> None:
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline and process.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError("the server did not start")


def test_ctrl_c_says_it_drains_and_a_second_one_stops_quietly():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "duocal", "serve", "--port", str(port), "--num-blocks", "128"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_port(port, process)
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        body = {"model": NAME, "prompt": "x" * 100, "max_tokens": 1500, "stream": True}
        connection.request("POST", "/v1/completions", json.dumps(body), {"content-type": "application/json"})
        connection.getresponse().readline()  # a stream is open
        process.send_signal(signal.SIGINT)
        time.sleep(1)
        assert process.poll() is None  # draining: the stream still runs
        process.send_signal(signal.SIGINT)
        second = time.perf_counter()
        _, err = process.communicate(timeout=30)
        assert time.perf_counter() - second < 15
    finally:
        process.kill()
        process.communicate(timeout=30)
    assert "draining 1 open request(s) and streams; Ctrl-C again to stop now" in err
    assert "Traceback" not in err and "ERROR" not in err, err
    assert process.returncode == 130


def resident_bytes() -> int:
    """This process's resident memory (the server runs in it), from /proc."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_64_mixed_requests_at_once_leave_a_server_that_answers_and_a_whole_pool(demo_server):
    """Valid streams and plain requests, bad bodies, clients that leave and one X-Request-ID for many;
    afterwards the pool is all free and the process's memory is within 10% of what it was before."""
    served, _, base = demo_server
    still_serving(served, base)  # warm: the first requests allocate what every later one reuses
    start = resident_bytes()
    host, port = base.removeprefix("http://").split(":")
    valid = {"model": NAME, "prompt": "the passkey is", "max_tokens": 6}

    def one(i):
        kind = i % 4
        if kind == 0:
            return len("".join(c.choices[0].text for c in client(base).completions.create(**valid, stream=True))) > 0
        if kind == 1:
            status, answer, _ = post(base, "/v1/completions", valid, {"X-Request-ID": "shared"})
            return status == 200 and answer["usage"]["completion_tokens"] == 6
        if kind == 2:
            status, answer, _ = post(base, "/v1/completions", {**valid, "prompt": ["bad"] * (i % 3)})
            return status == 400 and answer["error"]["param"] == "prompt"
        connection = http.client.HTTPConnection(host, int(port), timeout=60)
        connection.request("POST", "/v1/completions", json.dumps({**valid, "max_tokens": 500}), {})
        time.sleep(0.2)
        connection.sock.shutdown(socket.SHUT_RDWR)  # gone before its answer
        connection.close()
        return True

    with ThreadPoolExecutor(64) as pool:
        assert all(pool.map(one, range(64), timeout=120))
    still_serving(served, base)
    gc.collect()
    assert resident_bytes() <= 1.1 * start, f"resident memory grew from {start:,} to {resident_bytes():,} bytes"

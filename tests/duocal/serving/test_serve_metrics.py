"""`duocal serve`'s GET /metrics (Prometheus text format) and OpenAPI schema, and its IPv6 addresses, over
HTTP against a real server: counters move by what requests did, pages come back to 0 used."""

import json
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from duocal.serving.addresses import listening_socket, server_url
from duocal.serving.openapi import common_fields
from duocal.serving.request_checks import COMMON_FIELDS

from helpers.serving import NAME, call, running_server


def scrape(base) -> dict:
    """{(sample name, ((label, value), ...)): value} of one GET /metrics."""
    status, text, headers = call(base, "GET", "/metrics")
    assert status == 200 and headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
    }


def value(samples: dict, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def groups(samples: dict) -> set[str]:
    return {dict(labels)["group"] for name, labels in samples if name == "duocal_kv_pages_used"}


def wait_for(condition, seconds=20):
    deadline = time.perf_counter() + seconds
    while not condition() and time.perf_counter() < deadline:
        time.sleep(0.05)
    return condition()


def test_tokens_requests_and_latency_grow_by_what_a_request_did(demo_server):
    _, _, base = demo_server
    before = scrape(base)
    status, body, _ = call(
        base, "POST", "/v1/completions", {"model": NAME, "prompt": "the passkey is", "max_tokens": 7}
    )
    usage = json.loads(body)["usage"]
    after = scrape(base)
    assert status == 200 and usage["completion_tokens"] == 7
    grew = {
        name: value(after, name, **labels) - value(before, name, **labels)
        for name, labels in [
            ("duocal_generated_tokens_total", {}),
            ("duocal_prompt_tokens_total", {}),
            ("duocal_requests_total", {"route": "/v1/completions", "status": "200"}),
            ("duocal_request_duration_seconds_count", {"route": "/v1/completions"}),
        ]
    }
    assert grew == {
        "duocal_generated_tokens_total": 7,
        "duocal_prompt_tokens_total": usage["prompt_tokens"],
        "duocal_requests_total": 1,
        "duocal_request_duration_seconds_count": 1,
    }
    took = value(after, "duocal_request_duration_seconds_sum", route="/v1/completions") - value(
        before, "duocal_request_duration_seconds_sum", route="/v1/completions"
    )
    assert 0 < took < 60


def test_errors_are_counted_by_class(demo_server, monkeypatch):
    from transformers.cli.serving.completion import CompletionHandler

    _, _, base = demo_server
    before = scrape(base)
    assert call(base, "POST", "/v1/completions", {"model": NAME, "prompt": ""})[0] == 400
    assert call(base, "GET", "/no/such/route")[0] == 404

    async def broken(self, body, request_id):
        raise KeyError("a bug")

    monkeypatch.setattr(CompletionHandler, "handle_request", broken)
    assert call(base, "POST", "/v1/completions", {"model": NAME, "prompt": "abc"})[0] == 500
    after = scrape(base)
    moved = [
        (
            labels,
            value(after, "duocal_request_errors_total", **labels)
            - value(before, "duocal_request_errors_total", **labels),
        )
        for labels in [
            {"route": "/v1/completions", "class": "4xx"},
            {"route": "other", "class": "4xx"},
            {"route": "/v1/completions", "class": "5xx"},
        ]
    ]
    assert [m for _, m in moved] == [1, 1, 1], moved
    assert value(after, "duocal_requests_total", route="/v1/completions", status="400") >= 1


def test_pages_and_running_requests_follow_a_stream_and_return_to_zero(demo_server):
    served, _, base = demo_server
    idle = scrape(base)
    assert groups(idle) == set(served.manager.cache.cache_allocators) and groups(idle)
    cache = served.manager.cache
    per_sector = {g: cache.cache_allocators[g].blocks_per_sector for g in groups(idle)}
    assert all(value(idle, "duocal_kv_pages_used", group=g) == 0 for g in groups(idle))
    assert all(value(idle, "duocal_kv_pages_free", group=g) == cache.num_sectors * per_sector[g] for g in groups(idle))
    assert value(idle, "duocal_requests_running") == 0 and value(idle, "duocal_requests_waiting") == 0
    host, port = base.removeprefix("http://").split(":")
    connection = socket.create_connection((host, int(port)), timeout=60)
    body = json.dumps({"model": NAME, "prompt": "x" * 200, "max_tokens": 1500, "stream": True}).encode()
    head = f"POST /v1/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\ncontent-length: {len(body)}"
    connection.sendall(head.encode() + b"\r\n\r\n" + body)
    connection.recv(4096)  # the headers are out; the request may still wait for the batching worker

    def running_with_pages() -> bool:
        now = scrape(base)
        return value(now, "duocal_requests_running") == 1 and all(
            value(now, "duocal_kv_pages_used", group=g) >= 1 for g in groups(now)
        )

    assert wait_for(running_with_pages)
    busy = scrape(base)
    for g in groups(busy):
        used, free = value(busy, "duocal_kv_pages_used", group=g), value(busy, "duocal_kv_pages_free", group=g)
        assert used >= 1 and 0 <= free <= cache.num_sectors * per_sector[g] - used, g
        assert value(busy, "duocal_kv_page_bytes", group=g) == served.manager.cache.cache_allocators[g].bytes_per_block
    assert value(busy, "duocal_kv_sectors_free") < value(busy, "duocal_kv_sectors")
    connection.shutdown(socket.SHUT_RDWR)  # the client goes: its generation is cancelled
    connection.close()
    assert wait_for(lambda: all(value(scrape(base), "duocal_kv_pages_used", group=g) == 0 for g in groups(busy)))
    final = scrape(base)
    assert value(final, "duocal_requests_running") == 0
    assert value(final, "duocal_kv_sectors_free") == value(final, "duocal_kv_sectors") == cache.num_sectors
    assert all(value(final, "duocal_kv_pages_free", group=g) == cache.num_sectors * per_sector[g] for g in groups(idle))


def test_a_request_queued_behind_a_paused_worker_counts_as_waiting(demo_server):
    served, _, base = demo_server
    assert wait_for(lambda: value(scrape(base), "duocal_requests_running") == 0)  # earlier tests' requests ended
    answers = []
    with served.manager.pause():
        thread = threading.Thread(
            target=lambda: answers.append(
                call(base, "POST", "/v1/completions", {"model": NAME, "prompt": "ab", "max_tokens": 3})
            )
        )
        thread.start()
        assert wait_for(lambda: value(scrape(base), "duocal_requests_waiting") == 1, seconds=10)
        assert value(scrape(base), "duocal_requests_running") == 0
    thread.join(timeout=60)
    assert answers and answers[0][0] == 200
    assert value(scrape(base), "duocal_requests_waiting") == 0


def test_two_servers_in_one_process_keep_their_own_counts(demo_server):
    _, _, base = demo_server
    with running_server() as (_, _, other):
        assert call(other, "POST", "/v1/completions", {"model": NAME, "prompt": "ab", "max_tokens": 2})[0] == 200
        before, counted = scrape(base), scrape(other)
    assert value(counted, "duocal_generated_tokens_total") == 2
    assert value(scrape(base), "duocal_generated_tokens_total") == value(before, "duocal_generated_tokens_total")


def test_the_openapi_schema_describes_our_routes_and_the_fields_we_check(demo_server):
    _, _, base = demo_server
    status, text, _ = call(base, "GET", "/openapi.json")
    schema = json.loads(text)
    assert status == 200 and set(schema["paths"]) == {
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/responses",
        "/v1/models",
        "/v1/models/{model_id}",
        "/health",
        "/metrics",
    }
    body = schema["paths"]["/v1/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body["required"] == ["prompt"] and body["additionalProperties"] is False
    assert body["properties"]["max_tokens"] == {"type": "integer", "minimum": 1}
    assert body["properties"]["model"]["enum"] == [NAME]
    assert "generation_config" not in body["properties"]
    assert set(common_fields(NAME)) == set(COMMON_FIELDS)  # every field we check is typed in the schema


@pytest.mark.parametrize(
    "host, port, url",
    [
        ("::1", 8000, "http://[::1]:8000"),
        ("[::1]", 80, "http://[::1]:80"),
        ("::", 9000, "http://[::]:9000"),
        ("fe80::1%eth0", 8000, "http://[fe80::1%25eth0]:8000"),
        ("127.0.0.1", 8000, "http://127.0.0.1:8000"),
        ("localhost", 1, "http://localhost:1"),
    ],
)
def test_the_url_of_a_host(host, port, url):
    assert server_url(host, port) == url


def ipv6_loopback() -> bool:
    try:
        listening_socket("::1", 0).close()
        return True
    except ValueError:
        return False


@pytest.mark.skipif(not ipv6_loopback(), reason="this machine has no IPv6 loopback (the URL test above still runs)")
def test_serve_on_ipv6_prints_its_url_and_answers_there():
    command = [sys.executable, "-m", "duocal", "serve", "--host", "::1", "--port", "0", "--num-blocks", "64"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        assert line.startswith("serving duocal/demo-model at http://[::1]:"), line + process.stderr.read()
        base = line.split(" at ")[1].split("/v1")[0]
        assert wait_for(lambda: healthy(base), seconds=30)
        status, body, _ = call(base, "POST", "/v1/completions", {"model": NAME, "prompt": "ab", "max_tokens": 2})
        assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 2
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.communicate(timeout=30)
        finally:
            process.kill()


def healthy(base) -> bool:
    try:
        return call(base, "GET", "/health", timeout=2)[0] == 200
    except OSError:
        return False

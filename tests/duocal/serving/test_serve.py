"""`duocal serve` against a real server on 127.0.0.1 and a real client (the `openai` package):
many concurrent streams, disconnects, bad requests, a wrong profile at start-up; pages come back."""

import http.client
import json
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
import torch

import duocal_runtime as dr
from duocal.serving.startup import ServeSettings, prepare_server
from duocal_runtime.paged.quantized_pages import page_size_for, quantized_policies

from helpers.profiles import random_profile
from helpers.serving import pool_is_whole

NAME = "duocal/demo-model"


def client(base):
    return openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=120)


def post(base, path, body: bytes) -> tuple[int, str]:
    request = urllib.request.Request(base + path, data=body, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_64_concurrent_streams_all_complete_once(demo_server):
    served, _, base = demo_server

    def one(i):
        stream = client(base).completions.create(
            model=NAME, prompt=f"{i:03d} the passkey is", max_tokens=12, stream=True
        )
        chunks = list(stream)
        return {c.id for c in chunks}, "".join(c.choices[0].text for c in chunks), chunks[-1].choices[0].finish_reason

    with ThreadPoolExecutor(64) as pool:
        results = list(pool.map(one, range(64)))
    ids = [next(iter(r[0])) for r in results]
    assert all(len(r[0]) == 1 for r in results) and len(set(ids)) == 64  # none lost, none duplicated
    assert all(r[2] == "length" for r in results)
    assert pool_is_whole(served)


def test_a_client_that_disconnects_mid_stream_frees_its_pages(demo_server):
    served, _, base = demo_server
    body = {"model": NAME, "prompt": "x" * 200, "max_tokens": 1000, "stream": True}
    host, port = base.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    connection.request("POST", "/v1/completions", json.dumps(body), {"content-type": "application/json"})
    response = connection.getresponse()
    assert response.status == 200
    for _ in range(3):
        response.readline()  # a few events of a long stream
    assert served.manager.cache.free_sectors() < served.manager.cache.num_sectors
    connection.sock.shutdown(socket.SHUT_RDWR)  # the client goes away mid-stream
    connection.close()
    assert pool_is_whole(served)


@pytest.mark.parametrize(
    "body, message",
    [
        ({"model": NAME, "prompt": "abc", "max_tokens": -3}, "max_tokens must be a positive integer"),
        ({"model": NAME, "prompt": "abc", "max_tokens": "many"}, "max_tokens must be a positive integer"),
        ({"model": NAME, "prompt": "abc", "max_tokens": 10**8}, "beyond the model's"),
        ({"model": NAME, "prompt": "abc", "max_tokens": 4000, "stream": True}, "more than the whole pool"),
        ({"model": "someone/else", "prompt": "abc", "max_tokens": 3}, "model_not_found"),
        ({"model": NAME, "messages": [{"role": "user", "content": "hi"}]}, "no chat template"),
    ],
)
def test_bad_requests_get_a_4xx_that_says_why_and_the_server_keeps_serving(demo_server, body, message):
    served, _, base = demo_server
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    status, text = post(base, path, json.dumps(body).encode())
    assert 400 <= status < 500, text
    assert message in text
    status, text = post(base, path, b"{not json")
    assert status == 400 and "not valid JSON" in text
    ok = client(base).completions.create(model=NAME, prompt="abc", max_tokens=4)
    assert ok.usage.completion_tokens == 4
    assert pool_is_whole(served)


def test_a_profile_for_another_model_fails_at_start_up(tmp_path):
    wrong = dr.save_profile(random_profile(layers=3, kv_heads=2, heads=4, head_dim=8), tmp_path / "wrong.json")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from duocal.cli import app; app()",
            "serve",
            "--profile",
            str(wrong),
            "--port",
            str(port),
            "--num-blocks",
            "64",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert done.stderr.startswith("error: ") and "profile is for 3 layers" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_pool_summary_counts_requests_the_scheduler_can_admit(demo_server):
    served, summary, _ = demo_server
    cache = served.manager.cache
    assert summary["kv_bytes"] == cache.pool_size()
    assert summary["requests"] >= summary["plain_requests"]
    assert summary["bytes_per_request"] < summary["plain_bytes_per_request"]
    assert summary["requests"] * cache.sectors_for(summary["context"]) <= cache.num_sectors + summary["requests"]
    assert json.dumps(summary)  # printable as it is


def test_a_quantized_plan_is_served_on_pages_of_whole_code_groups(demo_server):
    _, plain_summary, _ = demo_server
    served, summary = prepare_server(ServeSettings(sparsity=0.5, num_blocks=128, max_batch_tokens=2048, kv_bits=4))
    try:
        cache, runtime = served.manager.cache, served.runtime
        page = cache.cache_allocators["full_attention"].tokens_per_page
        assert page == page_size_for(runtime.plan) and all(
            page % p.group == 0 for p in quantized_policies(runtime.plan)
        )
        assert summary["bytes_per_request"] < 0.6 * plain_summary["bytes_per_request"]
        assert summary["requests"] > plain_summary["requests"]
        prompt = [5 + i % 40 for i in range(295)]
        want = runtime.model.generate(
            input_ids=torch.tensor([prompt]), max_new_tokens=12, do_sample=False, cache=runtime.new_cache()
        )[0, len(prompt) :].tolist()
        rid = served.manager.add_request(prompt, max_new_tokens=12)
        out = served.manager.get_result(request_id=rid, timeout=120)
        while not out.is_finished():
            out = served.manager.get_result(request_id=rid, timeout=120)
        assert out.generated_tokens == want
    finally:
        served.manager.stop(block=True, hard_stop=True)
        served.runtime.remove()


@pytest.mark.parametrize(
    "options, message",
    [({"kv_bits": 3}, "kv_bits must be one of 16, 8, 4"), ({"kv_bits": 4, "page_size": 12}, "multiple of 16")],
)
def test_bad_code_options_fail_before_the_weights_load(options, message, monkeypatch):
    from duocal.models import ModelRef

    monkeypatch.setattr(ModelRef, "load_model", lambda self: pytest.fail("the weights loaded before the check"))
    page = options.pop("page_size", None)
    with pytest.raises(dr.PlanError, match=message):
        prepare_server(ServeSettings(sparsity=0.5, num_blocks=128, max_batch_tokens=2048, page_size=page, **options))


def test_the_default_page_holds_whole_code_groups():
    shape = dr.ModelShape(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=64)
    assert page_size_for(dr.uniform_plan(shape, dr.Full())) == 16
    assert page_size_for(dr.uniform_plan(shape, dr.Full(kv_bits=4, group=32))) == 32
    assert page_size_for(dr.uniform_plan(shape, dr.Full(kv_bits=8, group=8))) == 16

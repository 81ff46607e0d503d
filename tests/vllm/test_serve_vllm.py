"""`duocal serve MODEL --engine vllm`: vLLM's own OpenAI server with the plugin and the shipped profile at 0.5.

One server for the whole module (a start takes minutes here): a chat completion over HTTP under the name the
user gave, the start-up lines (vLLM's KV size, duocal's ratio to stock vLLM in the same space, checked against
a stock engine with the same settings), a request cancelled mid-stream gives all its blocks back, and Ctrl-C
stops the server with exit code 0."""

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ENV, kv_cache_tokens, run_vllm

PORT = 8763
NAME = "smollm2-135m-instruct"
SETTINGS = ["--max-model-len", "2048", "--dtype", "float32", "--max-num-batched-tokens", "512", "--enforce-eager"]
DUOCAL = Path(sys.executable).parent / "duocal"


def request(method: str, path: str, body=None, timeout=120):
    conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=timeout)
    conn.request(method, path, body=json.dumps(body) if body else None, headers={"content-type": "application/json"})
    return conn, conn.getresponse()


def metric(name: str) -> float:
    conn, response = request("GET", "/metrics")
    text = response.read().decode()
    conn.close()
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", text, re.M))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log = tmp_path_factory.mktemp("serve") / "server.log"
    env = {**os.environ, **ENV, "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    env.pop("VLLM_CPU_KVCACHE_SPACE")
    command = [
        str(DUOCAL),
        "serve",
        NAME,
        "--engine",
        "vllm",
        "--kv-memory",
        "1GiB",
        "--port",
        str(PORT),
        "--",
        *SETTINGS,
    ]
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and process.poll() is None:
        try:
            conn, response = request("GET", "/health", timeout=5)
            conn.close()
            if response.status == 200:
                break
        except OSError:
            time.sleep(3)
    assert process.poll() is None, log.read_text()[-4000:]
    yield process, log
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)


def test_a_chat_completion_is_served_under_the_given_name(server):
    conn, response = request("POST", "/v1/chat/completions", {
        "model": NAME, "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 12, "temperature": 0,
    })  # fmt: skip
    answer = json.loads(response.read())
    conn.close()
    assert response.status == 200, answer
    assert answer["model"] == NAME
    assert "Paris" in answer["choices"][0]["message"]["content"]
    conn, response = request("GET", "/v1/models")
    assert [m["id"] for m in json.loads(response.read())["data"]] == [NAME]


def test_the_start_up_lines_count_the_per_head_layout_against_stock_vllm(server, model_folder):
    text = server[1].read_text()
    vllm_tokens = kv_cache_tokens(text)
    concurrency = float(re.search(r"Maximum concurrency for 2,048 tokens per request: ([\d.]+)x", text).group(1))
    assert abs(vllm_tokens - concurrency * 2048) < 2048 * 0.01
    found = re.search(r"duocal: KV cache size ([\d,]+) tokens = ([\d.]+)x the ([\d,]+) tokens stock vLLM holds in the "
                      r"same 1 GiB \(max_model_len 2048, max_num_batched_tokens 512\); plan: 45 full \+ 45 sink_window",
                      text)  # fmt: skip
    assert found, text[-4000:]
    duo, ratio, stock = int(found[1].replace(",", "")), float(found[2]), int(found[3].replace(",", ""))
    assert duo == vllm_tokens
    tokens, stock_log = run_vllm(model_folder, [[1, 2, 3]], max_tokens=1, max_num_batched_tokens=512)
    assert tokens is not None, stock_log[-3000:]
    assert stock == kv_cache_tokens(stock_log)
    assert ratio == pytest.approx(duo / stock, abs=0.005) and ratio > 1.2


def test_a_request_cancelled_mid_stream_frees_its_blocks(server):
    conn, response = request("POST", "/v1/completions", {
        "model": NAME, "prompt": "Count from one to one thousand: one, two, three," * 20, "max_tokens": 1500,
        "temperature": 0, "ignore_eos": True, "stream": True,
    })  # fmt: skip
    assert response.status == 200
    chunks = [response.readline() for _ in range(16)]
    assert sum(line.startswith(b"data: {") for line in chunks) >= 4, chunks
    held = metric("vllm:kv_cache_usage_perc")
    assert metric("vllm:num_requests_running") == 1 and held > 0
    conn.close()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (metric("vllm:num_requests_running") or metric("vllm:kv_cache_usage_perc")):
        time.sleep(1)
    assert metric("vllm:num_requests_running") == 0
    assert metric("vllm:kv_cache_usage_perc") == 0


def test_ctrl_c_stops_the_server_cleanly(server):
    process, log = server
    os.killpg(process.pid, signal.SIGINT)
    assert process.wait(timeout=120) == 0, log.read_text()[-3000:]

"""`duocal serve MODEL --engine vllm`: vLLM's own OpenAI server with the plugin and the shipped profile at 0.5
(a mixed plan: 45 full + 45 sink_window KV heads), prefix caching on.

One server for the whole module (a start takes minutes here): a chat completion over HTTP under the name the
user gave; duocal's runtime tokens for the reference prompts (fp32); a repeated prompt reuses no cached prefix
and one log line says why; the start-up lines (vLLM's KV size, duocal's ratio to stock vLLM in the same space,
checked against the session's stock engine with the same settings); a request cancelled mid-stream gives all its
blocks back; and Ctrl-C stops the server with exit code 0 (last)."""

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

from helpers.vllm_engines import ENV, MAX_NUM_BATCHED_TOKENS, kv_cache_tokens

PORT = 8763
NAME = "smollm2-135m-instruct"
SETTINGS = [
    "--max-model-len",
    "2048",
    "--dtype",
    "float32",
    "--max-num-batched-tokens",
    str(MAX_NUM_BATCHED_TOKENS),
    "--enforce-eager",
    "--enable-prefix-caching",
]  # fmt: skip (duocal adds --enable-prompt-tokens-details)
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
    try:
        assert healthy_within(process, 600), log.read_text()[-4000:]
        yield process, log
    finally:  # also when the start failed or timed out: nothing outlives the module
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)


def healthy_within(process: subprocess.Popen, seconds: float) -> bool:
    """Whether the server answers /health with 200 before `seconds` pass (False if it exits first)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and process.poll() is None:
        try:
            conn, response = request("GET", "/health", timeout=5)
            conn.close()
            if response.status == 200:
                return True
        except OSError:
            time.sleep(3)
    return False


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


def complete(prompt_ids: list[int]) -> tuple[list[int], int]:
    """Greedy tokens for a token-id prompt, and the prompt tokens read from the prefix cache."""
    conn, response = request("POST", "/v1/completions", {
        "model": NAME, "prompt": prompt_ids, "max_tokens": 16, "temperature": 0, "return_token_ids": True,
    })  # fmt: skip
    answer = json.loads(response.read())
    conn.close()
    assert response.status == 200, answer
    return answer["choices"][0]["token_ids"], answer["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_the_shipped_profile_at_half_sparsity_gives_duocal_runtime_tokens(server, reference):
    for case in reference["cases"]:
        tokens, cached = complete(case["prompt_ids"])
        assert tokens == case["duo"]
        assert cached == 0


def test_with_streaming_heads_a_repeated_prompt_reuses_its_cached_prefix_with_the_same_tokens(server, reference):
    """The long prompt again (993 tokens, blocks of 64, sink 64 + recent 512): 960 tokens from the cache, the
    blocks between the sink and the window never read; vLLM's counters count them."""
    long_case = reference["cases"][2]
    hits, queries = metric("vllm:prefix_cache_hits_total"), metric("vllm:prefix_cache_queries_total")
    assert complete(long_case["prompt_ids"]) == (long_case["duo"], 960)
    assert metric("vllm:prefix_cache_hits_total") - hits == 960
    assert metric("vllm:prefix_cache_queries_total") - queries == len(long_case["prompt_ids"])


def test_the_start_up_lines_count_the_per_head_layout_against_stock_vllm(server, offline):
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
    assert stock == kv_cache_tokens(offline["stock"].log)
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

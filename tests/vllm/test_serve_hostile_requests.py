"""Hostile requests to a running `duocal serve MODEL --engine vllm` (the shipped profile at 0.5: sink 64 + window
512, blocks of 64, max_model_len 1152, prefix caching on): each bad request is a 4xx with an OpenAI-shaped error
body, and the server keeps answering everyone else with the right tokens; prompts at the edges of the sink, the
window and max_model_len; streams cancelled while others run; short requests between long ones; questions about
one document at once (prefix-cache hits) while streams of it are dropped; seeded sampling. At the end no
request runs, vLLM's KV cache usage is back to zero, and the server's log holds no traceback.

One server for the module (a start costs most of this file's time)."""

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from helpers.vllm_engines import ENV

PORT = 8764
NAME = "smollm2-135m-instruct"
MAX_MODEL_LEN = 1152
SETTINGS = ["--max-model-len", str(MAX_MODEL_LEN), "--dtype", "float32", "--max-num-batched-tokens", "512",
            "--enforce-eager", "--enable-prefix-caching", "--max-num-seqs", "8"]  # fmt: skip
DUOCAL = Path(sys.executable).parent / "duocal"
VOCAB = 49152


def send(method: str, path: str, body: bytes | None = None, headers=None, timeout=120) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {"content-type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def post(path: str, body, timeout=120) -> tuple[int, dict]:
    status, raw = send("POST", path, json.dumps(body).encode(), timeout=timeout)
    return status, json.loads(raw)


def metric(name: str) -> float:
    text = send("GET", "/metrics")[1].decode()
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", text, re.M))


def healthy_within(process: subprocess.Popen, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if send("GET", "/health", timeout=5)[0] == 200:
                return True
        except OSError:
            time.sleep(2)
    return False


@pytest.fixture(scope="module")
def hostile_server(tmp_path_factory):
    """(process, log path) of one `duocal serve --engine vllm` for the module; killed at its end."""
    log = tmp_path_factory.mktemp("hostile") / "server.log"
    env = {**os.environ, **ENV, "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    env.pop("VLLM_CPU_KVCACHE_SPACE")
    command = [str(DUOCAL), "serve", NAME, "--engine", "vllm", "--kv-memory", "1GiB", "--port", str(PORT), "--",
               *SETTINGS]  # fmt: skip
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        assert healthy_within(process, 900), log.read_text()[-4000:]  # a loaded machine starts it slowly
        yield process, log
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)


def completion(prompt, max_tokens=16, **more) -> dict:
    """The one choice of a greedy completion (its "token_ids", "finish_reason", ...)."""
    status, answer = post("/v1/completions", {"model": NAME, "prompt": prompt, "max_tokens": max_tokens,
                                              "temperature": 0, "return_token_ids": True, **more})  # fmt: skip
    assert status == 200, answer
    return answer["choices"][0]


def complete(prompt, max_tokens=16, **more) -> list[int]:
    return completion(prompt, max_tokens, **more)["token_ids"]


def text_ids(reference, n: int) -> list[int]:
    """The first `n` token ids of real text (the reference's long prompts, repeated as needed)."""
    text = reference["cases"][3]["prompt_ids"] + reference["cases"][2]["prompt_ids"]
    return (text * (n // len(text) + 1))[:n]


def is_openai_error(status: int, raw: bytes, expected: int | None = None) -> bool:
    try:
        body = json.loads(raw)
    except ValueError:
        return False
    error = body.get("error") if isinstance(body, dict) else None
    ok = isinstance(error, dict) and isinstance(error.get("message"), str) and error["message"]
    return bool(ok) and 400 <= status < 500 and (expected is None or status == expected)


def body(**fields) -> bytes:
    return json.dumps({"model": NAME, "prompt": [1, 2, 3], "max_tokens": 4, **fields}).encode()


def chat(**fields) -> bytes:
    return json.dumps({"model": NAME, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
                       **fields}).encode()  # fmt: skip


BAD_REQUESTS = {  # name -> (method, path, body, content type)
    "body not JSON": ("POST", "/v1/completions", b'{"model": ', None),
    "body a JSON list": ("POST", "/v1/completions", b"[1, 2]", None),
    "a model of another name": ("POST", "/v1/completions", body(model="gpt-4"), None),
    "no prompt": ("POST", "/v1/completions", json.dumps({"model": NAME}).encode(), None),
    "an empty prompt": ("POST", "/v1/completions", body(prompt=""), None),
    "an empty token list": ("POST", "/v1/completions", body(prompt=[]), None),
    "a token id of the vocabulary's size": ("POST", "/v1/completions", body(prompt=[1, VOCAB]), None),
    "a negative token id": ("POST", "/v1/completions", body(prompt=[1, -1]), None),
    "a token id that is a float": ("POST", "/v1/completions", body(prompt=[1, 2.5]), None),
    "max_tokens negative": ("POST", "/v1/completions", body(max_tokens=-1), None),
    "max_tokens a string": ("POST", "/v1/completions", body(max_tokens="many"), None),
    "max_tokens 0": ("POST", "/v1/completions", body(max_tokens=0), None),
    "top_k -5": ("POST", "/v1/completions", body(top_k=-5), None),
    "presence_penalty 5": ("POST", "/v1/completions", body(presence_penalty=5), None),
    "repetition_penalty 0": ("POST", "/v1/completions", body(repetition_penalty=0), None),
    "min_tokens above max_tokens": ("POST", "/v1/completions", body(min_tokens=9), None),
    "temperature negative": ("POST", "/v1/completions", body(temperature=-1), None),
    "top_p above 1": ("POST", "/v1/completions", body(top_p=2), None),
    "n 0": ("POST", "/v1/completions", body(n=0), None),
    "logprobs 1000": ("POST", "/v1/completions", body(logprobs=1000), None),
    "stop a number": ("POST", "/v1/completions", body(stop=5), None),
    "seed a string": ("POST", "/v1/completions", body(seed="x"), None),
    "logit_bias outside the vocabulary": ("POST", "/v1/completions", body(logit_bias={str(VOCAB + 5): 5}), None),
    "messages missing": ("POST", "/v1/chat/completions", json.dumps({"model": NAME}).encode(), None),
    "messages a string": ("POST", "/v1/chat/completions", chat(messages="Hi"), None),
    "stream_options without stream": ("POST", "/v1/chat/completions", chat(stream_options={"x": 1}), None),
    "a JSON schema that is not one": (
        "POST", "/v1/chat/completions", chat(response_format={"type": "json_schema", "json_schema": 5}), None),
}  # fmt: skip


# answered by vLLM's web framework before its OpenAI layer with {"detail": ...}: duocal's middleware
# (vllm_plugin/openai_errors.py) gives them OpenAI's {"error": {...}} shape too
FRAMEWORK_REQUESTS = {
    "an unknown path": ("POST", "/v1/nothing", body(), None),
    "GET on completions": ("GET", "/v1/completions", None, None),
    "body nested 100000 deep": ("POST", "/v1/completions", b"[" * 100000 + b"]" * 100000, None),
    "body not UTF-8": ("POST", "/v1/completions", b'{"model": "\xff\xfe"}', None),
}  # fmt: skip


def test_a_bad_request_is_an_openai_error_and_the_server_answers_the_next(hostile_server, reference):
    short = reference["cases"][0]
    failures = []
    for name, (method, path, raw, content_type) in BAD_REQUESTS.items():
        status, answer = send(method, path, raw, {"content-type": content_type or "application/json"})
        if not is_openai_error(status, answer):
            failures.append(f"{name}: {status} {answer[:300]!r}")
        if complete(short["prompt_ids"], max_tokens=1) != short["duo"][:1]:
            failures.append(f"after {name}: wrong tokens")
    assert not failures, "\n".join(failures)
    assert complete(short["prompt_ids"]) == short["duo"]


@pytest.mark.parametrize("name", FRAMEWORK_REQUESTS)
def test_a_request_the_web_framework_refuses_is_an_openai_error_too(hostile_server, name):
    method, path, raw, content_type = FRAMEWORK_REQUESTS[name]
    status, answer = send(method, path, raw, {"content-type": content_type or "application/json"})
    assert is_openai_error(status, answer), f"{status} {answer[:300]!r}"


@pytest.mark.parametrize("over", [0, 1])
def test_a_prompt_at_or_past_max_model_len_is_a_400(hostile_server, reference, over):
    status, raw = send("POST", "/v1/completions", body(prompt=text_ids(reference, MAX_MODEL_LEN + over)))
    assert is_openai_error(status, raw, 400), raw[:300]


def test_a_request_ending_exactly_at_max_model_len_is_served_and_one_past_it_is_cut_there(hostile_server, reference):
    """vLLM lowers a `max_tokens` that would run past max_model_len to the room left (finish_reason "length")."""
    prompt = text_ids(reference, MAX_MODEL_LEN - 4)
    exact = completion(prompt, max_tokens=4, ignore_eos=True)
    assert len(exact["token_ids"]) == 4 and exact["finish_reason"] == "length"
    assert completion(prompt, max_tokens=5, ignore_eos=True) == exact


@pytest.mark.parametrize("length", [1, 63, 64, 65, 575, 576, 577, MAX_MODEL_LEN - 12])
def test_a_prompt_ending_at_the_edges_of_the_sink_and_the_recent_tokens_continues_as_its_own_prefix(
    hostile_server, reference, length
):
    """Greedy tokens t1..t8 after a prompt P; then P + t1..t4 gives t5..t8: the cache the decode steps wrote
    across the sink's and the window's edges holds what a prefill of the same tokens holds."""
    prompt = text_ids(reference, length)
    tokens = complete(prompt, max_tokens=8, ignore_eos=True)
    assert len(tokens) == 8
    assert complete(prompt + tokens[:4], max_tokens=4, ignore_eos=True) == tokens[4:]


def test_several_prompts_in_one_request_and_several_samples_each_get_their_own_answer(hostile_server, reference):
    short, medium = reference["cases"][0], reference["cases"][1]
    prompts = [short["prompt_ids"], medium["prompt_ids"]]
    status, answer = post("/v1/completions", {"model": NAME, "prompt": prompts, "max_tokens": 16, "temperature": 0,
                                              "return_token_ids": True})  # fmt: skip
    assert status == 200, answer
    by_index = sorted(answer["choices"], key=lambda choice: choice["index"])
    assert [choice["token_ids"] for choice in by_index] == [short["duo"], medium["duo"]]
    status, answer = post("/v1/completions", {"model": NAME, "prompt": short["prompt_ids"], "max_tokens": 8, "n": 3,
                                              "temperature": 1.0, "ignore_eos": True})  # fmt: skip
    assert status == 200, answer
    assert len(answer["choices"]) == 3 and answer["usage"]["completion_tokens"] == 24


def test_seeded_sampling_that_would_stop_vllm_cpus_engine_is_a_400_and_the_server_goes_on(hostile_server, reference):
    """n: 3, temperature 0.8, seed 1 on a ~600-token prompt: its prefill is split into chunks, and vLLM-CPU cannot
    rewind a seeded CPU generator (`CPU Generator does not use offset`): the engine would stop for everyone."""
    seeded = {"model": NAME, "prompt": text_ids(reference, 600), "max_tokens": 8, "n": 3, "temperature": 0.8,
              "seed": 1}  # fmt: skip
    status, answer = post("/v1/completions", seeded)
    assert status == 400 and answer["error"]["param"] == "seed", answer
    chat = {"model": NAME, "messages": [{"role": "user", "content": "Hi"}], "temperature": 0.8, "seed": 1}
    assert post("/v1/chat/completions", chat)[0] == 400
    status, answer = post("/v1/completions", {**seeded, "temperature": 0, "n": 1})  # greedy: no generator
    assert status == 200 and answer["usage"]["completion_tokens"] == 8, answer
    status, answer = post("/v1/completions", {**seeded, "seed": None})  # the same sampling, unseeded
    assert status == 200 and len(answer["choices"]) == 3, answer
    assert send("GET", "/health")[0] == 200


def stream_and_drop(prompt, chunks: int) -> int:
    """Opens a streamed completion, reads `chunks` lines of it, and hangs up: the data lines read."""
    conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=120)
    conn.request("POST", "/v1/completions", body=json.dumps({
        "model": NAME, "prompt": prompt, "max_tokens": 400, "temperature": 0, "ignore_eos": True, "stream": True,
    }), headers={"content-type": "application/json"})  # fmt: skip
    response = conn.getresponse()
    assert response.status == 200
    lines = [response.readline() for _ in range(chunks)]
    conn.close()
    return sum(line.startswith(b"data: {") for line in lines)


def test_short_requests_between_long_ones_and_cancelled_streams_get_their_own_tokens(hostile_server, reference):
    short, medium, long = reference["cases"][0], reference["cases"][1], reference["cases"][2]
    with ThreadPoolExecutor(16) as pool:
        dropped = [pool.submit(stream_and_drop, text_ids(reference, 300 + 100 * i), 6 + 2 * i) for i in range(4)]
        longs = [pool.submit(complete, long["prompt_ids"]) for _ in range(3)]
        shorts = [pool.submit(complete, case["prompt_ids"]) for case in (short, medium) * 6]
        assert all(future.result() >= 2 for future in dropped)
        assert [future.result() for future in longs] == [long["duo"]] * 3
        assert [future.result() for future in shorts] == [short["duo"], medium["duo"]] * 6


def with_cached(prompt, **more) -> tuple[list[int], int]:
    """Greedy tokens of a completion, and its prompt tokens read from the prefix cache."""
    status, answer = post("/v1/completions", {"model": NAME, "prompt": prompt, "max_tokens": 12, "temperature": 0,
                                              "return_token_ids": True, **more})  # fmt: skip
    assert status == 200, answer
    return answer["choices"][0]["token_ids"], answer["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_requests_sharing_a_document_while_others_are_cancelled_get_the_tokens_computed_in_full(
    hostile_server, reference
):
    """8 questions about one 700-token document at once, 4 streams of it dropped beside them: each answer is the
    one its prompt gets computed in full (a cache salt of its own: no hit); a later question reads the document."""
    document = text_ids(reference, 700)
    questions = [document + [1000 + 37 * i + j for j in range(40)] for i in range(9)]
    with ThreadPoolExecutor(12) as pool:
        dropped = [pool.submit(stream_and_drop, [*document, 2000 + i], 8) for i in range(4)]
        shared = [pool.submit(with_cached, prompt) for prompt in questions[:8]]
        assert all(future.result() >= 2 for future in dropped)
        answers = [future.result() for future in shared]
    for i, (tokens, _) in enumerate(answers):
        assert tokens == with_cached(questions[i], cache_salt=f"alone-{i}")[0], i
    tokens, cached = with_cached(questions[8])
    assert cached >= 640 and tokens == with_cached(questions[8], cache_salt="alone-8")[0]


def test_afterwards_every_block_is_free_and_the_log_holds_no_traceback(hostile_server):
    process, log = hostile_server
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (metric("vllm:num_requests_running") or metric("vllm:kv_cache_usage_perc")):
        time.sleep(1)
    assert metric("vllm:num_requests_running") == 0 and metric("vllm:num_requests_waiting") == 0
    assert metric("vllm:kv_cache_usage_perc") == 0
    assert process.poll() is None
    assert "Traceback" not in log.read_text(), log.read_text()[-4000:]


def test_the_probe_sends_at_least_forty_hostile_requests():
    assert len(BAD_REQUESTS) + len(FRAMEWORK_REQUESTS) + 2 + 2 + 8 + 2 + 1 + 3 >= 40

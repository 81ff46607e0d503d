"""OpenAI-shaped errors for what vLLM's web framework answers before its OpenAI layer runs.

An unknown path, a method a route does not take, a body that is not UTF-8 or JSON nested too deep
are answered by FastAPI/Starlette as a 4xx whose JSON body is `{"detail": ...}`; OpenAI clients
read `{"error": {"message", "type", "param", "code"}}`, as vLLM's own errors are. `duocal serve
--engine vllm` adds this ASGI middleware (`--middleware duocal_vllm.openai_errors.OpenAIErrorBodies`):
it rewrites such a body into OpenAI's shape, status and headers kept, and leaves every other
response, streamed ones included, untouched. Plain ASGI, so it imports nothing of vLLM.
"""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any

MIDDLEWARE = "duocal_vllm.openai_errors.OpenAIErrorBodies"


def openai_error_body(status: int, body: bytes) -> bytes | None:
    """OpenAI's error body for a framework's `{"detail": ...}` 4xx body; None for any other body."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not (isinstance(data, dict) and set(data) == {"detail"}):
        return None
    detail = data["detail"]
    message = detail if isinstance(detail, str) else json.dumps(detail)
    try:
        kind = HTTPStatus(status).phrase.replace(" ", "") + "Error"  # 404: NotFoundError, as OpenAI names them
    except ValueError:
        kind = "Error"
    error = {"message": message, "type": kind, "param": None, "code": status}
    return json.dumps({"error": error}).encode()


class OpenAIErrorBodies:
    """ASGI middleware: 4xx JSON `{"detail": ...}` bodies become OpenAI error bodies."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        held: dict[str, Any] = {}
        chunks: list[bytes] = []

        async def rewriting_send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start" and is_json_client_error(message):
                held["start"] = message  # wait for the body
                return
            if "start" not in held:
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body"):
                return
            await send_rewritten(send, held["start"], b"".join(chunks))

        await self.app(scope, receive, rewriting_send)


def is_json_client_error(start: dict[str, Any]) -> bool:
    headers = dict(start.get("headers") or [])
    return 400 <= start["status"] < 500 and headers.get(b"content-type", b"").startswith(b"application/json")


async def send_rewritten(send, start: dict[str, Any], body: bytes) -> None:
    rewritten = openai_error_body(start["status"], body)
    if rewritten is not None:
        headers = [(k, v) for k, v in start.get("headers") or [] if k.lower() != b"content-length"]
        start = {**start, "headers": [*headers, (b"content-length", str(len(rewritten)).encode())]}
        body = rewritten
    await send(start)
    await send({"type": "http.response.body", "body": body, "more_body": False})

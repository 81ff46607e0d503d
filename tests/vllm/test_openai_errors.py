"""duocal's ASGI middleware (vllm_plugin/openai_errors.py): a framework's {"detail"} 4xx body in OpenAI's shape, every
other response as it was (the served path: test_serve_hostile_requests.py)."""

import asyncio
import json

import pytest

from duocal_vllm.openai_errors import OpenAIErrorBodies, openai_error_body


def served(status: int, body: bytes, content_type: bytes = b"application/json", parts: int = 1):
    """(start, body) that the middleware sends for an app answering `status` and `body` in `parts` chunks."""

    async def app(scope, receive, send):
        headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        step = max(1, len(body) // parts)
        pieces = [body[i : i + step] for i in range(0, len(body), step)] or [b""]
        for i, piece in enumerate(pieces):
            await send({"type": "http.response.body", "body": piece, "more_body": i < len(pieces) - 1})

    sent = []

    async def send(message):
        sent.append(message)

    asyncio.run(OpenAIErrorBodies(app)({"type": "http"}, None, send))
    return sent[0], b"".join(m.get("body", b"") for m in sent[1:])


@pytest.mark.parametrize("parts", [1, 3])
def test_a_detail_body_becomes_an_openai_error_with_its_status_and_length(parts):
    start, body = served(404, b'{"detail":"Not Found"}', parts=parts)
    assert start["status"] == 404
    assert json.loads(body) == {"error": {"message": "Not Found", "type": "NotFoundError", "param": None, "code": 404}}
    assert dict(start["headers"])[b"content-length"] == str(len(body)).encode()


def test_a_structured_detail_is_kept_as_its_json_text():
    detail = [{"loc": ["body"], "msg": "bad"}]
    error = json.loads(openai_error_body(422, json.dumps({"detail": detail}).encode()))["error"]
    assert json.loads(error["message"]) == detail and error["code"] == 422


@pytest.mark.parametrize(
    ("status", "body", "content_type"),
    [
        (400, b'{"error": {"message": "x"}}', b"application/json"),  # vLLM's own error: already OpenAI's
        (404, b'{"detail": "x", "more": 1}', b"application/json"),  # not the framework's body alone
        (200, b'{"detail": "x"}', b"application/json"),  # not an error
        (404, b"Not Found", b"text/plain"),  # not JSON
    ],
)
def test_any_other_response_passes_unchanged(status, body, content_type):
    start, sent = served(status, body, content_type)
    assert start["status"] == status and sent == body

"""transformers' chat-completions and completions answers made into what OpenAI sends: a stream ends in
`data: [DONE]`; `usage` is streamed only when `stream_options.include_usage` asks, as one last chunk with
no choices; an error after the 200 headers is a last `data: {"error": {...}}` event then `data: [DONE]`
(transformers sends a bare `{"error": "..."}`, or drops the connection); `echo` puts the prompt first.
Non-streamed answers keep their `usage`."""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import dataclass

from .api_errors import error_body
from .stop_strings import cut_at_stop, stop_list

logger = logging.getLogger("duocal.serving")

DONE = "data: [DONE]\n\n"
SHAPED_PATHS = ("/v1/chat/completions", "/v1/completions")


@dataclass(frozen=True)
class AnswerShape:
    """What the request asked of its answer's form."""

    include_usage: bool = False
    echo: str | None = None  # completions with echo: the prompt, sent before the generated text
    stops: tuple[str, ...] = ()

    @classmethod
    def of(cls, path: str, body: dict) -> AnswerShape:
        options = body.get("stream_options") or {}
        echo = body["prompt"] if path == "/v1/completions" and body.get("echo") is True else None
        stops = tuple(stop_list(body.get("stop")))
        return cls(include_usage=options.get("include_usage") is True, echo=echo, stops=stops)


def event(payload: dict) -> str:
    return f"data: {json.dumps(payload)}\n\n"


def error_event(message: str) -> str:
    return event(error_body(500, message[:500], code="generation_failed")) + DONE


def payloads(piece: str) -> list[str]:
    """The `data:` payloads in a piece of transformers' stream (one or more `data: ...\\n\\n` events)."""
    return [part.strip().removeprefix("data:").strip() for part in piece.split("\n\n") if part.strip()]


def handler_error(payload: str) -> str | None:
    """The message of transformers' error event, or None for a chunk. It writes the message into JSON
    unescaped, so a message with a quote is not JSON: it is read without the parser then."""
    if not payload.startswith('{"error"'):
        return None
    try:
        error = json.loads(payload)["error"]
    except (ValueError, KeyError, TypeError):
        return payload.removeprefix('{"error": "').removesuffix('"}')
    return error if isinstance(error, str) else json.dumps(error)


class StreamShaper:
    """Turns the chunks of one stream into OpenAI's, in order."""

    def __init__(self, shape: AnswerShape):
        self.shape, self.echo_due = shape, shape.echo is not None

    def chunks(self, chunk: dict) -> list[dict]:
        usage, out = chunk.pop("usage", None), [chunk]
        if self.echo_due and chunk.get("choices"):
            self.echo_due = False
            out.insert(0, {**chunk, "choices": [{"text": self.shape.echo, "index": 0, "finish_reason": None}]})
        if usage is not None and self.shape.include_usage:
            out.append({**chunk, "choices": [], "usage": usage})
        return out


async def openai_events(events, shape: AnswerShape, on_error):
    """`events` (transformers' stream) as OpenAI's; `on_error()` runs when the stream fails (it cancels
    the generation, which would otherwise run on with nobody to read it)."""
    shaper = StreamShaper(shape)
    async with contextlib.aclosing(events):
        try:
            async for piece in events:
                out = []
                for payload in payloads(piece):
                    message = handler_error(payload)
                    if message is not None:
                        on_error()
                        yield "".join(out) + error_event(f"generation failed mid-stream: {message}")
                        return
                    out.extend(event(chunk) for chunk in shaper.chunks(json.loads(payload)))
                if out:
                    yield "".join(out)
        except Exception as err:  # after the 200 headers an error can only be an event
            logger.error("duocal serve: a stream failed", exc_info=err)
            on_error()
            yield error_event(f"generation failed mid-stream ({type(err).__name__}: {err})")
            return
    yield DONE


def shape_answer(path: str, body: dict, response, on_error):
    """The handler's `response` to `body` as OpenAI sends it (`on_error`: see `openai_events`)."""
    from fastapi.responses import JSONResponse, StreamingResponse

    if path not in SHAPED_PATHS:
        return response
    shape = AnswerShape.of(path, body)
    if isinstance(response, StreamingResponse):
        response.body_iterator = openai_events(response.body_iterator, shape, on_error)
        return response
    if (shape.echo is None and not shape.stops) or not isinstance(response, JSONResponse):
        return response
    answer = json.loads(response.body)
    for choice in answer.get("choices", []):
        shape_choice(choice, shape)
    return JSONResponse(answer, status_code=response.status_code)


def shape_choice(choice: dict, shape: AnswerShape) -> None:
    """Cut at the stop strings again (a model whose tokenizer parses its answers re-reads all the tokens it
    made, the one that ended a stop string among them), then put the echoed prompt first."""
    message = choice.get("message")
    if shape.stops and isinstance(message, dict) and isinstance(message.get("content"), str):
        message["content"] = cut_at_stop(message["content"], list(shape.stops))
    if "text" in choice:
        text = cut_at_stop(choice["text"], list(shape.stops)) if shape.stops else choice["text"]
        choice["text"] = (shape.echo or "") + text

"""One generation request through `duocal serve`: an id no other request in flight has, and the handler
raced against the client going away (then its generation is cancelled and its pages come back)."""

from __future__ import annotations

import asyncio
import uuid

from .api_errors import error_response

MAX_CLIENT_ID = 64


def request_id_for(request) -> str:
    """The client's X-Request-ID (its first 64 characters) with a unique suffix, or a fresh uuid: two
    requests with one header share the engine's row tables otherwise (an IndexError, both hang)."""
    given = request.headers.get("x-request-id", "").strip()[:MAX_CLIENT_ID]
    return f"{given}-{uuid.uuid4().hex[:12]}" if given else str(uuid.uuid4())


async def wait_for_disconnect(request) -> None:
    """Returns when the client has gone (call it once the body has been read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def run_while_connected(request, work, on_gone):
    """The response `work` (a coroutine) makes, unless the client goes away first: then `work` is
    cancelled, `on_gone()` runs (it cancels the generation) and the answer goes nowhere (499)."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(wait_for_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:  # also when this route itself is cancelled (the server stopping)
        watch.cancel()
        if not task.done():
            task.cancel()
            on_gone()
    if task not in done:
        return error_response(499, "the client closed the request", code="client_closed_request")
    return task.result()

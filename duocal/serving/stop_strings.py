"""OpenAI's `stop`: the answer ends before the first stop string, its finish_reason is "stop", and the
generation is cancelled there (its pages come back at once, not after max_tokens).

transformers' handlers put `stop` into the request's `GenerationConfig.stop_strings`, but its
continuous-batching manager takes only `max_new_tokens` and `eos_token_id` per request: without this
module `stop` is dropped with a 200. Version-specific (transformers 5.24): `CBGenerateManager`'s
`generate_streaming` / `generate_non_streaming` and `CBStreamer._queue` (where decoded text goes).
"""

from __future__ import annotations


def stop_list(stop) -> list[str]:
    """`stop` as a request or a GenerationConfig gives it (None, a string or a list) as a list."""
    if stop is None:
        return []
    return [stop] if isinstance(stop, str) else list(stop)


class StopText:
    """A text fed piece by piece, let through up to the first of `stops`: `feed` returns what can be sent
    now (it holds back an end that may be the start of a stop string), `flush` what it held at the end."""

    def __init__(self, stops: list[str]):
        if not stops or not all(stops):
            raise ValueError(f"stop strings must be non-empty strings, got {stops!r}")
        self.stops, self.held, self.stopped = stops, "", False

    def feed(self, piece: str) -> str:
        if self.stopped:
            return ""
        text, self.held = self.held + piece, ""
        found = [i for i in (text.find(stop) for stop in self.stops) if i >= 0]
        if found:
            self.stopped = True
            return text[: min(found)]
        keep = self.partial_stop_length(text)
        self.held = text[len(text) - keep :]
        return text[: len(text) - keep]

    def partial_stop_length(self, text: str) -> int:
        """The length of the longest end of `text` that a stop string starts with (but is not)."""
        longest = min(len(text), max(len(stop) for stop in self.stops) - 1)
        for size in range(longest, 0, -1):
            if any(stop.startswith(text[-size:]) for stop in self.stops):
                return size
        return 0

    def flush(self) -> str:
        held, self.held = self.held, ""
        return "" if self.stopped else held


def cut_at_stop(text: str, stops: list[str]) -> str:
    """`text` up to the first of `stops` (all of it if none occurs)."""
    cut = StopText(stops)
    return cut.feed(text) + cut.flush()


class StoppingQueue:
    """Stands between a `CBStreamer` and its asyncio queue: text goes through `StopText`; at a stop string it
    calls `on_stop()` (which cancels the generation) and ends the stream (None), as a finished one ends."""

    def __init__(self, queue, stops: list[str], on_stop):
        self.queue, self.text, self.on_stop = queue, StopText(stops), on_stop

    def put_nowait(self, item) -> None:
        if self.text.stopped:
            return  # an output already on its way when the generation was cancelled
        if item is None:
            self.put_text(self.text.flush())
            self.queue.put_nowait(None)
        elif type(item) is str:  # plain text; reasoning text and tool calls (str subclasses, objects) pass
            self.put_text(self.text.feed(item))
            if self.text.stopped:
                self.on_stop()
                self.queue.put_nowait(None)
        else:
            self.queue.put_nowait(item)

    def put_text(self, text: str) -> None:
        if text:
            self.queue.put_nowait(text)


def honour_stop_strings(batching, manager) -> None:
    """Make `batching` (transformers' `CBGenerateManager`) end answers at their stop strings, streamed or
    not; `manager` is the continuous-batching manager whose `cancel_request` frees a stopped request."""
    from transformers.cli.serving.utils import _StreamError

    streaming, non_streaming = batching.generate_streaming, batching.generate_non_streaming

    def generate_streaming(model, processor, inputs, gen_config, request_id, response_parser=None):
        queue, streamer = streaming(
            model, processor, inputs, gen_config, request_id=request_id, response_parser=response_parser
        )
        stops = stop_list(gen_config.stop_strings)
        if stops:  # nothing was delivered yet: outputs reach the streamer on this event loop, after this returns
            streamer._queue = StoppingQueue(queue, stops, lambda: stopped(gen_config, request_id))
        return queue, streamer

    def stopped(gen_config, request_id) -> None:
        manager.cancel_request(request_id)
        # The handlers call an answer "length" when it has max_new_tokens tokens, also when its last one ended
        # a stop string; this request's config (a copy) is read for nothing else once the request is queued.
        gen_config.max_new_tokens = None

    async def generate_non_streaming(model, processor, inputs, gen_config, request_id):
        """With stop strings, the streaming path collected: it sees the text as it comes, so it can stop."""
        if not stop_list(gen_config.stop_strings):
            return await non_streaming(model, processor, inputs, gen_config, request_id=request_id)
        queue, streamer = generate_streaming(model, processor, inputs, gen_config, request_id)
        tokens = record_tokens(streamer)
        parts = []
        while (item := await queue.get()) is not None:
            if isinstance(item, _StreamError):
                raise RuntimeError(f"generation failed for {request_id}: {item.msg}")
            parts.append(item)
        return "".join(parts), len(inputs["input_ids"]), tokens[: streamer.total_tokens]

    batching.generate_streaming = generate_streaming
    batching.generate_non_streaming = generate_non_streaming


def record_tokens(streamer) -> list[int]:
    """The token ids `streamer` is given, as a list that grows with them."""
    tokens: list[int] = []
    put = streamer.put

    def put_and_record(output):
        tokens[:] = output.generated_tokens
        put(output)

    streamer.put = put_and_record
    return tokens

"""`duocal serve` answers as OpenAI's API does (issue 36), against a real server on 127.0.0.1: streams end
in `data: [DONE]` and carry `usage` only when asked, `stop` and `echo` are honoured, every field it cannot
honour is a 400 naming it, the model id is the one given, errors after the headers are error events.
Sampling per request: test_serve_sampling.py."""

import http.client
import json

import openai
import pytest
from openai.types.chat.completion_create_params import CompletionCreateParamsBase as ChatParams
from openai.types.completion_create_params import CompletionCreateParamsBase as CompletionParams
from openai.types.responses.response_create_params import ResponseCreateParamsBase as ResponseParams

from duocal.serving.served_fields import HONOURED, NO_EFFECT, SERVED

from helpers.serving import pool_is_whole

NAME = "duocal/demo-model"
PROMPT = "the passkey is"


def client(base):
    return openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=120)


def exchange(base, method, path, body=None) -> tuple[int, str, str]:
    """(status, content type, body text) of one request over a fresh connection."""
    host, port = base.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=120)
    try:
        payload = None if body is None else json.dumps(body)
        connection.request(method, path, payload, {"content-type": "application/json"})
        response = connection.getresponse()
        return response.status, response.getheader("content-type", ""), response.read().decode()
    finally:
        connection.close()


def post_json(base, path, body) -> tuple[int, dict]:
    status, _, text = exchange(base, "POST", path, body)
    return status, json.loads(text)


def stream_events(base, path, body) -> list:
    """The `data:` payloads of a stream, in order: dicts, and the final "[DONE]" as a string."""
    status, kind, text = exchange(base, "POST", path, {**body, "stream": True})
    assert status == 200 and kind.startswith("text/event-stream"), text
    events = [line.removeprefix("data: ") for line in text.split("\n\n") if line.strip()]
    return [event if event == "[DONE]" else json.loads(event) for event in events]


def assert_openai_error(status, body, want_status, param, code=None):
    assert status == want_status, body
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["param"] == param and body["error"]["code"] == code, body


def valid_body(path: str) -> dict:
    if path == "/v1/completions":
        return {"model": NAME, "prompt": PROMPT, "max_tokens": 3}
    if path == "/v1/responses":
        return {"model": NAME, "input": "hi", "max_output_tokens": 3}
    return {"model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


def plain_text(base, max_tokens=24) -> str:
    status, answer = post_json(base, "/v1/completions", {"model": NAME, "prompt": PROMPT, "max_tokens": max_tokens})
    assert status == 200, answer
    return answer["choices"][0]["text"]


def test_a_completion_stream_ends_in_done_with_usage_only_when_asked(demo_server):
    served, _, base = demo_server
    body = {"model": NAME, "prompt": PROMPT, "max_tokens": 5}
    events = stream_events(base, "/v1/completions", body)
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    assert all("usage" not in e for e in events[:-1]) and events[-2]["choices"][0]["finish_reason"] == "length"
    events = stream_events(base, "/v1/completions", {**body, "stream_options": {"include_usage": True}})
    assert events[-1] == "[DONE]"
    usage_chunk = events[-2]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 5
    assert all("usage" not in e for e in events[:-2])
    chunks = list(client(base).completions.create(**body, stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].usage.completion_tokens == 5 and chunks[-1].choices == []
    assert client(base).completions.create(**body).usage.completion_tokens == 5  # not streamed: usage kept
    assert pool_is_whole(served)


def test_stop_ends_the_text_before_the_stop_string_streamed_or_not(demo_server):
    served, _, base = demo_server
    full = plain_text(base)
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    want = full[: full.find(stop)]
    body = {"model": NAME, "prompt": PROMPT, "max_tokens": 24, "stop": ["never-in-the-text", stop]}
    status, answer = post_json(base, "/v1/completions", body)
    assert status == 200, answer
    assert answer["choices"][0]["text"] == want and answer["choices"][0]["finish_reason"] == "stop"
    assert answer["usage"]["completion_tokens"] < 24  # the generation was cut there, not run to max_tokens
    events = stream_events(base, "/v1/completions", {**body, "stop": stop})
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == want
    assert events[-2]["choices"][0]["finish_reason"] == "stop" and events[-1] == "[DONE]"
    assert pool_is_whole(served)


def test_a_stop_string_ended_by_the_last_allowed_token_is_a_stop(demo_server):
    _, _, base = demo_server
    full = plain_text(base, max_tokens=8)
    stop = full.rstrip()[-2:]
    body = {"model": NAME, "prompt": PROMPT, "max_tokens": 8, "stop": stop}
    status, answer = post_json(base, "/v1/completions", body)
    assert status == 200 and answer["choices"][0]["finish_reason"] == "stop", answer
    assert answer["choices"][0]["text"] == full[: full.find(stop)]
    events = stream_events(base, "/v1/completions", body)
    assert events[-2]["choices"][0]["finish_reason"] == "stop"


def test_echo_puts_the_prompt_first(demo_server):
    _, _, base = demo_server
    body = {"model": NAME, "prompt": PROMPT, "max_tokens": 6, "echo": True}
    status, answer = post_json(base, "/v1/completions", body)
    assert status == 200 and answer["choices"][0]["text"] == PROMPT + plain_text(base, 6), answer
    events = stream_events(base, "/v1/completions", body)
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == answer["choices"][0]["text"]


REFUSED = [
    ("/v1/completions", "n", 2),
    ("/v1/completions", "best_of", 3),
    ("/v1/completions", "logprobs", 2),
    ("/v1/completions", "suffix", " and so on"),
    ("/v1/completions", "stream_options", {"include_usage": True}),  # without stream
    ("/v1/chat/completions", "n", 3),
    ("/v1/chat/completions", "logprobs", True),
    ("/v1/chat/completions", "top_logprobs", 2),
    ("/v1/chat/completions", "response_format", {"type": "json_object"}),
    ("/v1/chat/completions", "tool_choice", "required"),
    ("/v1/chat/completions", "parallel_tool_calls", False),
    ("/v1/chat/completions", "store", True),
    ("/v1/chat/completions", "modalities", ["text", "audio"]),
    ("/v1/chat/completions", "audio", {"voice": "alloy", "format": "wav"}),
    ("/v1/chat/completions", "functions", [{"name": "f"}]),
    ("/v1/chat/completions", "reasoning_effort", "high"),
    ("/v1/responses", "text", {"format": {"type": "json_object"}}),
    ("/v1/responses", "previous_response_id", "resp_1"),
    ("/v1/responses", "truncation", "auto"),
    ("/v1/responses", "include", ["message.output_text.logprobs"]),
    ("/v1/responses", "background", True),
    ("/v1/responses", "reasoning", {"effort": "high"}),
]


@pytest.mark.parametrize("path, field, value", REFUSED)
def test_a_field_the_server_cannot_honour_is_a_400_naming_it(demo_server, path, field, value):
    served, _, base = demo_server
    status, answer = post_json(base, path, {**valid_body(path), field: value})
    assert_openai_error(status, answer, 400, field)
    assert field in answer["error"]["message"]
    assert pool_is_whole(served)


@pytest.mark.parametrize("stop", ["", ["a", ""]])
def test_an_empty_stop_string_is_a_400(demo_server, stop):
    _, _, base = demo_server
    status, answer = post_json(base, "/v1/completions", {**valid_body("/v1/completions"), "stop": stop})
    assert_openai_error(status, answer, 400, "stop")
    assert "non-empty string" in answer["error"]["message"]


@pytest.mark.parametrize("kind", ["image_url", "input_audio", "file"])
def test_a_non_text_content_part_is_a_400_naming_messages(demo_server, kind):
    _, _, base = demo_server
    parts = [{"type": "text", "text": "what is this?"}, {"type": kind, kind: {"url": "data:,x"}}]
    status, answer = post_json(base, "/v1/chat/completions", {"messages": [{"role": "user", "content": parts}]})
    assert_openai_error(status, answer, 400, "messages")
    assert f"'{kind}' part" in answer["error"]["message"]


def test_values_that_change_nothing_here_are_accepted(demo_server):
    _, _, base = demo_server
    same = {"temperature": 0, "top_p": 0.3, "seed": 7, "n": 1, "best_of": 1, "user": "u1", "frequency_penalty": 0}
    status, answer = post_json(base, "/v1/completions", {"model": NAME, "prompt": PROMPT, "max_tokens": 24, **same})
    assert status == 200, answer
    assert answer["choices"][0]["text"] == plain_text(base)  # greedy either way


@pytest.mark.parametrize(
    "path, params",
    [("/v1/chat/completions", ChatParams), ("/v1/completions", CompletionParams), ("/v1/responses", ResponseParams)],
    ids=["chat", "text", "responses"],
)
def test_every_openai_request_field_is_honoured_accepted_or_checked(path, params):
    covered = set(HONOURED[path]) | set(NO_EFFECT) | set(SERVED[path])
    assert set(params.__annotations__) - covered == set()


def test_the_model_id_is_the_one_given_everywhere(demo_server):
    _, _, base = demo_server
    status, _, text = exchange(base, "GET", "/v1/models")
    assert status == 200 and [m["id"] for m in json.loads(text)["data"]] == [NAME]
    assert client(base).models.retrieve(NAME).id == NAME
    status, _, text = exchange(base, "GET", "/v1/models/someone/else")
    assert_openai_error(status, json.loads(text), 404, "model", "model_not_found")
    assert client(base).completions.create(model=NAME, prompt=PROMPT, max_tokens=2).model == NAME
    events = stream_events(base, "/v1/completions", {"model": NAME, "prompt": PROMPT, "max_tokens": 2})
    assert {e["model"] for e in events[:-1]} == {NAME}
    for path in ("/v1/completions", "/v1/chat/completions", "/v1/responses"):
        status, answer = post_json(base, path, {**valid_body(path), "model": "gpt-4o"})
        assert_openai_error(status, answer, 404, "model", "model_not_found")
    with pytest.raises(openai.NotFoundError) as refused:
        client(base).completions.create(model="gpt-4o", prompt=PROMPT, max_tokens=2)
    assert refused.value.code == "model_not_found" and refused.value.param == "model"


def failing_after(calls: int):
    """A `CBStreamer.put` that fails on its `calls`-th call (a bug met mid-stream)."""
    from transformers.cli.serving.utils import CBStreamer

    put, seen = CBStreamer.put, []

    def put_then_fail(self, output):
        seen.append(output)
        if len(seen) == calls:
            raise RuntimeError('a "bug" mid-stream')
        put(self, output)

    return put_then_fail


def test_an_error_after_the_headers_is_an_error_event_then_done(demo_server, monkeypatch):
    from transformers.cli.serving.utils import CBStreamer

    served, _, base = demo_server
    monkeypatch.setattr(CBStreamer, "put", failing_after(3))
    events = stream_events(base, "/v1/completions", {"model": NAME, "prompt": PROMPT, "max_tokens": 300})
    monkeypatch.undo()
    assert events[-1] == "[DONE]" and set(events[-2]) == {"error"}, events[-3:]
    assert set(events[-2]["error"]) == {"message", "type", "param", "code"}
    assert 'a "bug" mid-stream' in events[-2]["error"]["message"]
    assert all("choices" in e for e in events[:-2])
    assert pool_is_whole(served, seconds=5)  # cancelled, not left generating 300 tokens


def test_an_exception_inside_the_stream_is_an_error_event_then_done(demo_server, monkeypatch):
    from transformers.cli.serving.completion import CompletionHandler

    served, _, base = demo_server
    build = CompletionHandler._build_chunk_sse

    def fail_at_the_end(self, *args, finish_reason=None, **kwargs):
        if finish_reason is not None:
            raise ValueError("the last chunk failed")
        return build(self, *args, finish_reason=finish_reason, **kwargs)

    monkeypatch.setattr(CompletionHandler, "_build_chunk_sse", fail_at_the_end)
    events = stream_events(base, "/v1/completions", {"model": NAME, "prompt": PROMPT, "max_tokens": 4})
    monkeypatch.undo()
    assert events[-1] == "[DONE]" and "the last chunk failed" in events[-2]["error"]["message"]
    assert pool_is_whole(served)
    assert client(base).completions.create(model=NAME, prompt=PROMPT, max_tokens=2).usage.completion_tokens == 2


CHAT = "smollm2-135m-instruct"
HELLO = [{"role": "user", "content": "Name three colours."}]


@pytest.mark.slow
def test_a_chat_stream_ends_in_done_with_usage_only_when_asked_and_the_model_as_given(smollm2_server):
    served, _, base = smollm2_server
    body = {"model": CHAT, "messages": HELLO, "max_tokens": 6}
    events = stream_events(base, "/v1/chat/completions", body)
    assert events[-1] == "[DONE]" and all("usage" not in e for e in events[:-1])
    assert {e["model"] for e in events[:-1]} == {CHAT}
    events = stream_events(base, "/v1/chat/completions", {**body, "stream_options": {"include_usage": True}})
    assert events[-2]["choices"] == [] and events[-2]["usage"]["completion_tokens"] == 6
    answer = client(base).chat.completions.create(**body)
    assert answer.model == CHAT and answer.usage.completion_tokens == 6
    assert pool_is_whole(served)


@pytest.mark.slow
def test_stop_ends_a_chat_answer_streamed_or_not(smollm2_server):
    served, _, base = smollm2_server
    body = {"model": CHAT, "messages": HELLO, "max_tokens": 20}
    full = client(base).chat.completions.create(**body).choices[0].message.content
    stop = full[len(full) // 2 : len(full) // 2 + 2]
    want = full[: full.find(stop)]
    answer = client(base).chat.completions.create(**body, stop=stop)
    assert answer.choices[0].message.content == want and answer.choices[0].finish_reason == "stop"
    chunks = list(client(base).chat.completions.create(**body, stop=[stop], stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert pool_is_whole(served)


@pytest.mark.slow
def test_stop_holds_for_a_model_whose_tokenizer_parses_its_answers(smollm2_server, monkeypatch):
    """Such a model's answer is read again from all its tokens (the one that ended the stop string too)."""
    from transformers.cli.serving import chat_completion

    _, _, base = smollm2_server
    body = {"model": CHAT, "messages": HELLO, "max_tokens": 20}
    full = client(base).chat.completions.create(**body).choices[0].message.content
    stop = full[len(full) // 2 : len(full) // 2 + 2]

    def parse_all_tokens(processor, model, generated_ids, **kwargs):
        return processor.decode(generated_ids, skip_special_tokens=True), None, None

    monkeypatch.setattr(chat_completion, "parse_assistant_message", parse_all_tokens)
    answer = client(base).chat.completions.create(**body, stop=stop)
    assert answer.choices[0].message.content == full[: full.find(stop)]


@pytest.mark.slow
def test_a_responses_request_without_stream_answers_json(smollm2_server):
    _, _, base = smollm2_server
    status, kind, text = exchange(base, "POST", "/v1/responses", {"model": CHAT, "input": "Hi", "max_output_tokens": 4})
    assert status == 200 and kind.startswith("application/json"), text
    assert json.loads(text)["model"] == CHAT
    answer = client(base).responses.create(model=CHAT, input="Hi", max_output_tokens=4)
    assert answer.output_text and answer.usage.output_tokens == 4


@pytest.mark.parametrize(
    "pieces, stops, sent",
    [
        (["hello wor", "ld. bye"], ["world"], "hello "),  # a stop string split over two pieces
        (["ab", "c", "abX"], ["abX", "cab"], "ab"),  # the earliest stop wins, not the first listed
        (["a b", " c"], ["b c"], "a "),
        (["no stop", " here"], ["zz"], "no stop here"),  # held back "" while it could start "zz", then flushed
        (["ends with z"], ["zz"], "ends with z"),  # a partial stop at the end is text after all
        (["x<", "/s", ">y", "more"], ["</s>"], "x"),
    ],
)
def test_stop_text_sends_everything_before_the_first_stop_string(pieces, stops, sent):
    from duocal.serving.stop_strings import StopText, cut_at_stop

    cut = StopText(stops)
    out = "".join(cut.feed(piece) for piece in pieces) + cut.flush()
    assert out == sent == cut_at_stop("".join(pieces), stops)
    assert cut.stopped == (sent != "".join(pieces))


def test_stop_text_never_sends_what_may_be_the_start_of_a_stop_string():
    from duocal.serving.stop_strings import StopText

    cut = StopText(["STOP"])
    assert cut.feed("go ST") == "go " and cut.feed("O") == "" and cut.feed("Pped") == ""
    assert cut.stopped and cut.flush() == ""
    with pytest.raises(ValueError, match="non-empty"):
        StopText([""])

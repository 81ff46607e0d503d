"""What `duocal serve` does with every field of OpenAI's chat-completions, completions and responses bodies:
honoured, accepted because it changes nothing here, or refused with a 400 naming it. A field is never
dropped with a 200: a value the server cannot honour is refused, whatever the field.

request_checks.py checks the types first; this module checks that a well-typed value is one the server
serves. transformers' continuous batching decodes every request with the model's one generation config
(sampling settings, penalties and logits processors are per server, not per request), so sampling fields
are served only when they ask for what the server does anyway.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

from .api_errors import ApiError


@dataclass(frozen=True)
class Decoding:
    """How the server decodes every request: greedy, or sampling at one temperature and top_p."""

    sample: bool
    temperature: float = 1.0
    top_p: float = 1.0

    @classmethod
    def of(cls, generation_config) -> Decoding:
        if not getattr(generation_config, "do_sample", False):
            return cls(sample=False)
        return cls(True, generation_config.temperature or 1.0, generation_config.top_p or 1.0)

    def describe(self) -> str:
        if not self.sample:
            return "this server decodes greedily (its model's generation config)"
        return f"this server samples at temperature {self.temperature}, top_p {self.top_p} (its model's config)"


@dataclass(frozen=True)
class Served:
    """The values of one field the server serves (`ok(value, body, decoding)`), and what to send instead."""

    ok: Callable[[Any, dict, Decoding], bool]
    want: str | Callable[[Decoding], str]

    def instead(self, decoding: Decoding) -> str:
        return self.want(decoding) if callable(self.want) else self.want


def same(value, served) -> bool:
    """Equal, and not a boolean standing for a number (True == 1 in Python, not in JSON)."""
    return value == served and isinstance(value, bool) == isinstance(served, bool)


def only(*values, want: str) -> Served:
    return Served(lambda value, _body, _decoding: any(same(value, v) for v in values), want)


REFUSED = "left out (this server does not support it)"


def refused(why: str) -> Served:
    return Served(lambda value, _body, _decoding: any(same(value, v) for v in (False, {}, [])), f"{REFUSED}: {why}")


def temperature_served(value, _body, decoding: Decoding) -> bool:
    return same(value, decoding.temperature if decoding.sample else 0)


def top_p_served(value, body, decoding: Decoding) -> bool:
    greedy_asked = not decoding.sample and same(body.get("temperature"), 0)  # no top_p at temperature 0
    return greedy_asked or same(value, decoding.top_p if decoding.sample else 1)


def want_temperature(decoding: Decoding) -> str:
    return f"{decoding.temperature if decoding.sample else 0} or left out: {decoding.describe()}"


def want_top_p(decoding: Decoding) -> str:
    return f"{decoding.top_p if decoding.sample else 1} or left out: {decoding.describe()}"


SAMPLING = {
    "temperature": Served(temperature_served, want_temperature),
    "top_p": Served(top_p_served, want_top_p),
    "seed": Served(
        lambda _value, _body, decoding: not decoding.sample,
        lambda decoding: f"left out: {decoding.describe()} and one seed cannot be kept per request in a batch",
    ),
    "frequency_penalty": only(0, want="0 or left out: penalties are not applied per request in continuous batching"),
    "presence_penalty": only(0, want="0 or left out: penalties are not applied per request in continuous batching"),
    "logit_bias": only({}, want="left out: logits processors are not applied per request in continuous batching"),
    "n": only(1, want="1: one choice per request (send n requests for n answers)"),
    "stream_options": Served(
        lambda value, body, _decoding: (
            body.get("stream") is True
            and isinstance(value, dict)
            and set(value) <= {"include_usage", "include_obfuscation"}
            and all(isinstance(flag, bool) for flag in value.values())
        ),
        "sent only with stream: true, as {'include_usage': true|false}",
    ),
}

CHAT_ONLY = {
    "logprobs": only(False, want="false or left out: log probabilities are not returned"),
    "top_logprobs": refused("log probabilities are not returned"),
    "response_format": Served(
        lambda value, _body, _decoding: value == {"type": "text"},
        "{'type': 'text'} or left out: JSON modes and schemas are not enforced",
    ),
    "tool_choice": only("auto", want="'auto' or left out: the model decides whether to call a tool"),
    "parallel_tool_calls": only(True, want="true or left out: the number of tool calls is not limited"),
    "modalities": only(["text"], want="['text'] or left out: this server answers in text"),
    "store": only(False, want="false or left out: nothing is stored"),
    "audio": refused("this server answers in text"),
    "function_call": refused("send tools instead"),
    "functions": refused("send tools instead"),
    "prediction": refused("predicted outputs are not used"),
    "reasoning_effort": refused("reasoning effort is not adjustable"),
    "verbosity": refused("verbosity is not adjustable"),
    "web_search_options": refused("there is no web search"),
    "moderation": refused("there is no moderation"),
}

COMPLETION_ONLY = {
    "logprobs": refused("log probabilities are not returned"),
    "best_of": only(1, want="1 or left out: one candidate per request"),
    "suffix": refused("text is not inserted between a prompt and a suffix"),
}

RESPONSES_ONLY = {
    **{field: SAMPLING[field] for field in ("temperature", "top_p", "seed", "stream_options")},
    "text": Served(
        lambda value, _body, _decoding: value in ({}, {"format": {"type": "text"}}),
        "{'format': {'type': 'text'}} or left out: JSON modes and schemas are not enforced",
    ),
    "tool_choice": CHAT_ONLY["tool_choice"],
    "parallel_tool_calls": CHAT_ONLY["parallel_tool_calls"],
    "store": CHAT_ONLY["store"],
    "background": only(False, want="false or left out: answers are not run in the background"),
    "truncation": only("disabled", want="'disabled' or left out: inputs are not truncated"),
    "include": refused("no extra output is returned"),
    "top_logprobs": refused("log probabilities are not returned"),
    "max_tool_calls": refused("the number of tool calls is not limited"),
    "previous_response_id": refused("nothing is stored: send the whole conversation as input"),
    "conversation": refused("nothing is stored: send the whole conversation as input"),
    "prompt": refused("there are no stored prompts"),
    "reasoning": refused("reasoning is not adjustable"),
    "background_options": refused("answers are not run in the background"),
    "context_management": refused("the context is not managed"),
    "access_programs": refused("there are no access programs"),
    "image": refused("this server answers in text"),
    "moderation": refused("there is no moderation"),
}

SERVED = {
    "/v1/chat/completions": {**SAMPLING, **CHAT_ONLY},
    "/v1/completions": {**SAMPLING, **COMPLETION_ONLY},
    "/v1/responses": RESPONSES_ONLY,
}

# Fields taken as they are, for the docs and the test that every OpenAI field is covered.
HONOURED = {
    "/v1/chat/completions": {
        "messages": "the conversation, through the model's chat template; text parts only",
        "model": "must be the served id (else 404 model_not_found)",
        "stream": "server-sent events ending in data: [DONE]",
        "max_tokens": "new tokens at most",
        "max_completion_tokens": "new tokens at most (over max_tokens)",
        "stop": "the answer ends before the first stop string, finish_reason 'stop', also streamed",
        "tools": "given to the chat template; calls parsed where the model's tokenizer defines how",
        "chat_template_kwargs": "extra chat template arguments (an extension)",
    },
    "/v1/completions": {
        "prompt": "a non-empty string",
        "model": "must be the served id (else 404 model_not_found)",
        "stream": "server-sent events ending in data: [DONE]",
        "max_tokens": "new tokens at most",
        "stop": "the text ends before the first stop string, finish_reason 'stop', also streamed",
        "echo": "the prompt comes first in the text",
    },
    "/v1/responses": {
        "input": "a string, or messages and text parts, through the model's chat template",
        "instructions": "a system message first",
        "model": "must be the served id (else 404 model_not_found)",
        "stream": "events when true; JSON when false or left out",
        "max_output_tokens": "new tokens at most",
        "tools": "given to the chat template; calls parsed where the model's tokenizer defines how",
    },
}
NO_EFFECT = {
    "user": "an end-user id; nothing is logged per user",
    "safety_identifier": "an end-user id; nothing is logged per user",
    "metadata": "nothing is stored",
    "service_tier": "one tier",
    "prompt_cache_key": "no prompt cache; answers are the same",
    "prompt_cache_retention": "no prompt cache; answers are the same",
    "prompt_cache_options": "no prompt cache; answers are the same",
}


def check_served(path: str, body: dict, decoding: Decoding) -> None:
    """400 naming the field for a value of `body` this server would not honour."""
    for field, served in SERVED.get(path, {}).items():
        value = body.get(field)
        if value is not None and not served.ok(value, body, decoding):
            raise ApiError(
                400, f"{field} must be {served.instead(decoding)}; got {json.dumps(value)[:60]}", param=field
            )

"""What `duocal serve` does with every field of OpenAI's chat-completions, completions and responses bodies:
honoured, accepted because it changes nothing here, or refused with a 400 naming it. A field is never
dropped with a 200: a value the server cannot honour is refused, whatever the field.

request_checks.py checks the types first; this module checks that a well-typed value is one the server
serves. The sampling fields (temperature, top_p, seed, penalties, logit_bias and vLLM's extensions) are honoured
per request: sampling_settings.py reads them, batch_sampling.py applies them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .api_errors import ApiError
from .sampling_settings import EXTENSION_FIELDS


@dataclass(frozen=True)
class Served:
    """The values of one field the server serves (`ok(value, body)`), and what to send instead."""

    ok: Callable[[Any, dict], bool]
    want: str


def same(value, served) -> bool:
    """Equal, and not a boolean standing for a number (True == 1 in Python, not in JSON)."""
    return value == served and isinstance(value, bool) == isinstance(served, bool)


def only(*values, want: str) -> Served:
    return Served(lambda value, _body: any(same(value, v) for v in values), want)


REFUSED = "left out (this server does not support it)"
# transformers' continuous batching can record the chosen token's log probability (one flag for the server, no
# alternatives) and its handlers put none in an answer: nothing per request to honour top_logprobs with.
NO_LOGPROBS = "log probabilities are not returned (transformers' handlers answer without them)"


def refused(why: str) -> Served:
    return Served(lambda value, _body: any(same(value, v) for v in (False, {}, [])), f"{REFUSED}: {why}")


COMMON = {
    "n": only(1, want="1: one choice per request (send n requests for n answers)"),
    "stream_options": Served(
        lambda value, body: (
            body.get("stream") is True
            and isinstance(value, dict)
            and set(value) <= {"include_usage", "include_obfuscation"}
            and all(isinstance(flag, bool) for flag in value.values())
        ),
        "sent only with stream: true, as {'include_usage': true|false}",
    ),
}

CHAT_ONLY = {
    "logprobs": only(False, want=f"false or left out: {NO_LOGPROBS}"),
    "top_logprobs": refused(NO_LOGPROBS),
    "response_format": Served(
        lambda value, _body: value == {"type": "text"},
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
    "logprobs": refused(NO_LOGPROBS),
    "best_of": only(1, want="1 or left out: one candidate per request"),
    "suffix": refused("text is not inserted between a prompt and a suffix"),
}

RESPONSES_ONLY = {
    "stream_options": COMMON["stream_options"],
    "text": Served(
        lambda value, _body: value in ({}, {"format": {"type": "text"}}),
        "{'format': {'type': 'text'}} or left out: JSON modes and schemas are not enforced",
    ),
    "tool_choice": CHAT_ONLY["tool_choice"],
    "parallel_tool_calls": CHAT_ONLY["parallel_tool_calls"],
    "store": CHAT_ONLY["store"],
    "background": only(False, want="false or left out: answers are not run in the background"),
    "truncation": only("disabled", want="'disabled' or left out: inputs are not truncated"),
    "include": refused("no extra output is returned"),
    "top_logprobs": refused(NO_LOGPROBS),
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
    "/v1/chat/completions": {**COMMON, **CHAT_ONLY},
    "/v1/completions": {**COMMON, **COMPLETION_ONLY},
    "/v1/responses": RESPONSES_ONLY,
}

# Fields taken as they are, for the docs and the test that every OpenAI field is covered.
SAMPLING_HONOURED = {
    "temperature": "per request, 0-2; 0 is greedy",
    "top_p": "per request, above 0 and at most 1",
    "seed": "per request: the same seed gives the same tokens, whatever else is in the batch",
    "presence_penalty": "per request, -2 to 2, on the tokens generated so far",
    "frequency_penalty": "per request, -2 to 2, on the tokens generated so far",
    "logit_bias": "per request: token ids of the vocabulary to -100 to 100",
    "top_k": "per request, 0 or -1: off (an extension, as vLLM's)",
    "repetition_penalty": "per request, above 0 and at most 2, on prompt and answer (an extension, as vLLM's)",
    "min_tokens": "per request: no end-of-sequence token before this many (an extension, as vLLM's)",
}
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
        **SAMPLING_HONOURED,
    },
    "/v1/completions": {
        "prompt": "a non-empty string",
        "model": "must be the served id (else 404 model_not_found)",
        "stream": "server-sent events ending in data: [DONE]",
        "max_tokens": "new tokens at most",
        "stop": "the text ends before the first stop string, finish_reason 'stop', also streamed",
        "echo": "the prompt comes first in the text",
        **SAMPLING_HONOURED,
    },
    "/v1/responses": {
        "input": "a string, or messages and text parts, through the model's chat template",
        "instructions": "a system message first",
        "model": "must be the served id (else 404 model_not_found)",
        "stream": "events when true; JSON when false or left out",
        "max_output_tokens": "new tokens at most",
        "tools": "given to the chat template; calls parsed where the model's tokenizer defines how",
        **{field: SAMPLING_HONOURED[field] for field in ("temperature", "top_p", "seed", *EXTENSION_FIELDS)},
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


def check_served(path: str, body: dict) -> None:
    """400 naming the field for a value of `body` this server would not honour."""
    for field, served in SERVED.get(path, {}).items():
        value = body.get(field)
        if value is not None and not served.ok(value, body):
            raise ApiError(400, f"{field} must be {served.want}; got {json.dumps(value)[:60]}", param=field)

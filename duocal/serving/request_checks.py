"""What a generation request's body must be before a handler reads it: at most `max_bytes` (413), JSON
nested at most `MAX_DEPTH` deep, an object whose fields have the types transformers' handlers assume
(400 naming the field otherwise, instead of the handler's 500 or a worker that dies)."""

from __future__ import annotations

import json
import math

from duocal_runtime.planning.sizes import bytes_with_count

from .api_errors import ApiError

DEFAULT_MAX_REQUEST_BYTES = 4 * 1024 * 1024
DRAIN_BYTES = 64 * 1024 * 1024
MAX_DEPTH = 32
MAX_TOKEN_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
# Keys the handlers pass to apply_chat_template themselves: a body may not pass them again.
TEXT_PARTS = ("text", "input_text", "output_text")
TEMPLATE_OWN_KEYS = {"conversation", "add_generation_prompt", "tools", "return_tensors", "return_dict", "tokenize"}


async def read_body(request, max_bytes: int) -> bytes:
    """The body, or a 413 if it is over `max_bytes`. A body up to `DRAIN_BYTES` is read to its end and
    dropped (so the client is there to read the 413: an unread body resets the connection); a larger
    declared one is refused at once."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max(max_bytes, DRAIN_BYTES):
        raise too_large(max_bytes)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max(max_bytes, DRAIN_BYTES):
            break
        if size <= max_bytes:
            chunks.append(chunk)
    if size > max_bytes:
        raise too_large(max_bytes)
    return b"".join(chunks)


def too_large(max_bytes: int) -> ApiError:
    return ApiError(
        413,
        f"the request body is over {bytes_with_count(max_bytes)} (the server's --max-request-size)",
        code="request_too_large",
    )


def parse_body(raw: bytes) -> dict:
    """The JSON object in `raw`; 400 if it is not JSON, not an object or nested over `MAX_DEPTH`."""
    try:
        body = json.loads(raw or b"null")
    except RecursionError:
        raise ApiError(400, f"the request body is nested more than {MAX_DEPTH} deep") from None
    except (ValueError, UnicodeDecodeError) as err:
        raise ApiError(400, f"the request body is not valid JSON: {err}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    if depth(body) > MAX_DEPTH:
        raise ApiError(400, f"the request body is nested more than {MAX_DEPTH} deep")
    return body


def without_nulls(body: dict) -> dict:
    """`body` without its null fields: null means "not given" (OpenAI's API), but some handlers read a
    present null as a value (`/v1/responses` echoes `parallel_tool_calls: null` into a model that refuses it)."""
    return {key: value for key, value in body.items() if value is not None}


def depth(value) -> int:
    """How deep lists and objects nest in `value` (a scalar: 0), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is not None:
            deepest = max(deepest, level)
            stack.extend((child, level + 1) for child in children)
    return deepest


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    return (is_int(value) or isinstance(value, float)) and math.isfinite(value)


def is_str_list(value) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def in_range(low: float, high: float):
    return lambda value: is_number(value) and low <= value <= high


def above_and_at_most(low: float, high: float):
    return lambda value: is_number(value) and low < value <= high


def is_token_id(key: str) -> bool:
    return key.isascii() and key.isdigit()


# field -> (is it good, what it must be); None is always allowed (the handlers treat it as absent).
COMMON_FIELDS = {
    "model": (lambda v: isinstance(v, str), "a string"),
    "stream": (lambda v: isinstance(v, bool), "true or false"),
    "temperature": (in_range(0, 2), "a number from 0 to 2"),
    "top_p": (above_and_at_most(0, 1), "a number above 0 and at most 1"),
    "top_k": (lambda v: is_int(v) and v >= -1, "an integer: a number of tokens, or 0 or -1 for all"),
    "repetition_penalty": (above_and_at_most(0, 2), "a number above 0 and at most 2"),
    "min_tokens": (lambda v: is_int(v) and v >= 0, "a non-negative integer"),
    "frequency_penalty": (in_range(-2, 2), "a number from -2 to 2"),
    "presence_penalty": (in_range(-2, 2), "a number from -2 to 2"),
    "seed": (lambda v: is_int(v) and -(2**63) <= v < 2**64, "an integer from -2**63 to 2**64 - 1"),
    "n": (lambda v: is_int(v) and v >= 1, "a positive integer"),
    "best_of": (lambda v: is_int(v) and v >= 1, "a positive integer"),
    "echo": (lambda v: isinstance(v, bool), "true or false"),
    "stop": (
        lambda v: (isinstance(v, str) and v != "") or (is_str_list(v) and "" not in v),
        "a non-empty string or a list of them",
    ),
    "suffix": (lambda v: isinstance(v, str), "a string"),
    "instructions": (lambda v: isinstance(v, str), "a string"),
    "user": (lambda v: isinstance(v, str), "a string"),
    "tools": (lambda v: isinstance(v, list) and all(isinstance(t, dict) for t in v), "a list of objects"),
    "parallel_tool_calls": (lambda v: isinstance(v, bool), "true or false"),
    "logit_bias": (
        lambda v: isinstance(v, dict) and all(is_token_id(k) and in_range(-100, 100)(b) for k, b in v.items()),
        "an object of token ids to numbers from -100 to 100",
    ),
    "chat_template_kwargs": (
        lambda v: isinstance(v, dict) and not TEMPLATE_OWN_KEYS & set(v),
        f"an object without {sorted(TEMPLATE_OWN_KEYS)}",
    ),
    **{field: (lambda v: is_int(v) and v >= 1, "a positive integer") for field in MAX_TOKEN_FIELDS},
}


def check_fields(body: dict) -> None:
    for field, (good, want) in COMMON_FIELDS.items():
        value = body.get(field)
        if value is not None and not good(value):
            raise ApiError(400, f"{field} must be {want}, got {json.dumps(value)[:40]}", param=field)
    if body.get("generation_config") is not None:
        raise ApiError(
            400,
            "generation_config is not accepted: send the sampling fields (temperature, top_p, top_k, seed, ...) "
            "and max_tokens",
            param="generation_config",
        )


def check_prompt(body: dict) -> None:
    prompt = body.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        got = "missing" if prompt is None else f"got {json.dumps(prompt)[:40]}"
        raise ApiError(400, f"prompt must be a non-empty string ({got})", param="prompt")


def content_problem(content) -> str | None:
    """Why a message's content is not text the handlers can join (None if it is)."""
    if content is None or isinstance(content, str):
        return None
    if not isinstance(content, list):
        return "must be a string or a list of content parts"
    for part in content:
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            return "parts must be objects with a string type"
        if part["type"] not in TEXT_PARTS:  # transformers drops them for a text-only model, answering without them
            return f"has a {part['type'][:30]!r} part: this server reads text parts only ({', '.join(TEXT_PARTS)})"
        if not isinstance(part.get("text"), str):
            return "text parts need a string text"
    return None


def is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except (ValueError, RecursionError):
        return False


def arguments_problem(arguments) -> str | None:
    """Why a tool call's arguments are not what chat templates read (an object, or JSON text of one)."""
    if isinstance(arguments, dict) or (isinstance(arguments, str) and is_json_object(arguments)):
        return None
    return "arguments must be an object or the JSON text of one"


def tool_calls_problem(calls) -> str | None:
    """Why a message's tool_calls are not `[{"function": {"name": str, "arguments": ...}}]` (None: they are,
    or there are none); a call may also carry name and arguments itself, as transformers reads them."""
    if not calls:
        return None
    if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
        return "must be a list of objects"
    for call in calls:
        function = call.get("function") or call
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            return "need a function with a string name"
        problem = arguments_problem(function.get("arguments"))
        if problem:
            return problem
    return None


# `/v1/responses` input items without a role: type -> the fields transformers reads and what they must be.
INPUT_ITEMS = {
    "function_call": {"call_id": str, "name": str},
    "function_call_output": {"call_id": str, "output": str},
    "reasoning": {},
}


def item_problem(item: dict) -> str | None:
    """Why an input item without a role is not one transformers can read (None: it can)."""
    kind = item.get("type")
    if kind not in INPUT_ITEMS:
        return f"type must be one of {sorted(INPUT_ITEMS)} (or give the item a role)"
    for name, want in INPUT_ITEMS[kind].items():
        if not isinstance(item.get(name), want):
            return f"({kind}) needs a string {name}"
    if kind == "function_call":
        return arguments_problem(item.get("arguments"))
    parts = item.get("content") or []
    if kind == "reasoning" and not (
        isinstance(parts, list) and all(isinstance(p, dict) and isinstance(p.get("text"), str) for p in parts)
    ):
        return "(reasoning) content must be a list of objects with a string text"
    return None


def check_messages(messages, field: str) -> None:
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, f"{field} must be a non-empty list of messages", param=field)
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ApiError(400, f"{field}[{i}] must be an object", param=field)
        if "role" not in message and field == "input":
            problem = item_problem(message)
            if problem:
                raise ApiError(400, f"input[{i}] {problem}", param=field)
            continue
        if not isinstance(message.get("role"), str):
            raise ApiError(400, f"{field}[{i}].role must be a string", param=field)
        problem = content_problem(message.get("content"))
        if problem:
            raise ApiError(400, f"{field}[{i}].content {problem}", param=field)
        problem = tool_calls_problem(message.get("tool_calls"))
        if problem:
            raise ApiError(400, f"{field}[{i}].tool_calls {problem}", param=field)
        if not isinstance(message.get("tool_call_id", ""), str):
            raise ApiError(400, f"{field}[{i}].tool_call_id must be a string", param=field)


def check_input(body: dict) -> None:
    """`/v1/responses`: a non-empty string, a list of content parts (one user message: transformers reads a
    list whose first item has no role so), or a list of messages and items."""
    value = body.get("input")
    if isinstance(value, str) and value:
        return
    if isinstance(value, list) and value and isinstance(value[0], dict) and "role" not in value[0]:
        problem = content_problem(value)
        if problem:
            raise ApiError(400, f"input {problem}", param="input")
        return
    check_messages(value, "input")


BODY_CHECKS = {
    "/v1/completions": check_prompt,
    "/v1/chat/completions": lambda body: check_messages(body.get("messages"), "messages"),
    "/v1/responses": check_input,
}


def check_body(path: str, body: dict) -> None:
    """400 (naming the field) for a body transformers' handler for `path` would fail on."""
    check_fields(body)
    BODY_CHECKS[path](body)

"""The OpenAPI description of `duocal serve`'s generation routes (served at `/openapi.json`): each body's
fields as request_checks.py checks them, the other fields transformers' handler for the route accepts (untyped:
the server does not read them; docs/guides/serve.md says what it does with each field), the sampling extensions it
reads itself (sampling_settings.EXTENSION_FIELDS), no field beyond those (400), and every error in OpenAI's shape.
tests/duocal/serving/test_serve_fuzz.py fuzzes the server from it with schemathesis, and checks that it types exactly
the fields request_checks.py checks."""

from __future__ import annotations

from .request_checks import MAX_TOKEN_FIELDS, TEMPLATE_OWN_KEYS
from .sampling_settings import EXTENSION_FIELDS

STRING = {"type": "string"}
WORD = {"type": "string", "minLength": 1}
OBJECT_LIST = {"type": "array", "items": {"type": "object"}}


def number(low: float, high: float) -> dict:
    return {"type": "number", "minimum": low, "maximum": high}


def common_fields(model_name: str) -> dict:
    """JSON schemas of request_checks.COMMON_FIELDS (a test keeps the two lists equal)."""
    return {
        "model": {"type": "string", "enum": [model_name]},
        "stream": {"type": "boolean"},
        "temperature": number(0, 2),
        "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "top_k": {"type": "integer", "minimum": -1},
        "repetition_penalty": {"type": "number", "exclusiveMinimum": 0, "maximum": 2},
        "min_tokens": {"type": "integer", "minimum": 0},
        "frequency_penalty": number(-2, 2),
        "presence_penalty": number(-2, 2),
        "seed": {"type": "integer", "minimum": -(2**63), "maximum": 2**64 - 1},
        "n": {"type": "integer", "minimum": 1},
        "best_of": {"type": "integer", "minimum": 1},
        "echo": {"type": "boolean"},
        "stop": {"anyOf": [WORD, {"type": "array", "items": WORD}]},
        "suffix": STRING,
        "instructions": STRING,
        "user": STRING,
        "tools": OBJECT_LIST,
        "parallel_tool_calls": {"type": "boolean"},
        "logit_bias": {
            "type": "object",
            "propertyNames": {"pattern": "^[0-9]+$"},
            "additionalProperties": number(-100, 100),
        },
        "chat_template_kwargs": {"type": "object", "propertyNames": {"not": {"enum": sorted(TEMPLATE_OWN_KEYS)}}},
        **{field: {"type": "integer", "minimum": 1} for field in MAX_TOKEN_FIELDS},
    }


TEXT_PART = {
    "type": "object",
    "properties": {"type": {"type": "string", "enum": ["text", "input_text", "output_text"]}, "text": STRING},
    "required": ["type", "text"],
}
CONTENT = {"anyOf": [STRING, {"type": "array", "items": TEXT_PART}]}
ARGUMENTS = {"anyOf": [{"type": "object"}, {"type": "string", "contentMediaType": "application/json"}]}
FUNCTION = {"type": "object", "properties": {"name": STRING, "arguments": ARGUMENTS}, "required": ["name", "arguments"]}
TOOL_CALL = {"type": "object", "properties": {"function": FUNCTION}, "required": ["function"]}
MESSAGE = {
    "type": "object",
    "properties": {
        "role": STRING,
        "content": CONTENT,
        "tool_calls": {"type": "array", "items": TOOL_CALL},
        "tool_call_id": STRING,
    },
    "required": ["role"],
}


def item(kind: str, **fields) -> dict:
    """A `/v1/responses` input item without a role (request_checks.INPUT_ITEMS)."""
    properties = {"type": {"type": "string", "enum": [kind]}, **fields}
    return {"type": "object", "properties": properties, "required": list(properties)}


INPUT_ITEM_SCHEMAS = [
    item("function_call", call_id=STRING, name=STRING, arguments=ARGUMENTS),
    item("function_call_output", call_id=STRING, output=STRING),
    item("reasoning", content={"type": "array", "items": {"type": "object", "properties": {"text": STRING}}}),
]
# The field that carries the text to continue, per route (what request_checks.BODY_CHECKS reads).
PROMPT_FIELDS = {
    "/v1/completions": ("prompt", {"type": "string", "minLength": 1}),
    "/v1/chat/completions": ("messages", {"type": "array", "items": MESSAGE, "minItems": 1}),
    "/v1/responses": (
        "input",
        {
            "anyOf": [
                {"type": "string", "minLength": 1},
                {"type": "array", "items": {"anyOf": [MESSAGE, TEXT_PART, *INPUT_ITEM_SCHEMAS]}, "minItems": 1},
            ]
        },
    ),
}
REFUSED_FIELDS = {"generation_config"}  # accepted by transformers' handlers, refused by ours


def body_schema(path: str, accepted: set[str], model_name: str) -> dict:
    """The request body of `path`, whose handler accepts the fields `accepted` (the server reads the
    sampling extensions itself)."""
    typed = common_fields(model_name)
    prompt_field, prompt_schema = PROMPT_FIELDS[path]
    fields = {name: typed.get(name, {}) for name in sorted((accepted | set(EXTENSION_FIELDS)) - REFUSED_FIELDS)}
    fields[prompt_field] = prompt_schema
    return {"type": "object", "properties": fields, "required": [prompt_field], "additionalProperties": False}


ERROR = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "message": STRING,
                "type": STRING,
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
            "required": ["message", "type", "param", "code"],
        }
    },
    "required": ["error"],
}


def error_responses(*statuses: int) -> dict:
    return {str(s): {"description": "an error", "content": {"application/json": {"schema": ERROR}}} for s in statuses}


def generation_operation(path: str, accepted: set[str], model_name: str) -> dict:
    """`openapi_extra` of a generation route: its body, its answers (JSON, or an event stream)."""
    content = {"application/json": {"schema": {"type": "object"}}, "text/event-stream": {"schema": STRING}}
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": body_schema(path, accepted, model_name)}},
        },
        "responses": {"200": {"description": "the answer", "content": content}, **error_responses(400, 413, 499, 503)},
    }

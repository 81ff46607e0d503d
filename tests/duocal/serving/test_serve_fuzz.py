"""`duocal serve` fuzzed from its own OpenAPI schema (/openapi.json) with schemathesis, over HTTP against a
real server: valid and invalid bodies for every route, a bounded number of cases (derandomized, so a run is
repeatable); no answer is a 5xx, and the server still generates for a valid request afterwards."""

import json

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from helpers.serving import call

MODEL = "smollm2-135m-instruct"
CASES_PER_ROUTE = 30
# Valid bodies ask for at most this many tokens (a missing max_tokens means the model's 1024: 25 s each on a CPU).
MAX_NEW = 4
TOKEN_FIELD = {
    "/v1/completions": "max_tokens",
    "/v1/chat/completions": "max_tokens",
    "/v1/responses": "max_output_tokens",
}


@pytest.fixture(scope="module")
def api_schema(smollm2_server):
    _, _, base = smollm2_server
    return schemathesis.openapi.from_url(base + "/openapi.json")


# schemathesis' pytest loader for a schema from a fixture (`from_fixture`) fails on pytest 9 (it sets
# `node._nodeid`, which pytest 9 removed): each route's strategies run under hypothesis' `given` here.
ROUTES = [
    ("POST", "/v1/completions"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/responses"),
    ("GET", "/v1/models"),
    ("GET", "/health"),
    ("GET", "/metrics"),
]


def short(case) -> None:
    """Cap the tokens a body that asks for generation may take (any other body is left as generated)."""
    field = TOKEN_FIELD.get(case.path)
    body = case.body if isinstance(case.body, dict) else None
    if field is None or body is None:
        return
    for name in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        if isinstance(body.get(name), int) and not isinstance(body[name], bool) and body[name] > MAX_NEW:
            body[name] = MAX_NEW
    if all(body.get(name) is None for name in ("max_tokens", "max_completion_tokens", "max_output_tokens")):
        body[field] = MAX_NEW


def cases(operation):
    """Bodies that fit the schema and bodies that do not (a route without a body: its one valid request)."""
    if operation.method.upper() == "GET":
        return operation.as_strategy(GenerationMode.POSITIVE)
    return st.one_of(operation.as_strategy(GenerationMode.POSITIVE), operation.as_strategy(GenerationMode.NEGATIVE))


@pytest.mark.parametrize("method, path", ROUTES)
def test_no_fuzzed_request_gets_a_5xx(api_schema, smollm2_server, method, path):
    _, _, base = smollm2_server
    operation = api_schema[path][method].ok() if hasattr(api_schema[path][method], "ok") else api_schema[path][method]
    examples = 1 if method == "GET" else CASES_PER_ROUTE

    @settings(
        max_examples=examples, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(cases(operation))
    def no_5xx(case):
        short(case)
        response = case.call(base_url=base, timeout=60)
        assert response.status_code < 500, (case.method, case.path, case.body, response.text[:500])

    no_5xx()


def test_the_server_still_generates_after_the_fuzzing(smollm2_server):
    from helpers.serving import pool_is_whole

    served, _, base = smollm2_server
    status, body, _ = call(
        base, "POST", "/v1/completions", {"model": MODEL, "prompt": "the passkey is", "max_tokens": 5}
    )
    assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 5
    assert call(base, "GET", "/health")[0] == 200
    assert pool_is_whole(served)


MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    "path, body, words",
    [  # what the fuzzer found (each was a 500, or a stream cut off after its 200)
        ("/v1/completions", {"prompt": "a", "seed": 2**64}, "seed must be an integer from"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "tool_calls": [{}]}]}, "need a function"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1"}}]}]},
            "arguments must be an object",
        ),
        ("/v1/responses", {"input": "hi", "parallel_tool_calls": []}, "parallel_tool_calls must be true or false"),
        ("/v1/responses", {"input": "hi", "parallel_tool_calls": 1, "stream": True}, "parallel_tool_calls must be"),
        ("/v1/responses", {"input": [*MESSAGES, {"type": "function_call"}]}, "needs a string call_id"),
        ("/v1/responses", {"input": [*MESSAGES, {"type": "reasoning", "content": [1]}]}, "content must be a list"),
        ("/v1/responses", {"input": [*MESSAGES, {"type": "mystery"}]}, "type must be one of"),
    ],
)
def test_what_the_fuzzer_found_is_a_400_that_names_the_field(smollm2_server, path, body, words):
    _, _, base = smollm2_server
    status, text, _ = call(
        base, "POST", path, {"max_tokens" if path != "/v1/responses" else "max_output_tokens": 3, **body}
    )
    error = json.loads(text)["error"]
    assert status == 400 and words in error["message"], text


def test_a_null_field_is_a_field_not_given(smollm2_server):
    _, _, base = smollm2_server
    body = {"input": "hi", "max_output_tokens": 3, "stream": False, "parallel_tool_calls": None, "seed": None}
    status, text, _ = call(base, "POST", "/v1/responses", body)
    assert status == 200, text

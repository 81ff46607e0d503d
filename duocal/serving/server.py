"""`duocal serve`: transformers' OpenAI-compatible server, continuous batching on, a plan applied.

The endpoints, handlers, streaming and request parsing are transformers' own (`transformers serve`,
`transformers/cli/serving/`); what duocal adds: the model is loaded here, checked against the plan
and served under one name (requests for another model get transformers' 400), its continuous
batching runs on duocal's paged cache (`dr.apply` makes `model.init_continuous_batching` build it),
the pool is made at start-up so its size is known before the first request, and requests the pool
can never hold, or with a bad `max_tokens`, get a 400 that says why instead of a 500 or a hang.

Version-specific (transformers 5.24): `ModelManager.loaded_models` / `force_model`, `TimedModel`,
`GenerationState.get_manager(...).init_cb(...)`, `build_server(...)`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

MAX_TOKEN_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
GENERATION_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/responses")


@dataclass
class ServedModel:
    """What `build_app` made: the app, the name clients send, the running batching manager."""

    app: Any
    name: str
    manager: Any  # duocal_runtime.paged.manager.DuoBatchingManager
    runtime: Any


def error_response(status: int, message: str):
    from fastapi.responses import JSONResponse

    return JSONResponse(status_code=status, content={"error": {"message": message, "type": "invalid_request_error"}})


def check_max_tokens(body: Any) -> str | None:
    """Why a request's token limit is unusable (None if it is fine); the pool check comes later."""
    if not isinstance(body, dict):
        return "the request body must be a JSON object"
    for field in MAX_TOKEN_FIELDS:
        value = body.get(field)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return f"{field} must be a positive integer, got {value!r:.40}"
    return None


def build_app(model, tokenizer, runtime, name: str, cb_config) -> ServedModel:
    """The FastAPI app of transformers' server for `model` (a plan already applied through `runtime`)."""
    from transformers.cli.serving.chat_completion import ChatCompletionHandler
    from transformers.cli.serving.completion import CompletionHandler
    from transformers.cli.serving.model_manager import ModelManager, TimedModel
    from transformers.cli.serving.response import ResponseHandler
    from transformers.cli.serving.server import build_server
    from transformers.cli.serving.systemone import SystemOneHandler
    from transformers.cli.serving.transcription import TranscriptionHandler
    from transformers.cli.serving.utils import GenerationState

    from duocal_runtime.paged.manager import PlanRequestError

    models = ModelManager(device=str(model.device), continuous_batching=True, model_timeout=-1)
    key = models.process_model_name(name)
    models.loaded_models[key] = TimedModel(model, timeout_seconds=-1, processor=tokenizer)
    models.force_model = name  # set after __init__: nothing is loaded from the Hub
    state = GenerationState(continuous_batching=True, cb_config=cb_config)
    batching = state.get_manager(key, use_cb=True)
    batching.init_cb(model, model.generation_config)  # the pool is made now, with the model's sampling settings
    handlers = dict(
        completion_handler=CompletionHandler(models, state),
        response_handler=ResponseHandler(models, state),
        transcription_handler=TranscriptionHandler(models, state),
        systemone_handler=SystemOneHandler(models, state),
    )
    app = build_server(models, ChatCompletionHandler(models, state), generation_state=state, **handlers)

    @app.middleware("http")
    async def refuse_bad_limits(request, call_next):
        if request.method == "POST" and request.url.path in GENERATION_PATHS:
            try:
                body = json.loads(await request.body() or b"null")
            except (ValueError, UnicodeDecodeError) as err:
                return error_response(400, f"the request body is not valid JSON: {err}")
            problem = check_max_tokens(body)
            if problem is None and request.url.path == "/v1/chat/completions" and not tokenizer.chat_template:
                problem = f"{name} has no chat template: send a prompt to /v1/completions instead"
            if problem is not None:
                return error_response(400, problem)
        return await call_next(request)

    @app.exception_handler(PlanRequestError)
    async def refuse_what_cannot_fit(_request, exc):
        return error_response(400, str(exc))

    return ServedModel(app, name, batching._cb, runtime)

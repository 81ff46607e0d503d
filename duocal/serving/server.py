"""`duocal serve`'s app: transformers' OpenAI-compatible handlers behind routes of our own, a plan applied.

The handlers, streaming and tokenization are transformers' (`transformers/cli/serving/`); the app is
ours, so it has only the routes we mean: POST `/v1/chat/completions`, `/v1/completions`,
`/v1/responses`, GET `/v1/models`, `/v1/models/{id}`, `/health`, `/metrics` (metrics.py) and `/openapi.json`
(openapi.py) (transformers' `/reset`,
`/load_model`, `/v1/systemone`, `/v1/audio/transcriptions` and FastAPI's docs are 404). What duocal adds:
the model is loaded here, checked against the plan and served under the name it was given (another name:
404 model_not_found); its continuous batching runs on duocal's paged cache (`dr.apply` makes
`model.init_continuous_batching` build it), made at start-up so its size is known before the first
request; every body is read within a size limit and checked field by field before a handler sees it
(request_checks.py), and a value the server cannot honour is refused, never dropped (served_fields.py);
`stop` ends answers (stop_strings.py); answers take OpenAI's form (openai_answers.py); each request gets
an id no other has and is cancelled if its client goes away (request_flow.py); every error is in OpenAI's
shape (api_errors.py); `/health` is 503 once the batching worker is gone.

Version-specific (transformers 5.24): `ModelManager.loaded_models` / `force_model` /
`process_model_name`, `TimedModel`, `GenerationState.get_manager(...)` and its `_cb` (the manager it would make
in `init_cb`, made here), the handlers' `handle_request(body, request_id)` and `_valid_params_class`.
"""

import logging
import time
from dataclasses import dataclass
from typing import Any

from .api_errors import ApiError, error_response, install_error_handlers
from .batch_sampling import BatchSampler, engine_config, install_batch_sampling
from .metrics import install_metrics
from .openai_answers import shape_answer
from .openapi import generation_operation
from .request_checks import DEFAULT_MAX_REQUEST_BYTES, check_body, parse_body, read_body, without_nulls
from .request_flow import request_id_for, run_while_connected
from .sampling_settings import SamplingSettings, read_here, unserved_warpers
from .served_fields import check_served
from .stop_strings import honour_stop_strings

logger = logging.getLogger("duocal.serving")

CHAT_PATHS = ("/v1/chat/completions", "/v1/responses")


@dataclass
class ServedModel:
    """What `build_app` made: the app, the name clients send, the running batching manager."""

    app: Any
    name: str
    manager: Any  # duocal_runtime.paged.manager.DuoBatchingManager
    runtime: Any


async def answer(handler, body: dict, request_id: str):
    """The handler's response; a chat template that refuses the messages is the client's error (400)."""
    from jinja2.exceptions import TemplateError

    try:
        return await handler.handle_request(body, request_id)
    except TemplateError as err:
        raise ApiError(400, f"the model's chat template refused the messages: {err}", param="messages") from None


def model_not_found(name: str, asked) -> ApiError:
    return ApiError(
        404,
        f"the model {asked!r} is not served here: this server serves {name!r}",
        param="model",
        code="model_not_found",
    )


@dataclass(frozen=True)
class Serving:
    """What every generation route shares: the batching manager, the model's name, its per-request sampling."""

    manager: Any
    name: str
    chat_template: bool
    sampler: BatchSampler
    max_bytes: int


def generation_route(path: str, handler, serving: Serving, accepted: set[str]):
    """The POST route for `path`: read and check the body, run `handler` (which accepts the fields `accepted`)
    while the client is there, with the request's sampling, and send its answer in OpenAI's form."""
    from fastapi import Request

    own_fields = read_here(accepted)

    async def route(request: Request):
        body = without_nulls(parse_body(await read_body(request, serving.max_bytes)))
        check_body(path, body)
        if body.get("model") not in (None, serving.name):
            raise model_not_found(serving.name, body["model"])
        check_served(path, body)
        sampling = serving.sampler.asked(body)
        if path in CHAT_PATHS and not serving.chat_template:
            raise ApiError(400, f"{serving.name} has no chat template: send a prompt to /v1/completions instead")
        if path == "/v1/responses":
            body.setdefault("stream", False)  # OpenAI's default; transformers' is true
        request_id = request_id_for(request)
        cancel = lambda: serving.manager.cancel_request(request_id)  # noqa: E731
        handler_body = {key: value for key, value in body.items() if key not in own_fields}
        with serving.sampler.expecting(request_id, sampling):
            response = await run_while_connected(request, answer(handler, handler_body, request_id), cancel)
        response = shape_answer(path, body, response, cancel)
        response.headers["x-request-id"] = request_id
        return response

    return route


def health_route(manager):
    def health():
        fatal = manager.background_thread_status.fatal_error
        if fatal is not None or not manager.is_running():
            why = f": {fatal}" if fatal is not None else ""
            return error_response(503, f"the batching worker is not running{why}", code="worker_dead")
        return {"status": "ok"}

    return health


def model_routes(app, name: str) -> None:
    """GET /v1/models (the one model) and /v1/models/{id} (it, or 404 model_not_found)."""
    model = {"id": name, "object": "model", "created": int(time.time()), "owned_by": "duocal"}

    def one(model_id: str):
        if model_id != name:
            raise model_not_found(name, model_id)
        return model

    app.add_api_route("/v1/models", lambda: {"object": "list", "data": [model]}, methods=["GET"])
    app.add_api_route("/v1/models/{model_id:path}", one, methods=["GET"])


def sampling_manager(model, cb_config) -> tuple[Any, BatchSampler]:
    """The batching manager, its pool made now and sampling per request (defaults: the model's generation
    config), started."""
    unserved = unserved_warpers(model.generation_config)
    if unserved:
        logger.warning("duocal serve: the model's generation config sets %s; not applied", ", ".join(unserved))
    generation_config = engine_config(model.generation_config)
    manager = model.init_continuous_batching(generation_config=generation_config, continuous_batching_config=cb_config)
    sampler = install_batch_sampling(manager, SamplingSettings.of_generation_config(model.generation_config))
    manager.start()
    return manager, sampler


def build_app(
    model, tokenizer, runtime, name: str, cb_config, max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
) -> ServedModel:
    """The app serving `model` (a plan already applied through `runtime`) on transformers' handlers."""
    from fastapi import FastAPI
    from transformers.cli.serving.chat_completion import ChatCompletionHandler
    from transformers.cli.serving.completion import CompletionHandler
    from transformers.cli.serving.model_manager import ModelManager, TimedModel
    from transformers.cli.serving.response import ResponseHandler
    from transformers.cli.serving.utils import CBWorkerDeadError, GenerationState

    from duocal_runtime.paged.manager import PlanRequestError

    models = ModelManager(device=str(model.device), continuous_batching=True, model_timeout=-1)
    models.process_model_name = lambda model_id: model_id  # answers name the model as given, without "@main"
    key = models.process_model_name(name)
    models.loaded_models[key] = TimedModel(model, timeout_seconds=-1, processor=tokenizer)
    models.force_model = name  # set after __init__: nothing is loaded from the Hub
    state = GenerationState(continuous_batching=True, cb_config=cb_config)
    batching = state.get_manager(key, use_cb=True)
    manager, sampler = sampling_manager(model, cb_config)
    batching._cb = manager  # what init_cb would make (the handlers call it; it keeps this one)
    honour_stop_strings(batching, manager)
    app = FastAPI(title="duocal serve", docs_url=None, redoc_url=None, openapi_url="/openapi.json")
    install_error_handlers(app, PlanRequestError, CBWorkerDeadError)
    handlers = {
        "/v1/chat/completions": ChatCompletionHandler(models, state),
        "/v1/completions": CompletionHandler(models, state),
        "/v1/responses": ResponseHandler(models, state),
    }
    serving = Serving(manager, name, bool(tokenizer.chat_template), sampler, max_request_bytes)
    for path, handler in handlers.items():
        accepted = set(handler._valid_params_class.__mutable_keys__)
        route = generation_route(path, handler, serving, accepted)
        app.add_api_route(path, route, methods=["POST"], openapi_extra=generation_operation(path, accepted, name))
    model_routes(app, name)
    app.add_api_route("/health", health_route(manager), methods=["GET"])
    install_metrics(app, manager, [*handlers, "/v1/models", f"/v1/models/{name}", "/health", "/openapi.json"])
    return ServedModel(app, name, manager, runtime)

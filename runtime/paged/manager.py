"""transformers' continuous-batching manager, serving a duocal plan: its scheduler, requests and
sampling, with `DuoPagedCache` as its cache and the runtime's attention function.

`Runtime.init_continuous_batching(...)` builds one; while a runtime is applied,
`model.init_continuous_batching` and `model.generate_batch` reach it (the model instance's own
attribute, removed by `remove()`; nothing global changes). Version-specific (transformers 5.24):
`switch_to_cb_friendly_attn` (it refuses attention names it does not know) and
`_create_batch_processor` (it builds the cache itself) are overridden, and so are the parts that let one
request harm others: `add_requests` (the first refused request lost the whole `generate_batch`),
`cancel_request` (a cancelled request's result handler was never removed) and the loop body (a failed
forward pass killed the worker for good; here it fails the requests of that batch only).
"""

from __future__ import annotations

import logging

from ..planning.sizes import bytes_with_count
from .batching_internals import (
    SCHEDULER_MAPPING,
    ContinuousBatchingManager,
    ContinuousBatchProcessor,
    FIFOScheduler,
    RequestState,
    update_cb_config_after_cache_creation,
)
from .paged_cache import DuoPagedCache

logger = logging.getLogger("duocal_runtime.paged")

# What the paged cache cannot do yet, forced off in the config it is given (see docs/guides/serve.md).
FORCED_OFF = {
    "allow_block_sharing": False,
    "use_cuda_graph": False,
    "use_async_batching": False,
    "auto_switch_to_flash": False,
    "cpu_offload_space": 0,
}


class PlanRequestError(ValueError):
    """A request this pool can never serve (too long for it, or for one prefill pass of an H2O plan)."""


class _BatchFailed(Exception):
    """A forward pass failed: its requests fail, the worker goes on (raised from `_generation_step`)."""


class DuoBatchingManager(ContinuousBatchingManager):
    """A `ContinuousBatchingManager` whose cache stores `runtime.plan`'s per-head groups."""

    def __init__(self, runtime, generation_config, continuous_batching_config, workload_hints=None):
        self.runtime = runtime  # read by switch_to_cb_friendly_attn, which the base __init__ calls
        if getattr(generation_config, "num_return_sequences", None) not in (None, 1):
            raise ValueError("duocal's paged cache serves one sequence per request: set num_return_sequences=1")
        if continuous_batching_config.allow_block_sharing:
            logger.warning("duocal: prefix caching is off under a per-head plan (bounded heads keep per-request state)")
        for name, value in FORCED_OFF.items():
            setattr(continuous_batching_config, name, value)
        super().__init__(runtime.model, generation_config, continuous_batching_config, workload_hints)
        self.continuous_batching_config.default_compile_level = 0

    def switch_to_cb_friendly_attn(self, model, auto_switch_to_flash: bool = True) -> None:
        if not self.runtime.active:
            raise RuntimeError("this duocal runtime was removed; apply the plan again to serve it")
        if model.config._attn_implementation != self.runtime.name:
            raise RuntimeError(
                f"the model's attention was switched to {model.config._attn_implementation!r} after duocal applied "
                "its plan; apply the plan again (dr.apply(model, plan)) before batching"
            )

    @property
    def cache(self) -> DuoPagedCache:
        """The pool (made on first use; `start()` makes it at once, so requests are checked against it)."""
        if self.batch_processor is None:
            self.batch_processor = self._create_batch_processor()
        return self.batch_processor.cache

    def start(self) -> None:
        self.cache  # noqa: B018 (built here, not in the loop thread, so add_request can check requests)
        super().start()

    def add_request(self, input_ids, request_id=None, max_new_tokens=None, *args, **kwargs):
        try:
            self.check_tokens(input_ids)
            self.check_request(
                len(input_ids), self.generation_config.max_new_tokens if max_new_tokens is None else max_new_tokens
            )
        except PlanRequestError:
            self.forget_handler(request_id)  # a handler registered before a refused request would never be called
            raise
        return super().add_request(input_ids, request_id, max_new_tokens, *args, **kwargs)

    def add_requests(self, inputs, max_new_tokens=None, streaming=False, record_timestamps=False, **kwargs):
        """As transformers' (ids `req_N`, in order), but a refused request fails alone: its output carries the
        error and the others run (transformers stops at the first, and `generate_batch` loses them all)."""
        with self._request_lock:
            first, self._request_counter = self._request_counter, self._request_counter + len(inputs)
        eos = self.generation_config.eos_token_id
        eos = self.model.config.eos_token_id if eos is None else eos
        ids = [f"req_{first + i}" for i in range(len(inputs))]
        for request_id, input_ids in zip(ids, inputs, strict=True):
            try:
                self.add_request(input_ids, request_id, max_new_tokens, streaming, record_timestamps, eos, **kwargs)
            except PlanRequestError as error:
                self.output_router.fail_and_deliver(RequestState(request_id, list(input_ids)), error)
        return ids

    def cancel_request(self, request_id: str) -> None:
        """Cancel it and drop its result handler (a cancelled request never delivers the output that would)."""
        super().cancel_request(request_id)
        self.forget_handler(request_id)

    def forget_handler(self, request_id) -> None:
        with self.output_router._lock:
            self.output_router.result_handlers.pop(request_id, None)

    def check_tokens(self, input_ids) -> None:
        """Refuse an empty prompt (its pass would fail every request batched with it) and ids outside the
        vocabulary (an index error on CPU, a device-side assert that ends the process on CUDA)."""
        if len(input_ids) == 0:
            raise PlanRequestError("the prompt is empty: send at least one token")
        vocab = self.model.config.get_text_config().vocab_size
        low, high = min(input_ids), max(input_ids)
        if low < 0 or high >= vocab:
            raise PlanRequestError(f"token id {low if low < 0 else high} is outside the vocabulary (0-{vocab - 1})")

    def check_request(self, prompt: int, new_tokens: int) -> None:
        """Refuse at once (not by starving in the queue) a request this pool can never hold."""
        cache, tokens = self.cache, prompt + (new_tokens or 0)
        positions = getattr(self.model.config.get_text_config(), "max_position_embeddings", None)
        if positions is not None and tokens > positions:
            raise PlanRequestError(
                f"a request of {prompt} prompt + {new_tokens} new tokens goes beyond the model's {positions} "
                "positions; send a shorter prompt or ask for fewer tokens"
            )
        if cache.sectors_for(tokens) > cache.num_sectors:
            raise PlanRequestError(
                f"a request of {prompt} prompt + {new_tokens} new tokens needs "
                f"{bytes_with_count(cache.bytes_for(tokens))} of KV cache, more than the whole pool "
                f"({bytes_with_count(cache.pool_size())}); send a shorter one or start the server with more "
                "KV memory"
            )
        if cache.chunk_sensitive and prompt > cache.max_batch_tokens:
            raise PlanRequestError(
                f"a prompt of {prompt} tokens is longer than max_batch_tokens ({cache.max_batch_tokens}): this plan's "
                "H2O heads prefill a prompt in one pass; raise max_batch_tokens or send a shorter prompt"
            )

    def _generation_step(self) -> None:
        try:
            super()._generation_step()
        except Exception as error:
            raise _BatchFailed(error) from error

    def _generation_loop_body(self, batch_processor: ContinuousBatchProcessor, bootstrapping: bool) -> bool:
        try:
            return super()._generation_loop_body(batch_processor, bootstrapping)
        except _BatchFailed as failed:
            logger.error("duocal: a forward pass failed; its requests fail, the others go on", exc_info=failed)
            batch_processor.cache.abandon_pass()
            batch_processor.handle_batch_error(failed.__cause__)
            return True

    def _create_batch_processor(self) -> ContinuousBatchProcessor:
        if isinstance(self.batch_processor, ContinuousBatchProcessor):
            self.batch_processor.reset()
            return self.batch_processor
        model, cb_config = self.model, self.continuous_batching_config
        shape = self.runtime.plan.shape
        rep = shape.num_attention_heads // shape.num_key_value_heads
        config = model.config.get_text_config()
        cache = DuoPagedCache(self.runtime.plan, config, cb_config, model.device, model.dtype, rep, self.runtime)
        update_cb_config_after_cache_creation(
            cb_config=cb_config, num_blocks=cache.num_blocks, max_batch_tokens=cache.max_batch_tokens
        )
        cb_config.max_blocks_per_request = 0
        scheduler = SCHEDULER_MAPPING.get(cb_config.scheduler_type, FIFOScheduler)(
            cache=cache, safety_margin=cb_config.safety_margin, max_requests_per_batch=cb_config.max_requests_per_batch
        )
        return ContinuousBatchProcessor(
            cache=cache,
            config=config,
            generation_config=self.generation_config,
            continuous_batching_config=cb_config,
            logit_processor=self.logit_processor,
            input_queue=self.input_queue if self.is_tp_driver else None,
            cancel_queue=self.cancel_queue if self.is_tp_driver else None,
            output_router=self.output_router,
            background_thread_status=self.background_thread_status,
            model_device=model.device,
            model_dtype=model.dtype,
            scheduler=scheduler,
            distributed_helper=self.distributed_helper,
        )

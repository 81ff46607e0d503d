"""`apply(model, plan)`: run a model with duocal's per-head KV cache, undoably.

Nothing is patched at import. `apply` registers an attention function under a name of its own
and switches the model to it; `remove()` (or leaving the `with` block) switches back and
unregisters it. Applying a new plan to a model replaces the one applied before; inside the `with`
block of that one, it suspends it instead, and leaving the inner block brings the outer one back.
"""

from __future__ import annotations

import weakref
from typing import Any

from .. import compat
from ..attention.rotation import rotation_of
from ..checks import require_count, require_instance
from ..errors import PlanError
from ..planning.budget import dtype_bytes
from ..planning.plan import Plan
from ..profile.shape import shape_of_config
from .cache import DuoCache, DuoCacheLayer
from .drop_in import forward_with, generate_with

_RUNTIME_ATTR = "_duocal_runtime"


class Runtime:
    """Handle for a plan applied to a model. Use as a context manager or call `remove()`."""

    def __init__(self, model, plan: Plan, prefill_chunk_size: int | None = None):
        self.model, self.plan, self.prefill_chunk_size = model, plan, prefill_chunk_size
        # heads that see positions within their cache rotate by the model's RoPE (hf/stream_positions.py)
        self.rotation = rotation_of(model, plan.shape.head_dim) if plan.cache_positions else None
        self.position_limit = trained_positions(model.config)
        self.plan_capacity = max(p.capacity or 0 for row in plan.policies for p in row)
        self.name = f"duocal_{id(self):x}"
        self.active = False
        self.suspended = False  # displaced by a runtime applied inside its `with` block; back when that one ends
        self._entered = False  # inside its own `with` block
        self._previous: str | None = None
        self._outer: Runtime | None = None

    def warmup(self, lengths, batch: int = 1) -> float:
        """Compile, once, the kernels that prefills of these prompt lengths use (FlexAttention's block-sparse
        kernels, one per padded length and head-group size), so that no later call of those lengths waits
        for a compile (5-13 s each on CPU). Returns the seconds it took."""
        import time

        import torch

        started = time.perf_counter()
        device = next(self.model.parameters()).device
        vocab = getattr(self.model.config, "vocab_size", 2)
        with torch.no_grad():
            for n in lengths:
                n = require_count("warmup length", n, 1)
                ids = torch.randint(1, max(2, vocab), (require_count("batch", batch, 1), n), device=device)
                self.model(input_ids=ids, use_cache=False, logits_to_keep=1)
        return time.perf_counter() - started

    def __repr__(self) -> str:
        state = "applied" if self.active else "removed"
        return f"Runtime({state} to {type(self.model).__name__}, {self.plan!r})"

    def new_cache(self, max_length: int | None = None) -> DuoCache:
        """A fresh per-head cache for one generation (or one conversation, reused across turns).

        With `max_length` (prompt + new tokens, at most), a static cache: fixed buffers and decode
        steps that `torch.compile` can capture (generate() compiles them on CUDA by itself).
        """
        if not self.active:
            raise RuntimeError("this duocal runtime was removed; apply the plan again to get a cache")
        if max_length is not None and (
            not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < 1
        ):
            raise PlanError(f"max_length must be a positive number of tokens (prompt + new tokens), got {max_length!r}")
        return DuoCache(self.plan, owner=self, prefill_chunk_size=self.prefill_chunk_size, max_length=max_length)

    def init_continuous_batching(self, generation_config=None, continuous_batching_config=None, workload_hints=None):
        """transformers' continuous batching (scheduler, requests, sampling) with this plan's paged cache:
        full heads in pages that grow, bounded heads in one fixed block of slots per request, one pool.

        While the runtime is applied, `model.init_continuous_batching(...)` and `model.generate_batch(...)`
        call this (the model instance's attribute; `remove()` takes it away). Give the pool's size with
        `ContinuousBatchingConfig(num_blocks=N)` (N blocks of `page_size` tokens of a plain model's KV, the
        same memory as transformers' own cache with that setting), else it is sized from free memory.
        """
        from transformers import ContinuousBatchingConfig

        from ..paged.manager import DuoBatchingManager

        if not self.active:
            raise RuntimeError("this duocal runtime was removed; apply the plan again to batch with it")
        if self.plan.cache_positions:
            raise PlanError(
                "transformers' continuous batching gives the model its own positions, but this plan's heads see "
                "positions within their cache: generate with model.generate() (batches and left padding work there)"
            )
        cached = getattr(self.model, "_cached_continuous_batching_manager", None)
        if isinstance(cached, DuoBatchingManager) and cached.runtime is self:
            return cached
        config = generation_config if generation_config is not None else self.model.generation_config
        if config.eos_token_id is None:
            config.eos_token_id = -1  # as transformers does: no end-of-sequence token
        return DuoBatchingManager(
            self, config, continuous_batching_config or ContinuousBatchingConfig(), workload_hints
        )

    def _attention(self, module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        layer = kwargs.get(compat.LAYER_KWARG)
        if layer is None:
            if kwargs.get("use_cache") or key.shape[2] != query.shape[2]:
                # transformers made or was given another cache (e.g. generate() without cache=...)
                raise RuntimeError(
                    "duocal: the model is using a cache that is not a DuoCache; pass "
                    "cache=runtime.new_cache() to generate() or forward(), or use_cache=False"
                )
            # No cache (use_cache=False): attend with the plan's policies, keep nothing.
            layer = DuoCacheLayer(self.plan, module.layer_idx, self, self.prefill_chunk_size)
        elif layer.owner is not self:
            raise RuntimeError("duocal: this DuoCache was made by another runtime; use this runtime's new_cache()")
        if attention_mask is not None and attention_mask.ndim != 2:
            raise ValueError("duocal: 4D attention masks are not supported; pass a 2D padding mask")
        out = layer.attend(query, key, value, attention_mask, scaling if scaling is not None else module.scaling)
        return out.transpose(1, 2), None

    def _install(self) -> None:
        previous = getattr(self.model, _RUNTIME_ATTR, None)
        if previous is not None and previous.active:
            previous._undo()
            if previous._entered:
                previous.suspended, self._outer = True, previous
        self._previous = compat.attention_implementation(self.model)
        compat.register(self.name, _weak_attention(self))
        # transformers' registry is global: make sure a runtime dropped without remove() leaves it
        weakref.finalize(self, compat.unregister, self.name)
        compat.set_attention_implementation(self.model, self.name)
        setattr(self.model, _RUNTIME_ATTR, self)
        # this instance only (never the class); remove() undoes both
        self.model.init_continuous_batching = self.init_continuous_batching
        self.model.generate = generate_with(self, type(self.model).generate.__get__(self.model))
        self.model.forward = forward_with(self, type(self.model).forward.__get__(self.model))
        self.active = True

    def remove(self) -> None:
        """Restore the model's attention implementation (or the runtime this one suspended); this handle's
        caches stop working."""
        if self.suspended:  # removed while another runtime holds the model: it never comes back
            self.suspended = self._entered = False
            return
        if not self.active:
            return
        self._undo()
        outer, self._outer = self._outer, None
        if outer is not None and outer.suspended and getattr(self.model, _RUNTIME_ATTR, None) is None:
            outer.suspended = False
            outer._install()

    def _undo(self) -> None:
        self._stop_batching()
        compat.set_attention_implementation(self.model, self._previous)
        compat.unregister(self.name)
        if getattr(self.model, _RUNTIME_ATTR, None) is self:
            delattr(self.model, _RUNTIME_ATTR)
        for name in ("init_continuous_batching", "generate", "forward"):
            self.model.__dict__.pop(name, None)  # the model's own methods are back
        self.active = False

    def _stop_batching(self) -> None:
        """A manager kept on the model (persistent) stops with the runtime that serves it."""
        cached = getattr(self.model, "_cached_continuous_batching_manager", None)
        if getattr(cached, "runtime", None) is self:
            cached.stop(block=True, hard_stop=True)
            del self.model._cached_continuous_batching_manager

    def __enter__(self) -> Runtime:
        self._entered = True
        return self

    def __exit__(self, *exc: Any) -> None:
        self._entered = False
        self.remove()


def _weak_attention(runtime: Runtime):
    """The registered function holds the runtime weakly, so the global registry never keeps a
    model alive (the model holds its runtime; the runtime holds the model)."""
    ref = weakref.ref(runtime)

    def attention(module, *args, **kwargs):
        live = ref()
        if live is None:
            raise RuntimeError("the duocal runtime of this model was garbage-collected; apply the plan again")
        return live._attention(module, *args, **kwargs)

    return attention


DEFAULT_TRAINED_POSITIONS = 4096  # for a config that names no max_position_embeddings


def trained_positions(config) -> int:
    """The positions the model was trained on (config.max_position_embeddings)."""
    return int(getattr(config, "max_position_embeddings", None) or DEFAULT_TRAINED_POSITIONS)


def check_budget_dtype(plan: Plan, model) -> None:
    """A plan that filled a byte budget in one dtype would hold other bytes in a model of another."""
    held = str(getattr(model, "dtype", "")).removeprefix("torch.")
    planned = plan.budget_dtype
    if planned is not None and held and dtype_bytes(planned) != dtype_bytes(held):
        raise PlanError(
            f"this plan fills its byte budget in {planned}, but the model holds {held} keys and values: its cache "
            f"would take {dtype_bytes(held) / dtype_bytes(planned):g}x the bytes; make the plan with dtype=model.dtype"
        )


def apply(model, plan: Plan, *, prefill_chunk_size: int | None = None, warmup=()) -> Runtime:
    """Serve `model` with `plan`'s per-head KV cache. Returns a `Runtime` (context manager).

    `prefill_chunk_size` splits long prompts into chunks inside every layer's attention: peak
    attention memory is bounded by the chunk, and H2O heads evict after each chunk (so their
    kept set can differ from a one-pass prefill, as chunked prefill does in the H2O reference).
    `warmup` (prompt lengths) compiles their kernels now (`Runtime.warmup`), not at the first call.
    """
    require_instance("plan", plan, Plan, "a Plan (make one with dr.plan(profile, sparsity=...))")
    if not hasattr(model, "config") or not hasattr(model, "set_attn_implementation"):
        raise TypeError(f"model must be a transformers PreTrainedModel, got {type(model).__name__}")
    compat.check_model_supported(model.config)
    shape = shape_of_config(model.config)
    if shape != plan.shape:
        raise PlanError(
            f"plan is for {plan.shape.describe()} ({plan.model_name or 'unnamed model'}), but the model has "
            f"{shape.describe()}: make the plan from this model's profile"
        )
    check_budget_dtype(plan, model)
    if prefill_chunk_size is not None:
        prefill_chunk_size = require_count("prefill_chunk_size", prefill_chunk_size, 0)
        if prefill_chunk_size < 1:
            raise PlanError(f"prefill_chunk_size must be a positive number of tokens, got {prefill_chunk_size}")
    runtime = Runtime(model, plan, prefill_chunk_size)
    runtime._install()
    if warmup:
        runtime.warmup(warmup)
    return runtime

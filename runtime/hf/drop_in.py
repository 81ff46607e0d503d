"""Drop-in generation: while a runtime is applied, a `model.generate()` or forward call that passes no
cache gets a fresh cache of that runtime, so callers that never heard of duocal (transformers'
pipelines, lm-evaluation-harness, chat wrappers) run under the plan unchanged.

The model instance's own `generate` and `forward` attributes are set (never the class: nothing
global changes); `Runtime.remove()` deletes them. A `DuoCache` given by the caller, or
`use_cache=False`, passes through; any other cache is refused before any work.
`cache_implementation="static"` (in the call or the generation
config) gets a static cache of prompt + new tokens; any other implementation is refused, since
transformers would build its own cache, which duocal's attention cannot read.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

from .stream_positions import place_positions

STATIC = ("static",)
DYNAMIC = (None, "dynamic")


def prompt_length(args: tuple, kwargs: dict) -> int:
    """Tokens of the prompt generate() was given (input_ids, inputs or inputs_embeds)."""
    for value in (
        kwargs.get("input_ids"),
        kwargs.get("inputs"),
        args[0] if args else None,
        kwargs.get("inputs_embeds"),
    ):
        if value is not None and hasattr(value, "shape"):
            return int(value.shape[1])
    raise ValueError("duocal: generate() without input_ids: pass cache=runtime.new_cache(max_length=N) yourself")


def new_tokens(config, kwargs: dict, prompt: int) -> int:
    if kwargs.get("max_new_tokens") is not None:
        return int(kwargs["max_new_tokens"])
    if kwargs.get("max_length") is not None:
        return max(1, int(kwargs["max_length"]) - prompt)
    if getattr(config, "max_new_tokens", None) is not None:
        return int(config.max_new_tokens)
    return max(1, int(getattr(config, "max_length", 20)) - prompt)


def cache_for_call(runtime, args: tuple, kwargs: dict) -> tuple[Any, dict]:
    """The cache a call without one gets, and the kwargs to call with (cache_implementation consumed)."""
    kwargs = dict(kwargs)
    config = kwargs.get("generation_config") or runtime.model.generation_config
    implementation = kwargs.pop("cache_implementation", None) or getattr(config, "cache_implementation", None)
    if getattr(config, "cache_implementation", None) is not None:
        config = copy.deepcopy(config)
        config.cache_implementation = None  # transformers refuses a cache next to an implementation
        kwargs["generation_config"] = config
    if implementation in DYNAMIC:
        return runtime.new_cache(), kwargs
    if implementation in STATIC:
        prompt = prompt_length(args, kwargs)
        return runtime.new_cache(max_length=prompt + new_tokens(config, kwargs, prompt)), kwargs
    raise ValueError(
        f"duocal: cache_implementation={implementation!r} would give the model a cache duocal's attention cannot "
        "read; use 'dynamic' or 'static', or pass cache=runtime.new_cache()"
    )


def without_empty_cache(kwargs: dict) -> dict:
    """`cache=None` (or `past_key_values=None`) said out loud means "no cache given": drop it, so that the
    cache made for the call is the only one passed."""
    return {k: v for k, v in kwargs.items() if v is not None or k not in ("cache", "past_key_values")}


def given_cache(kwargs: dict):
    """The caller's cache, refused unless duocal made it (another cache would be read by duocal's attention)."""
    cache = kwargs.get("cache", kwargs.get("past_key_values"))
    if cache is not None and not getattr(type(cache), "made_by_duocal", False):
        raise RuntimeError(
            f"duocal: the model was given a {type(cache).__name__}, which is not a DuoCache; pass "
            "cache=runtime.new_cache(), pass no cache (one is made), or use_cache=False"
        )
    return cache


def generate_with(runtime, generate):
    """`generate` (the model's bound method) giving every call without a cache one of `runtime`'s."""

    @functools.wraps(generate)
    def generate_under_plan(*args, **kwargs):
        kwargs = without_empty_cache(kwargs)
        given = given_cache(kwargs)
        if given is not None:
            return generate_continuing(generate, given, args, kwargs)
        if not runtime.active or kwargs.get("use_cache") is False:
            return generate(*args, **kwargs)
        cache, kwargs = cache_for_call(runtime, args, kwargs)
        return generate(*args, cache=cache, **kwargs)

    return generate_under_plan


def generate_continuing(generate, cache, args: tuple, kwargs: dict):
    """generate() on a caller's cache: the prompt must continue what the cache saw (the same rows, the
    same tokens first), else the answer would be read against another conversation's keys."""
    ids = kwargs.get("input_ids", args[0] if args else kwargs.get("inputs"))
    owner = getattr(cache.layers[0], "owner", None) if getattr(cache, "layers", None) else None
    if owner is not None and not owner.active:
        return generate(*args, **kwargs)  # its layers say the runtime was removed
    seen = getattr(cache, "token_ids", None) if int(cache.get_seq_length()) > 0 else None  # reset: a fresh start
    if seen is not None and ids is not None and hasattr(ids, "shape"):
        same_rows = ids.shape[0] == seen.shape[0]
        if not same_rows or ids.shape[1] < seen.shape[1] or not (ids[:, : seen.shape[1]] == seen.to(ids.device)).all():
            raise ValueError(
                "this DuoCache holds another conversation: a prompt given with a used cache must start with every "
                "token the cache saw (a follow-up turn of the same rows); make a new cache with runtime.new_cache()"
            )
    out = generate(*args, **kwargs)
    sequences = getattr(out, "sequences", out)
    if hasattr(sequences, "shape"):
        cache.token_ids = sequences.detach()  # what the next call on this cache must continue
    return out


def forward_with(runtime, forward):
    """`forward` (the model's bound method) giving a call that would make a cache one of `runtime`'s, and
    the positions a plan with cache positions needs (stream_positions.py)."""

    @functools.wraps(forward)
    def forward_under_plan(*args, **kwargs):
        kwargs = without_empty_cache(kwargs)
        if not runtime.active:
            return forward(*args, **kwargs)
        cache = given_cache(kwargs)
        if cache is None and wants_cache(runtime, args, kwargs):
            cache = kwargs["cache"] = runtime.new_cache()
        if runtime.plan.cache_positions:
            kwargs = place_positions(runtime, cache, args, kwargs)
        return forward(*args, **kwargs)

    return forward_under_plan


def wants_cache(runtime, args: tuple, kwargs: dict) -> bool:
    """A call that would make a cache of transformers' own (use_cache, none given)."""
    use_cache = kwargs.get("use_cache")
    if use_cache is None:
        use_cache = getattr(runtime.model.config, "use_cache", False)
    return bool(use_cache) and len(args) <= 2  # positional caches are passed through as they are

"""What `duocal serve` does before and while it listens: model, profile and plan, the pool, uvicorn."""

from __future__ import annotations

import logging
import signal
import socket
import sys
from dataclasses import dataclass

from .request_checks import DEFAULT_MAX_REQUEST_BYTES
from .server import ServedModel, build_app

MAX_DEFAULT_BATCH_TOKENS = 8192


def kv_blocks(kv_memory: str | None, num_blocks: int | None, shape, dtype, page_size: int) -> int | None:
    """The pool as transformers' `num_blocks` counts it (blocks of `page_size` tokens of the plain model)."""
    from duocal_runtime.paged.pool_size import pool_blocks
    from duocal_runtime.planning.budget import Budget

    if kv_memory is not None and num_blocks is not None:
        raise ValueError("give --kv-memory or --num-blocks, not both")
    if num_blocks is not None:
        if num_blocks < 1:
            raise ValueError(f"--num-blocks must be a positive number of blocks, got {num_blocks}")
        return num_blocks
    if kv_memory is None:
        return None
    pool_size = Budget.parse(kv_memory)
    if pool_size.unit != "bytes":
        raise ValueError(f"--kv-memory takes bytes ('2GiB', '500MB'), got {kv_memory!r}")
    return pool_blocks(pool_size.amount, shape, dtype, page_size)


def check_kv_memory_holds_a_request(kv_memory: str, blocks: int, plan, dtype, page_size: int, context: int) -> None:
    """Refuse a `--kv-memory` whose pool cannot hold one request of `context` tokens (the server's
    longest): such a server starts and then serves nothing of that length. Says the smallest that does."""
    from duocal_runtime.paged.paged_cache import DuoPagedCache
    from duocal_runtime.paged.pool_size import plain_block_bytes
    from duocal_runtime.planning.sizes import bytes_with_count

    smallest = DuoPagedCache.smallest_pool_blocks(plan, dtype, page_size, context)
    if blocks < smallest:
        need = smallest * plain_block_bytes(plan.shape, dtype, page_size)
        raise ValueError(
            f"--kv-memory {kv_memory} holds no request of {context} tokens (the model's context) with this plan; "
            f"the smallest pool that holds one is {bytes_with_count(need)}: "
            f"give --kv-memory {-(-need // 2**20)}MiB or more"
        )


def request_bytes(size: str | int | None) -> int:
    """`--max-request-size` ('4MiB', '500kB' or bytes) in bytes; None: the default (4 MiB)."""
    from duocal_runtime.planning.budget import Budget

    if size is None:
        return DEFAULT_MAX_REQUEST_BYTES
    if isinstance(size, int) and not isinstance(size, bool) and size >= 1:
        return size
    request_size_limit = Budget.parse(str(size))
    if request_size_limit.unit != "bytes" or request_size_limit.amount < 1:
        raise ValueError(f"--max-request-size takes a positive size in bytes ('4MiB', '500kB'), got {size!r}")
    return int(request_size_limit.amount)


@dataclass(frozen=True)
class ServeSettings:
    """What `duocal serve` was asked for (None: the default; see `duocal serve --help`)."""

    model: str | None = None  # a folder, a .gguf file or a known name; None: the demo model
    profile: str | None = None  # None: the model's shipped profile
    sparsity: float | None = None  # or `budget`, not both
    budget: str | None = None
    kv_memory: str | None = None  # or `num_blocks`
    num_blocks: int | None = None
    max_batch_tokens: int | None = None  # None: the model's context, at most MAX_DEFAULT_BATCH_TOKENS
    page_size: int | None = None  # None: 16 tokens, or the least multiple of 16 that holds whole code groups
    kv_bits: int = 16
    max_request_size: str | int | None = None  # None: DEFAULT_MAX_REQUEST_BYTES


SERVE_FIELDS = frozenset(ServeSettings.__dataclass_fields__)  # `duocal serve`'s options of the same names


def prepare_server(settings: ServeSettings):
    """Load, plan, apply and build the app; (ServedModel, pool summary). Every check comes before the pool."""
    import duocal_runtime as dr
    from duocal.models import ModelRef
    from duocal_runtime.paged.paged_cache import pool_summary
    from duocal_runtime.paged.pool_size import pool_config
    from duocal_runtime.paged.quantized_pages import check_page_holds_groups, page_size_for, quantized_policies
    from duocal_runtime.planning.head_order import check_head_choice

    s = settings
    check_head_choice(sparsity=s.sparsity, budget=s.budget)
    if s.max_batch_tokens is not None and s.max_batch_tokens < 1:
        raise ValueError(f"--max-batch-tokens must be a positive number of tokens, got {s.max_batch_tokens}")
    if s.page_size is not None and s.page_size < 4:
        raise ValueError(f"--page-size must be at least 4 tokens, got {s.page_size}")
    max_bytes = request_bytes(s.max_request_size)
    ref = ModelRef.resolve(s.model)
    chosen = s.profile or ref.default_profile
    if chosen is None:
        raise ValueError(f"no profile for {ref.arg}: pass --profile (a file or prebuilt name, duocal profiles list)")
    loaded, config = dr.load_profile(chosen), ref.load_config()
    loaded.check_compatible(config)
    context = getattr(config, "max_position_embeddings", 4096)
    dtype = saved_dtype(config)  # the plan and the pool are made for the dtype the weights load in
    when = {"context": context if s.budget else None, "dtype": dtype, "kv_bits": s.kv_bits}
    # transformers' continuous batching gives the model each token's place: sink windows keep original positions
    plan = dr.plan(loaded, sparsity=s.sparsity, budget=s.budget, positions="original", **when)
    page_size = s.page_size or page_size_for(plan)
    for policy in quantized_policies(plan):
        check_page_holds_groups(policy, page_size)
    blocks = kv_blocks(s.kv_memory, s.num_blocks, plan.shape, dtype, page_size)
    if s.kv_memory is not None:
        check_kv_memory_holds_a_request(s.kv_memory, blocks, plan, dtype, page_size, context)
    runtime = dr.apply(ref.load_model(dtype), plan)  # every option is checked: now the weights load
    cb_config = pool_config(page_size, blocks, s.max_batch_tokens or min(context, MAX_DEFAULT_BATCH_TOKENS))
    served = build_app(runtime.model, ref.load_tokenizer(), runtime, ref.name, cb_config, max_bytes)
    return served, pool_summary(served.manager.cache, context, page_size)


def saved_dtype(config):
    """The dtype a model folder's weights load in (transformers' "auto": the config's, else float32 here)."""
    import torch

    saved = getattr(config, "dtype", None) or torch.float32
    return getattr(torch, saved) if isinstance(saved, str) else saved


def draining_server(config):
    """A uvicorn server whose first Ctrl-C says how many requests it lets finish (uvicorn waits for
    them silently) and whose second stops at once, without the traceback of a re-raised interrupt."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True
                logging.getLogger("uvicorn.error").disabled = True  # the cancelled streams' tracebacks
                sys.stderr.write("stopping now\n")
                return
            self.should_exit = True
            open_requests = len(self.server_state.tasks)
            if sig == signal.SIGINT:
                self.interrupted = True
            if open_requests:
                sys.stderr.write(f"draining {open_requests} open request(s) and streams; Ctrl-C again to stop now\n")
            sys.stderr.flush()

    server = DrainingServer(config)
    server.interrupted = False
    return server


def run(served: ServedModel, sock: socket.socket) -> bool:
    """Serve on `sock` (see `addresses.listening_socket`) until interrupted, then stop batching and remove the plan.
    True if it was Ctrl-C that stopped it."""
    import uvicorn

    server = draining_server(uvicorn.Config(served.app, log_level="warning"))
    try:
        server.run(sockets=[sock])
    finally:
        served.manager.stop(block=True, hard_stop=True, timeout=10)
        served.runtime.remove()
    return server.interrupted

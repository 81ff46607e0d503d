"""Small builders shared by tests."""

from __future__ import annotations

import contextlib
import json
import random
import time

import numpy as np

import duocal_runtime as dr


def random_profile(layers=4, kv_heads=2, heads=4, head_dim=8, seed=0, ties=False) -> dr.Profile:
    rng = random.Random(seed)
    pick = (lambda: rng.choice([0.0, 0.5, 1.0])) if ties else rng.random
    scores = [[pick() for _ in range(kv_heads)] for _ in range(layers)]
    shape = dr.ModelShape(layers, heads, kv_heads, head_dim)
    return dr.Profile(dr.ModelInfo(shape, "test/model", None, "LlamaForCausalLM"), scores, {"kind": "test"})


def pool_is_whole(served, seconds=20) -> bool:
    """Every page of a served model's pool is free again (polled for `seconds`)."""
    cache, deadline = served.manager.cache, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        if cache.free_sectors() == cache.num_sectors:
            return True
        time.sleep(0.05)
    return False


@contextlib.contextmanager
def served_over_http(settings, log_level="warning", host="127.0.0.1"):
    """`prepare_server(settings)` listening on a free port of `host` from a thread of this process (so a
    test sees the pool): yields (served, pool summary, base URL); stopped within 30 s whatever happens."""
    import threading

    import uvicorn

    from duocal.serving.startup import listening_socket, prepare_server, server_url

    served, summary = prepare_server(settings)
    sock = listening_socket(host, 0)
    app = uvicorn.Server(uvicorn.Config(served.app, log_level=log_level))
    thread = threading.Thread(target=app.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.perf_counter() + 30
    while not app.started and time.perf_counter() < deadline:
        time.sleep(0.05)
    try:
        yield served, summary, server_url(host, sock.getsockname()[1])
    finally:
        app.should_exit = True
        thread.join(timeout=30)
        served.manager.stop(block=True, hard_stop=True, timeout=10)
        served.runtime.remove()


def write_pattern(folder, gates, model_name="models/Mistral-7B-Instruct-v0.2"):
    """An upstream DuoAttention pattern folder: `full_attention_heads.tsv` of `gates` and its `config.json`."""
    folder.mkdir(parents=True, exist_ok=True)
    np.savetxt(folder / "full_attention_heads.tsv", np.array(gates), delimiter="\t")  # upstream: %.18e, tabs
    (folder / "config.json").write_text(
        json.dumps(
            {
                "model_name": model_name,
                "sink_size": 128,
                "recent_size": 256,
                "lr": 0.02,
                "reg_weight": 0.05,
                "exp_name": "x",
            }
        )
    )
    return folder

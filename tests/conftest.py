"""The suite's fixtures, one owner each (shared builders and clients: tests/helpers/)."""

import os
from pathlib import Path

import pytest

from helpers.paths import UPSTREAM_PATTERNS
from helpers.worker_groups import slow_groups_first, worker_groups

os.environ.setdefault("OMP_NUM_THREADS", "1")

SMOLLM2 = "smollm2-135m-instruct"  # the real model of the suite, fetched once into the duocal cache
MAX_REQUEST_SIZE = 64 * 1024  # the demo server's body limit (test_serve_reliability.py sends bodies over it)


# pytest-xdist (`make test` runs `-n auto --dist loadgroup --no-loadscope-reorder`): a test module runs whole on one
# worker, so its module-scoped fixtures are built once, and the modules that use a session server run on one worker,
# so the server starts once. A test's own xdist_group mark wins (test_real_model.py spreads its longest tests that
# way). Those groups are sent first, then the groups that hold a slow test: the longest work must not start last.
SESSION_SERVERS = ("demo_server", "smollm2_server")


def pytest_collection_modifyitems(config, items):
    if not config.pluginmanager.hasplugin("xdist"):  # .venv-vllm runs tests/vllm without it
        return
    servers_of: dict[str, set[str]] = {}
    for item in items:
        servers_of.setdefault(module_of(item), set()).update(s for s in SESSION_SERVERS if s in item.fixturenames)
    groups = worker_groups(servers_of)
    own = [item.get_closest_marker("xdist_group") is not None for item in items]
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(groups[module_of(item)]))
    if getattr(config.option, "loadgroup", False):  # what xdist sets on its workers, which collect
        group = [item.get_closest_marker("xdist_group").args[0] for item in items]
        slow = [item.get_closest_marker("slow") is not None for item in items]
        items[:] = [items[i] for i in slow_groups_first(group, slow, own)]


def module_of(item) -> str:
    return item.nodeid.split("::")[0]


def _torch_threads():
    import torch

    torch.set_num_threads(1)


_torch_threads()


@pytest.fixture
def upstream_patterns() -> Path:
    return UPSTREAM_PATTERNS


@pytest.fixture
def tiny_llama():
    """A random 2-layer Llama in memory (helpers.models.tiny_model("llama")), a fresh one per test: tests apply
    plans and runtimes to it."""
    from helpers.models import tiny_model

    return tiny_model("llama")


@pytest.fixture(scope="module")
def four_layers():
    """A random Llama of 4 layers x 2 KV heads in float64 (exact gradients), shared by a module's tests."""
    import torch

    from helpers.models import tiny_model

    return tiny_model(dtype=torch.float64, layers=4)


@pytest.fixture(scope="session")
def tiny_llama_folder(tmp_path_factory) -> Path:
    """A random 2-layer Llama with the demo tokenizer, saved to a folder (helpers.models.save_tiny_model)."""
    from helpers.models import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny-llama") / "model")


@pytest.fixture(scope="module")
def demo_model():
    """The bundled demo model (eval mode) and its tokenizer, loaded as the CLI loads them, one per test module."""
    from duocal.models import ModelRef

    ref = ModelRef.resolve(None)
    return ref.load_model(), ref.load_tokenizer()


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """SmolLM2-135M-Instruct's tokenizer (the model fetched once by name)."""
    from duocal.models import fetch_model, load_tokenizer

    return load_tokenizer(fetch_model(SMOLLM2))


@pytest.fixture(scope="session")
def demo_server():
    """`duocal serve` of the demo model and its shipped profile in this process (so a test sees the pool):
    (ServedModel, base URL), one for the whole suite: tests read counters as differences and wait for the
    pool to be whole. 128 pages of 16 tokens at sparsity 0.5, a 64 kB body limit."""
    from helpers.serving import running_server

    with running_server(max_request_size=MAX_REQUEST_SIZE) as running:
        yield running


@pytest.fixture(scope="session")
def smollm2_server():
    """`duocal serve` of SmolLM2-135M-Instruct (it has a chat template, so the chat routes generate) and its
    shipped profile, in this process: (ServedModel, base URL), one for the whole suite."""
    from helpers.serving import running_server

    with running_server(model=SMOLLM2) as running:
        yield running

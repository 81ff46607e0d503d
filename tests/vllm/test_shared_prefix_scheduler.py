"""duocal's scheduler rule (vllm_plugin/shared_prefix_scheduler.py), no engine: which waiting request waits for a
running one's prefill. With an engine, questions about one document sent together: test_prefix_caching.py."""

import random
from types import SimpleNamespace

from duocal_vllm.shared_prefix_scheduler import prefix_in_prefill, shared_blocks

BLOCK = 64


def chained(tokens: list[int]) -> list[tuple]:
    """Block hashes as vLLM chains them: each names every token up to its block's end."""
    return [tuple(tokens[: (i + 1) * BLOCK]) for i in range(len(tokens) // BLOCK)]


def test_shared_blocks_is_the_count_of_equal_leading_hashes():
    rng = random.Random(0)
    for _ in range(500):
        common = [rng.randrange(5) for _ in range(rng.randrange(0, 6 * BLOCK))]
        first = chained(common + [7] * rng.randrange(0, 4 * BLOCK))
        second = chained(common + [8] * rng.randrange(0, 4 * BLOCK))
        brute = next(
            (i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b), min(len(first), len(second))
        )
        assert shared_blocks(first, second) == brute


def request(tokens: list[int], computed: int = 0) -> SimpleNamespace:
    return SimpleNamespace(block_hashes=chained(tokens), num_computed_tokens=computed, num_prompt_tokens=len(tokens))


DOCUMENT = list(range(4000))


def test_a_question_waits_while_its_document_is_prefilled_by_a_running_request():
    question = request(DOCUMENT + [1] * 200)
    assert prefix_in_prefill(question, [request(DOCUMENT + [2] * 200, computed=512)], BLOCK)
    assert prefix_in_prefill(question, [request(DOCUMENT + [2] * 200, computed=3967)], BLOCK)  # 62 blocks shared: 3968


def test_it_goes_once_the_shared_blocks_are_computed_or_when_nothing_is_shared():
    question = request(DOCUMENT + [1] * 200)
    assert not prefix_in_prefill(question, [request(DOCUMENT + [2] * 200, computed=3968)], BLOCK)
    assert not prefix_in_prefill(question, [request([5] * 4200, computed=512)], BLOCK)  # another document
    assert not prefix_in_prefill(question, [request(DOCUMENT[:30] + [2] * 500, computed=0)], BLOCK)  # < a block
    decoding = request(DOCUMENT + [2] * 200, computed=4200)
    assert not prefix_in_prefill(question, [decoding], BLOCK)
    assert not prefix_in_prefill(request(DOCUMENT, computed=64), [request(DOCUMENT, computed=512)], BLOCK)
    assert not prefix_in_prefill(question, [], BLOCK)

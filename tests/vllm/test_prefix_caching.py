"""Prefix caching with a duocal plan (offline engines of conftest.py): an all-full plan reuses cached prefixes as
stock vLLM does; a plan with streaming heads (the shipped profile at 0.5, blocks of 64, sink 64 + recent 512) reuses
them too, each hit carrying the request's own sink blocks, with the tokens of the same prompts computed in full;
questions about one document sent at once compute it once (duocal's scheduler).
Off: the stock and small-window engines (test_duo_llama.py). The server's counters: test_serve_vllm.py; the lookup
and block accounting without an engine: test_sink_window_hits.py; every family: test_families.py."""


def test_an_all_full_plan_reuses_cached_prefixes(offline, reference):
    run = offline["all_full"]
    long_prompt = reference["cases"][2]["prompt_ids"]
    assert run.tokens is not None, run.log[-3000:]
    assert run.tokens[-1] == run.tokens[2]  # the long prompt, again
    assert run.cached[:-1] == [0] * len(reference["cases"])
    assert run.cached[-1] >= len(long_prompt) // 128 * 128 - 128 > 0


def test_a_plan_with_streaming_heads_reuses_cached_prefixes_with_the_same_tokens(offline, reference):
    run, cases = offline["shipped_05_cached"], reference["cases"]
    assert run.tokens is not None, run.log[-3000:]
    assert run.tokens[: len(cases)] == [case["duo"] for case in cases]  # duocal's runtime, no hit
    assert run.cached == [0] * len(cases) + [960, 640]  # 993 - 1 and 700 tokens, in whole blocks of 64
    assert run.tokens[len(cases)] == cases[2]["duo"]  # the long prompt from the cache: as computed in full
    alone = offline["shipped_05_uncached"]
    assert alone.tokens is not None and run.tokens[-1] == alone.tokens[0]


def test_questions_about_one_document_sent_together_compute_it_once_with_the_same_tokens(offline):
    """Under duocal serve's chunk cap (512 of a 2,048-token step) the four would each prefill the document, one
    chunk behind the other; duocal's scheduler lets the three wait for the first, which they then read."""
    run, alone = offline["shipped_05_together"], offline["shipped_05_uncached"]
    assert run.tokens is not None, run.log[-3000:]
    assert run.cached == [0, 640, 640, 640]
    assert run.tokens == alone.tokens

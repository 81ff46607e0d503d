"""Prefix caching with a duocal plan: on with an all-full plan (an offline engine of conftest.py), a repeated
prompt reuses its cached prefix as stock vLLM does, with the same tokens. Off: the stock and small-window engines
(test_duo_llama.py). On with streaming heads (the shipped profile at 0.5): test_serve_vllm.py's server, where no
prompt reuses a cached prefix and one log line says why."""

from duocal_vllm.sink_window_spec import PREFIX_CACHING_OFF


def test_an_all_full_plan_reuses_cached_prefixes(offline, reference):
    run = offline["all_full"]
    long_prompt = reference["cases"][2]["prompt_ids"]
    assert run.tokens is not None, run.log[-3000:]
    assert run.tokens[-1] == run.tokens[2]  # the long prompt, again
    assert run.cached[:-1] == [0] * len(reference["cases"])
    assert run.cached[-1] >= len(long_prompt) // 128 * 128 - 128 > 0
    assert PREFIX_CACHING_OFF not in run.log

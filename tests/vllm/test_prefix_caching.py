"""`--enable-prefix-caching` with a duocal plan: no crash, the same tokens. With streaming heads no prompt
reuses a cached prefix and one log line says why; an all-full plan caches prefixes as stock vLLM does.
(Prefix caching off: every other test in this folder.)"""

from duocal_vllm.sink_window_spec import PREFIX_CACHING_OFF

from conftest import duo_overrides, run_vllm_result


def test_with_streaming_heads_prefix_caching_is_off_in_effect_and_says_why(model_folder, reference):
    long_case = reference["cases"][2]
    prompts = [long_case["prompt_ids"]] * 2 + [reference["cases"][3]["prompt_ids"]]
    result, log = run_vllm_result(
        model_folder, prompts, duo_overrides(duocal_sparsity=reference["sparsity"]), enable_prefix_caching=True
    )
    assert result is not None, log[-3000:]
    assert result["tokens"] == [long_case["duo"], long_case["duo"], reference["cases"][3]["duo"]]
    assert result["cached"] == [0, 0, 0]
    assert log.count(PREFIX_CACHING_OFF) == 1


def test_an_all_full_plan_reuses_cached_prefixes(model_folder, reference):
    long_case = reference["cases"][2]
    result, log = run_vllm_result(
        model_folder, [long_case["prompt_ids"]] * 2, duo_overrides(duocal_sparsity=0), enable_prefix_caching=True
    )
    assert result is not None, log[-3000:]
    first, again = result["tokens"]
    assert first == again
    assert result["cached"][0] == 0 and result["cached"][1] >= len(long_case["prompt_ids"]) // 128 * 128 - 128 > 0
    assert PREFIX_CACHING_OFF not in log

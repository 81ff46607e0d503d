"""The curve's measurements are what they claim: the answer loss through duocal's cache is the model's own
teacher-forced loss (full attention), exact match is whether greedy decoding gives the answer, the free
answer of a passkey prompt does not disturb the loss (and is decoded only where the expected answer is not
greedy's), a window that holds the whole prompt is full attention, and the prefix the plans share changes
no figure."""

import dataclasses
import functools

import pytest
import torch

import duocal_runtime as dr
from duocal.demo.tokenizer import build_tokenizer
from duocal.tuning import tune_curve
from duocal.tuning.tune_curve import AnsweredPrompt, TuneWork, answer_scores, measure_curve, point, shared_prefixes

from helpers.profiles import random_profile

PROMPT = list(range(5, 45))
ANSWER = [7, 9, 11, 13]


def scores(model, plan, item, work=None, prefix=None, known=None):
    with dr.apply(model, plan) as runtime:
        return answer_scores(model, runtime.new_cache(), item, work or TuneWork(prompts=(item,)), prefix, known)


def full_plan(model):
    return dr.uniform_plan(dr.shape_of_config(model.config), dr.Full())


def test_the_answer_loss_is_the_models_own_teacher_forced_loss(tiny_llama):
    item = AnsweredPrompt(PROMPT, ANSWER)
    loss, _, _ = scores(tiny_llama, full_plan(tiny_llama), item)
    with torch.no_grad():
        logits = tiny_llama(input_ids=torch.tensor([PROMPT + ANSWER])).logits[0]
    expected = torch.nn.functional.cross_entropy(logits[len(PROMPT) - 1 : -1], torch.tensor(ANSWER))
    assert loss == pytest.approx(float(expected), abs=1e-5)


def test_exact_match_is_whether_greedy_decoding_gives_the_answer(tiny_llama):
    with torch.no_grad():
        out = tiny_llama.generate(input_ids=torch.tensor([PROMPT]), max_new_tokens=4, do_sample=False)
    own = out[0, len(PROMPT) :].tolist()
    assert scores(tiny_llama, full_plan(tiny_llama), AnsweredPrompt(PROMPT, own))[1] is True
    wrong = [*own[:-1], (own[-1] + 1) % tiny_llama.config.vocab_size]
    assert scores(tiny_llama, full_plan(tiny_llama), AnsweredPrompt(PROMPT, wrong))[1] is False


def test_a_passkey_prompts_free_answer_leaves_its_loss_alone(tiny_llama):
    plan = dr.plan(random_profile_for(tiny_llama), sparsity=0.5)
    tokenizer = build_tokenizer()
    work = TuneWork(decode=functools.partial(tokenizer.decode, skip_special_tokens=True))
    plain, _, _ = scores(tiny_llama, plan, AnsweredPrompt(PROMPT, ANSWER))
    keyed, right, _ = scores(tiny_llama, plan, AnsweredPrompt(PROMPT, ANSWER, key=12345), work)
    assert keyed == pytest.approx(plain, abs=1e-6) and right is False  # random weights never say 12345


def random_profile_for(model, sink=2, recent=4):
    shape = dr.shape_of_config(model.config)
    profile = random_profile(
        shape.num_hidden_layers, shape.num_key_value_heads, shape.num_attention_heads, shape.head_dim
    )
    return profile.with_deploy(dr.SinkWindow(sink=sink, recent=recent))


def test_the_curve_is_flat_when_the_sink_window_holds_the_prompt_and_falls_in_kv_bytes(tiny_llama):
    items = (AnsweredPrompt(PROMPT, ANSWER), AnsweredPrompt(PROMPT[:30], ANSWER[:2]))
    wide = random_profile_for(tiny_llama, sink=4, recent=200)
    points = measure_curve(tiny_llama, wide, TuneWork(prompts=items), (0.5, 0.25, 1.0), 512, lambda *a: None)
    assert [p.sparsity for p in points] == [0.0, 0.25, 0.5, 1.0]
    assert len({round(p.loss, 6) for p in points}) == 1 and len({p.exact for p in points}) == 1
    assert [p.lost for p in points] == [0, 0, 0, 0]
    assert [p.kv_bytes for p in points] == sorted((p.kv_bytes for p in points), reverse=True)
    assert points[0].fraction_of_full == 1.0 and points[-1].fraction_of_full == pytest.approx(204 / 512)
    narrow = measure_curve(
        tiny_llama, random_profile_for(tiny_llama), TuneWork(prompts=items), (1.0,), 512, lambda *a: None
    )
    assert narrow[1].loss != pytest.approx(narrow[0].loss)


def test_a_passkey_answer_that_greedy_decoding_gives_is_not_decoded_again(tiny_llama, monkeypatch):
    with torch.no_grad():
        out = tiny_llama.generate(input_ids=torch.tensor([PROMPT]), max_new_tokens=4, do_sample=False)
    own = out[0, len(PROMPT) :].tolist()
    monkeypatch.setattr(tune_curve, "greedy", lambda *a: pytest.fail("decoded an answer greedy decoding gives"))
    assert scores(tiny_llama, full_plan(tiny_llama), AnsweredPrompt(PROMPT, own, key=1), TuneWork())[1] is True


def test_a_plan_that_gives_full_attentions_right_answer_is_right_without_decoding(tiny_llama, monkeypatch):
    """Where the expected answer is not greedy's, full attention's right free answer is checked in one pass; only
    a plan that would not say it token for token decodes its own."""
    with torch.no_grad():
        out = tiny_llama.generate(input_ids=torch.tensor([PROMPT]), max_new_tokens=4, do_sample=False)
    own = tuple(out[0, len(PROMPT) :].tolist())
    wrong = (*own[:-1], (own[-1] + 1) % tiny_llama.config.vocab_size)
    item, plan = AnsweredPrompt(PROMPT, list(wrong), key=1), full_plan(tiny_llama)
    monkeypatch.setattr(tune_curve, "greedy", lambda *a: pytest.fail("decoded an answer full attention gave"))
    assert scores(tiny_llama, plan, item, TuneWork(), known=own)[1:] == (True, own)
    decoded = []
    monkeypatch.setattr(tune_curve, "greedy", lambda *a: decoded.append(a) or own)
    work = TuneWork(decode=lambda ids: "no key here")
    assert scores(tiny_llama, plan, item, work, known=wrong)[1:] == (False, None) and len(decoded) == 1


def test_later_plans_check_full_attentions_right_answers_in_one_pass_unless_chunks_change_them(tiny_llama, monkeypatch):
    """Full attention's point keeps its right free answers; a later plan gives them without decoding, except a plan
    whose heads evict after each pass (H2O: a chunk keeps tokens step-by-step decoding evicts), which decodes."""
    with torch.no_grad():
        out = tiny_llama.generate(input_ids=torch.tensor([PROMPT]), max_new_tokens=4, do_sample=False)
    own = tuple(out[0, len(PROMPT) :].tolist())
    wrong = [*own[:-1], (own[-1] + 1) % tiny_llama.config.vocab_size]
    work = TuneWork(prompts=(AnsweredPrompt(PROMPT, wrong, key=1),), decode=lambda ids: "The pass key is 1.")
    monkeypatch.setattr(tune_curve, "greedy", lambda *a: own)  # as the model decodes (NEW_TOKENS is 16)
    full = point(tiny_llama, 0.0, full_plan(tiny_llama), work, 512, lambda: None, [None])
    assert full.answered == (True,) and full.right_answers == (own,)
    monkeypatch.setattr(tune_curve, "greedy", lambda *a: pytest.fail("decoded an answer full attention gave"))
    again = point(tiny_llama, 0.0, full_plan(tiny_llama), work, 512, lambda: None, [None], full=full)
    assert again.answered == (True,) and again.lost == 0
    decoded, passes = [], []
    monkeypatch.setattr(tune_curve, "greedy", lambda *a: decoded.append(a) or own)
    one_pass = tune_curve.teacher_forced
    monkeypatch.setattr(tune_curve, "teacher_forced", lambda *a: passes.append(a[3]) or one_pass(*a))
    h2o = dr.uniform_plan(dr.shape_of_config(tiny_llama.config), dr.H2O(heavy=8, recent=8))
    point(tiny_llama, 1.0, h2o, work, 512, lambda: None, [None], full=full)
    assert passes == [wrong] and len(decoded) == 1  # the expected answer's pass (the loss), never full's answer


def test_the_shared_prefix_changes_no_figure_of_the_curve(tiny_llama):
    items = (AnsweredPrompt(PROMPT, ANSWER), AnsweredPrompt(PROMPT[:30], ANSWER[:2]))
    work, profile = TuneWork(prompts=items), random_profile_for(tiny_llama, sink=2, recent=10)
    plans = [dr.plan(profile, sparsity=s) for s in (0.0, 0.5, 1.0)]
    prefixes = shared_prefixes(tiny_llama, items, plans)
    assert [p[0][0].shape[2] for p in prefixes] == [12, 12]  # sink + recent of the bounded heads
    for plan in plans:
        shared = point(tiny_llama, plan.sparsity, plan, work, 512, lambda: None, prefixes)
        alone = point(tiny_llama, plan.sparsity, plan, work, 512, lambda: None, [None, None])
        assert shared.loss == pytest.approx(alone.loss, abs=1e-5) and shared.exact == alone.exact


def test_lost_answers_are_counted_prompt_by_prompt_against_full_attentions(tiny_llama):
    with torch.no_grad():
        out = tiny_llama.generate(input_ids=torch.tensor([PROMPT]), max_new_tokens=4, do_sample=False)
    own = out[0, len(PROMPT) :].tolist()
    wrong = [*own[:-1], (own[-1] + 1) % tiny_llama.config.vocab_size]
    work = TuneWork(prompts=(AnsweredPrompt(PROMPT, own), AnsweredPrompt(PROMPT, wrong)))
    plan = full_plan(tiny_llama)
    measured = point(tiny_llama, 0.0, plan, work, 512, lambda: None, [None, None])
    assert measured.answered == (True, False) and measured.exact == 1 and measured.lost == 0
    swapped = dataclasses.replace(measured, answered=(False, True))  # the same count, the other prompt right
    against = point(tiny_llama, 0.0, plan, work, 512, lambda: None, [None, None], full=swapped)
    assert against.exact == swapped.exact == 1 and against.lost == 1

"""Quality and KV memory per sparsity on the tuning data: the curve `duocal tune` chooses on.

Every sparsity's plan is the profile's own (`dr.plan(profile, sparsity=s)`: its policy and sizes, what
`duocal serve` deploys) and runs through duocal's per-head cache. Chat data: each prompt is prefilled
through a fresh cache but its last token, then that token and the expected answer's tokens go in one
chunk; the loss is their mean cross-entropy, and the greedy answer is the expected one exactly when
every answer token is the most likely token after those before it (so exact match of greedy
decoding, for the answer's length, comes from the same pass). Passkey prompts are answered freely
too (a copy of the prefilled cache decodes greedily): right when the answer is exact and clean as
`eval passkey --format chat` scores it (its first span shaped like the key, a number, a word pair or a UUID,
is the key, no phrase repeated before it), however the model words it, in up to 4 tokens more than the
expected answer. A free answer is decoded only where neither the expected one nor full attention's own right
answer to that prompt is the greedy one (one pass each, as the loss): the expected answer ("The pass key is
K.", or " K." after the plain cue) is itself exact and clean, and greedy decoding would give it; a plan
that gives full attention's right answer token for token is right as it is. Both checks hold where a chunk
changes nothing (full and sink-window heads); a plan with heads that evict after each pass (H2O, SnapKV)
decodes every free answer.
Text: perplexity over text windows (eval/perplexity.py); its loss is log(ppl).
KV memory: the plan's bytes at `context` tokens, batch 1, in the model's dtype.

Shared prefix: while every head of every plan still attends to all tokens before it (the plans'
`full_attention_prefix`, sink + recent for sink-window heads), every plan computes a prompt's first
tokens as full attention does. They run once, without duocal, and each plan's cache starts from their
keys and values (`DuoCache.load_prefix`): for 1.5k-token prompts and sink 64 + recent 512, a third of
the prefill work of each plan. Their keys and values stay in memory for the whole run (16 prompts of
576 tokens: 27 MB each for SmolLM2-135M in fp32, 74 MB for an 8B Llama in bf16).
"""

from __future__ import annotations

import copy
import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

import duocal_runtime as dr
from duocal.data.chat_prompts import check_chat_template
from duocal.data.prompt_kinds import needs_template, prompt_mix
from duocal.measure.chat_answer import NEW_TOKENS, ChatAnswer
from duocal.measure.decoding import greedy
from duocal.measure.limits import Progress, refuse_beyond_positions
from duocal.measure.text_windows import TEXT_CHUNK, plan_ppl, text_windows
from duocal_runtime.hf.cache import full_attention_kv

from .tune_data import SHORT_ANSWER_TOKENS, Conversation, TuneData, split_sets
from .tune_prompts import CONFIRM_LENGTHS, AnsweredPrompt, answered_prompts, confirming_seed
from .tune_rule import CurvePoint


@dataclass(frozen=True)
class TuneWork:
    """The tokenized data: answered prompts (chat, passkey) or text windows (text)."""

    prompts: tuple[AnsweredPrompt, ...] = ()
    text_windows: tuple[torch.Tensor, ...] = ()
    scored: int = 0  # text: tokens scored at the end of each text window
    decode: Callable[[list[int]], str] | None = None  # passkey prompts: the free answer's text

    @property
    def items(self) -> int:
        return len(self.prompts) or len(self.text_windows)


def tokenized(
    data: TuneData, tokenizer, model_config, samples: int, context: int, confirm_samples: int
) -> tuple[TuneWork, TuneWork]:
    """`data` as token ids in two sets, the measuring set and the confirming set (tune_data.py), refused (before
    the weights load) when it does not fit the model or is too small to split."""
    if data.kind == "text":
        taken = text_windows(tokenizer, data.text, context, samples + confirm_samples)
        refuse_beyond_positions([context], model_config, "give a smaller --context")
        sets = split_sets(tuple(taken), "text", data.name)
        return tuple(TuneWork(text_windows=text_windows_of_set, scored=context // 2) for text_windows_of_set in sets)
    if data.kind == "passkey":
        mix = prompt_mix(data.values, data.framings, data.haystacks)
        if needs_template(mix):
            check_chat_template(tokenizer, "give --framing plain, or --data")
        sets = (
            answered_prompts(tokenizer, samples, context, data.seed, mix),
            answered_prompts(tokenizer, confirm_samples, context, confirming_seed(data.seed), mix, CONFIRM_LENGTHS),
        )
    else:
        halves = split_sets(data.conversations, "chat", data.name)
        check_chat_template(tokenizer, "give a .txt file as --data (perplexity)")
        sets = tuple(chat_rows(half, tokenizer) for half in halves)
    longest = max(len(p.prompt) + answer_room(p) for prompts in sets for p in prompts)
    refuse_beyond_positions([longest], model_config, "give shorter conversations or a smaller --context")
    decode = functools.partial(tokenizer.decode, skip_special_tokens=True)
    return tuple(TuneWork(prompts=tuple(prompts), decode=decode) for prompts in sets)


def answer_room(item: AnsweredPrompt) -> int:
    """Tokens a prompt's answer may take: the expected one, or a free answer a little longer than it."""
    return max(len(item.answer) + 4, NEW_TOKENS)


def chat_rows(conversations: tuple[Conversation, ...], tokenizer) -> list[AnsweredPrompt]:
    out = []
    for c in conversations:
        encoded = tokenizer.apply_chat_template(list(c.messages), add_generation_prompt=True, return_dict=True)
        answer = list(tokenizer(c.answer, add_special_tokens=False)["input_ids"])
        out.append(AnsweredPrompt(list(encoded["input_ids"]), answer))
    return out


KV = list[tuple[torch.Tensor, torch.Tensor]]  # keys and values per layer (full_attention_kv)
SHARED_PREFIXES = "the prompts' first tokens, shared by every sparsity"


def shared_prefixes(
    model, prompts: tuple[AnsweredPrompt, ...], plans: list[dr.Plan], tick: Callable[[], None] = lambda: None
) -> list[KV | None]:
    """Each prompt's first tokens that every plan computes as full attention does, run once without duocal."""
    shared = min(p.full_attention_prefix for p in plans)
    device = next(model.parameters()).device
    out: list[KV | None] = []
    for item in prompts:
        length = min(shared, len(item.prompt) - 1)  # the prompt's last token goes with the answer
        out.append(full_attention_kv(model, torch.tensor([item.prompt[:length]], device=device)) if length else None)
        tick()
    return out


@torch.no_grad()
def answer_scores(
    model,
    cache,
    item: AnsweredPrompt,
    work: TuneWork,
    prefix: KV | None,
    known: tuple[int, ...] | None = None,
    one_pass_is_greedy: bool = True,
) -> tuple[float, bool, tuple[int, ...] | None]:
    """(mean nats per answer token, whether the greedy answer is right, the free answer where it was decoded or
    confirmed and is right) through a fresh `cache`, started from `prefix` (keys and values of the prompt's
    first tokens) where one is given; `known`: a right free answer to this prompt (full attention's), checked
    in one pass before any decoding. `one_pass_is_greedy` False (a plan whose heads evict after each pass, as
    H2O does, where a chunk keeps tokens that step-by-step decoding would have evicted): a passkey prompt's
    free answer is always decoded."""
    device = next(model.parameters()).device
    start = 0
    if prefix is not None:
        cache.load_prefix(prefix)
        start = prefix[0][0].shape[2]
    if start < len(item.prompt) - 1:
        model(input_ids=torch.tensor([item.prompt[start:-1]], device=device), cache=cache, logits_to_keep=1)
    free = copy.deepcopy(cache) if item.key is not None else None  # the free answer continues from here
    loss, expected_is_greedy = teacher_forced(model, cache, item.prompt[-1], item.answer)
    if free is None or (expected_is_greedy and one_pass_is_greedy):  # "The pass key is K." is exact and clean
        return loss, expected_is_greedy, None
    if (
        known is not None
        and one_pass_is_greedy
        and teacher_forced(model, copy.deepcopy(free), item.prompt[-1], known)[1]
    ):
        return loss, True, known  # greedy decoding would say full attention's right answer
    said = greedy(model, item.prompt, free, answer_room(item))
    answered = ChatAnswer("tune", item.key, work.decode(list(said)).strip())
    right = answered.right
    return loss, right, said if right else None


def teacher_forced(model, cache, last_prompt_token: int, answer) -> tuple[float, bool]:
    """(mean nats per token of `answer` after the prompt on `cache`, whether greedy decoding gives it): the
    prompt's last token and the answer in one chunk; greedy gives it when each of its tokens is the most likely
    after those before it."""
    device = next(model.parameters()).device
    expected = torch.tensor(list(answer), device=device)
    fed = torch.tensor([[last_prompt_token, *answer]], device=device)
    predictions = model(input_ids=fed, cache=cache).logits[0, :-1].float()  # [A, V]: each answer token's
    loss = float(torch.nn.functional.cross_entropy(predictions, expected))
    return loss, bool((predictions.argmax(-1) == expected).all())


def point(
    model,
    sparsity: float,
    plan: dr.Plan,
    work: TuneWork,
    context: int,
    tick: Callable[[], None],
    prefixes: list,
    full: CurvePoint | None = None,
) -> CurvePoint:
    """`sparsity`'s quality on `work` through its `plan`, and the plan's KV bytes at `context` (`prefixes`: the
    prompts' shared prefixes, `shared_prefixes`); `lost` counts the prompts `full` (full attention's point on
    the same work; None: this is it) answers right and this plan does not."""
    started = time.perf_counter()
    dtype = next(model.parameters()).dtype
    full_bytes = dr.uniform_plan(plan.shape, dr.Full()).kv_bytes(context, 1, dtype)
    kv_bytes = plan.kv_bytes(context, 1, dtype)
    if work.text_windows:
        ppl = plan_ppl(model, plan, work.text_windows, work.scored, TEXT_CHUNK, tick)
        loss, exact, answered = math.log(ppl), None, None
        right_answers = None
    else:
        scores = []
        known = full.right_answers if full is not None and full.right_answers else (None,) * len(work.prompts)
        one_pass = not plan.chunking_changes_result
        with dr.apply(model, plan) as runtime:
            for item, prefix, answer in zip(work.prompts, prefixes, known, strict=True):
                scores.append(answer_scores(model, runtime.new_cache(), item, work, prefix, answer, one_pass))
                tick()
        loss = sum(s[0] for s in scores) / len(scores)
        short = all(len(p.answer) <= SHORT_ANSWER_TOKENS or p.key is not None for p in work.prompts)
        answered = tuple(s[1] for s in scores) if short else None
        exact = sum(answered) if short else None
        right_answers = tuple(s[2] for s in scores)
    seconds = round(time.perf_counter() - started, 2)
    lost = None if answered is None else lost_answers(full.answered if full else answered, answered)
    fraction = kv_bytes / full_bytes
    return CurvePoint(sparsity, kv_bytes, fraction, loss, exact, work.items, seconds, lost, answered, right_answers)


def lost_answers(full_attention: tuple[bool, ...], answered: tuple[bool, ...]) -> int:
    """Prompts full attention answers right and `answered` does not (one prompt at a time)."""
    return sum(f and not a for f, a in zip(full_attention, answered, strict=True))


def measure_curve(
    model,
    profile: dr.Profile,
    work: TuneWork,
    sparsities: tuple[float, ...],
    context: int,
    progress: Progress,
    label: str = "",
) -> list[CurvePoint]:
    """Full attention (sparsity 0) and every sparsity of `sparsities`, on the same prompts or text windows
    (`label`: which set, in the progress line)."""
    model.eval()
    wanted = sorted({0.0, *sparsities})
    plans = [dr.plan(profile, sparsity=s) for s in wanted]
    total, done = (len(wanted) + bool(work.prompts)) * work.items, 0  # prompts: their shared prefixes first
    points = []

    def tick(what: str) -> None:
        nonlocal done
        done += 1
        progress(done, total, what)

    shared = f"{label}{SHARED_PREFIXES}"
    if work.prompts:
        progress(done, total, shared)
    prefixes = shared_prefixes(model, work.prompts, plans, functools.partial(tick, shared))

    for sparsity, plan in zip(wanted, plans, strict=True):
        what = label + ("full attention" if sparsity == 0 else f"sparsity {sparsity:g}")
        progress(done, total, what)
        tick_this = functools.partial(tick, what)
        full = points[0] if points else None  # sparsity 0 comes first
        points.append(point(model, sparsity, plan, work, context, tick_this, prefixes, full))
        if hasattr(progress, "row"):
            progress.row(point_line(points[-1]))
    return points


def point_line(p: CurvePoint) -> str:
    exact = f", exact {p.exact}/{p.total}, lost {p.lost}" if p.exact is not None else ""
    return f"sparsity {p.sparsity:g}: loss {p.loss:.4f}{exact}, KV {p.fraction_of_full:.0%} of full ({p.seconds:.0f} s)"

"""Chat prompts with a pass key, answered freely and greedily through a plan: `eval passkey --format chat`.

Why: README's quick-start chat prompt got garbled answers ("The pass key is the pass key is
71432") from SmolLM2's shipped profile at 50%, which the raw-text passkey score did not see. An
answer is `exact` when its first number is the key and `clean` when no phrase of three words comes
twice before that first number (a garbled answer repeats itself). Batched with left padding.

Two fixed prompts stay here for the regression test (tests/test_real_model.py), each over `KEYS`:
`readme` (README's own prompt) and `licence` (the key as a sentence inside the GPL-3.0 text).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources

import duocal_runtime as dr
from duocal.data.chat_prompts import (
    ChatPrompt,
    chat_ids,
    chat_prompts,
    check_chat_template,
    document,
    haystack_sentences,
)
from duocal.data.padding import pad_batch, pad_token_id
from duocal.measure.chat_answer import NEW_TOKENS, ChatAnswer

KEYS = (71432, 71433, 71434, 71435, 28519, 60387, 93146, 45270)
README_SENTENCES = 125  # README's filler: 25 repeats of the five sentences on each side of the key
BATCH = 8  # prompts per generate(): their attention scores stay small (8 × 9 heads × 1.3k² floats)
LICENCE_SPLIT = (3000, 5600)  # characters of the GPL-3.0 text before and after the key


def readme_prompt(key: int) -> str:
    """README's quick-start prompt (its key and both filler runs), question after the document."""
    _, pool = haystack_sentences("repeated")
    filler = [pool[i % len(pool)] for i in range(README_SENTENCES)]
    return document(filler, filler, key)


def licence_prompt(key: int) -> str:
    """The key as a sentence between two paragraphs of the GPL-3.0 text, the question after it."""
    text = (resources.files("duocal") / "assets" / "texts" / "gpl-3.0.txt").read_text()
    before_end, after_end = LICENCE_SPLIT
    cut = text.index("\n\n", before_end)  # a paragraph boundary
    after = text[cut : text.index("\n\n", after_end)]
    return (
        f"Read this licence carefully.\n\n{text[text.index('Preamble') : cut]}\n\n"
        f"The pass key is {key}. Remember it.{after}\n\nWhat is the pass key mentioned in the licence?"
    )


PROMPTS = {"readme": readme_prompt, "licence": licence_prompt}


def regression_prompt(name: str, key: int) -> ChatPrompt:
    """One of the fixed `PROMPTS` with `key` (its depth: the middle, where both hide it)."""
    return ChatPrompt(key, 0.5, PROMPTS[name](key), name)


def answer_all(
    model,
    tokenizer,
    plan: dr.Plan,
    asked: list[ChatPrompt],
    new_tokens: int = NEW_TOKENS,
    tick: Callable[[int], None] = lambda n: None,
    batch_size: int = BATCH,
) -> tuple[list[ChatAnswer], int]:
    """Greedy answers to every prompt through `plan`'s cache, `batch_size` prompts at a time, and the most
    KV bytes one sequence held (measured at the end of each batch's generation)."""
    answers: list[ChatAnswer] = []
    measured = 0
    with dr.apply(model, plan) as runtime:
        for i in range(0, len(asked), batch_size):
            batch = asked[i : i + batch_size]
            got, nbytes = answer_batch(model, tokenizer, runtime, batch, new_tokens)
            answers += got
            measured = max(measured, nbytes // len(batch))
            tick(len(batch))
    return answers, measured


def answer_batch(model, tokenizer, runtime, asked: list[ChatPrompt], new_tokens: int) -> tuple[list[ChatAnswer], int]:
    """Greedy answers to prompts in one left-padded batch on a fresh cache of `runtime`, and its bytes."""
    rows = [chat_ids(tokenizer, p.text) for p in asked]
    pad = pad_token_id(tokenizer, model.config)
    ids, mask = pad_batch(rows, pad, left=True)
    cache = runtime.new_cache()
    out = model.generate(
        input_ids=ids,
        attention_mask=mask.long(),
        cache=cache,
        do_sample=False,
        max_new_tokens=new_tokens,
        pad_token_id=pad,
    )
    texts = tokenizer.batch_decode(out[:, ids.shape[1] :], skip_special_tokens=True)
    return [ChatAnswer(p.haystack, p.key, text.strip()) for p, text in zip(asked, texts, strict=True)], cache.kv_bytes()


def tally(answers: list[ChatAnswer]) -> dict[str, tuple[int, int, int]]:
    """Prompt name -> (exact, clean, answers)."""
    out: dict[str, tuple[int, int, int]] = {}
    for a in answers:
        exact, clean, total = out.get(a.prompt, (0, 0, 0))
        out[a.prompt] = (exact + a.exact, clean + a.clean, total + 1)
    return out


# --- the chat format of `eval passkey` ------------------------------------------------------
@dataclass(frozen=True)
class ChatWork:
    """One context's chat prompts (the same for every row)."""

    prompts: tuple[ChatPrompt, ...]
    haystack: str

    @property
    def samples(self) -> tuple[ChatPrompt, ...]:
        return self.prompts

    @property
    def questions(self) -> int:
        return len(self.prompts)


def chat_work(tokenizer, context: int, samples: int, depths, haystack, seed: int) -> ChatWork:
    """`samples` prompts of at most `context` chat tokens (raises `ValueError` when none fits)."""
    check_chat_template(tokenizer)
    prompts = tuple(chat_prompts(tokenizer, context, samples, tuple(depths), haystack, seed))
    return ChatWork(prompts, prompts[0].haystack)


def run_chat_row(model, tokenizer, plans, work: ChatWork, answer_tokens: int, tick, batch_size: int = BATCH):
    """Each plan's exact matches and measured bytes ((hits, bytes) per plan, as `passkey_row` takes
    them), and the row's extra fields: the share of clean answers (mean over plans) and the haystack."""
    prompts = list(work.prompts)
    runs = [answer_all(model, tokenizer, plan, prompts, answer_tokens, tick, batch_size) for plan in plans]
    cleans = [sum(a.clean for a in answers) / len(answers) for answers, _ in runs]
    extra = {"clean": sum(cleans) / len(cleans), "format": "chat", "haystack": work.haystack}
    return [([a.exact for a in answers], measured) for answers, measured in runs], extra

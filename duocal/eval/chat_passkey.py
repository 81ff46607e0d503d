"""Chat prompts with a pass key hidden ~600 tokens before the question, answered greedily through a plan.

Issue 38: README's quick-start chat prompt got garbled answers ("The pass key is the pass key is
71432") from SmolLM2's shipped profile at 50%. Two prompts, each over the same keys: `readme` (the
quick start's, the key between two runs of repeated filler) and `licence` (the key inside the
GPL-3.0 text). An answer is `exact` when its first number is the key and `clean` when no phrase of
three words comes twice before that first number (a garbled answer repeats itself). Batched with
left padding; fp32 is the quick start's dtype.

    python -m duocal.eval.chat_passkey        # the table of docs/benchmarks/real-model.md (~3.5 min, 2 cores)
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from importlib import resources

import duocal_runtime as dr
from duocal.data.padding import pad_batch, pad_token_id

KEYS = (71432, 71433, 71434, 71435, 28519, 60387, 93146, 45270)
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. " * 25
PHRASE_WORDS = 3
NEW_TOKENS = 16
BATCH = 8  # prompts per generate(): their attention scores stay small (8 × 9 heads × 1.3k² floats)
LICENCE_SPLIT = (3000, 5600)  # characters of the GPL-3.0 text before and after the key


def readme_prompt(key: int) -> str:
    """README's quick-start prompt (its key and both filler runs), question after the document."""
    document = (
        f"There is important info hidden in this text. Find it and memorize it. {FILLER}"
        f"The pass key is {key}. Remember it. {key} is the pass key. {FILLER}"
    )
    return document + "\nWhat is the pass key?"


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


@dataclass(frozen=True)
class ChatAnswer:
    """A greedy answer to one prompt and key, and how it scores."""

    prompt: str
    key: int
    text: str

    @property
    def first_number(self) -> int | None:
        found = re.search(r"\d+", self.text)
        return int(found.group()) if found else None

    @property
    def exact(self) -> bool:
        return self.first_number == self.key

    @property
    def clean(self) -> bool:
        """No phrase of PHRASE_WORDS words twice before the first number (the whole answer without one)."""
        found = re.search(r"\d", self.text)
        return not repeats_a_phrase(self.text[: found.start()] if found else self.text)


def repeats_a_phrase(text: str, words: int = PHRASE_WORDS) -> bool:
    """Whether some run of `words` consecutive words (case and punctuation ignored) occurs twice."""
    tokens = re.findall(r"[a-z']+", text.lower())
    phrases = [tuple(tokens[i : i + words]) for i in range(len(tokens) - words + 1)]
    return len(phrases) != len(set(phrases))


def chat_ids(tokenizer, content: str) -> list[int]:
    """The user turn `content` in the model's chat template, with the assistant's turn opened."""
    messages = [{"role": "user", "content": content}]
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"])


def answer_all(
    model, tokenizer, plan: dr.Plan, asked: list[tuple[str, int]], new_tokens=NEW_TOKENS
) -> list[ChatAnswer]:
    """Greedy answers to every (prompt name, key) through `plan`'s cache, BATCH prompts at a time."""
    with dr.apply(model, plan) as runtime:
        return [
            a
            for i in range(0, len(asked), BATCH)
            for a in answer_batch(model, tokenizer, runtime, asked[i : i + BATCH], new_tokens)
        ]


def answer_batch(model, tokenizer, runtime, asked: list[tuple[str, int]], new_tokens: int) -> list[ChatAnswer]:
    """Greedy answers to (prompt name, key) pairs in one left-padded batch on a fresh cache of `runtime`."""
    rows = [chat_ids(tokenizer, PROMPTS[name](key)) for name, key in asked]
    pad = pad_token_id(tokenizer, model.config)
    ids, mask = pad_batch(rows, pad, left=True)
    out = model.generate(
        input_ids=ids,
        attention_mask=mask.long(),
        cache=runtime.new_cache(),
        do_sample=False,
        max_new_tokens=new_tokens,
        pad_token_id=pad,
    )
    texts = tokenizer.batch_decode(out[:, ids.shape[1] :], skip_special_tokens=True)
    return [ChatAnswer(name, key, text.strip()) for (name, key), text in zip(asked, texts)]


def tally(answers: list[ChatAnswer]) -> dict[str, tuple[int, int, int]]:
    """Prompt name -> (exact, clean, answers)."""
    out: dict[str, tuple[int, int, int]] = {}
    for a in answers:
        exact, clean, total = out.get(a.prompt, (0, 0, 0))
        out[a.prompt] = (exact + a.exact, clean + a.clean, total + 1)
    return out


def standard_plans(profile: dr.Profile) -> dict[str, dr.Plan]:
    """Full attention, the profile at its deploy sparsity, and at 0.75 (docs/benchmarks/real-model.md)."""
    default = profile.deploy.sparsity
    plans = {"full": dr.plan(profile, sparsity=0.0), f"duo {default:g} (default)": dr.plan(profile)}
    plans.setdefault("duo 0.75", dr.plan(profile, sparsity=0.75))
    return plans


def main(argv: list[str]) -> None:
    """Print plan × prompt: exact / clean of the keys, and every answer that is not both (fp32)."""
    import torch

    from duocal.models import KNOWN_MODELS, fetch_model, load_model, load_tokenizer

    name = argv[0] if argv else "smollm2-135m-instruct"
    folder = fetch_model(name)
    model, tokenizer = load_model(folder).float(), load_tokenizer(folder)
    profile = dr.load_profile(str(resources.files("duocal_runtime.prebuilt") / KNOWN_MODELS[name].profile))
    asked = [(prompt, key) for prompt in PROMPTS for key in KEYS]
    print(f"prompt tokens: {', '.join(f'{p} {len(chat_ids(tokenizer, PROMPTS[p](KEYS[0])))}' for p in PROMPTS)}")
    print("| plan | " + " | ".join(f"{p} exact / clean" for p in PROMPTS) + " |")
    print("|---|" + "---|" * len(PROMPTS))
    with torch.inference_mode():
        for label, plan in standard_plans(profile).items():
            answers = answer_all(model, tokenizer, plan, asked)
            counts = tally(answers)
            cells = " | ".join(f"{e}/{n} / {c}/{n}" for e, c, n in (counts[p] for p in PROMPTS))
            print(f"| {label} | {cells} |")
            for a in answers:
                if not (a.exact and a.clean):
                    print(f"    {label} {a.prompt} {a.key}: {a.text!r}", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])

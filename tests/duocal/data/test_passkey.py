"""The passkey generator: determinism, label placement, depths, haystack sources, errors."""

from __future__ import annotations

import hashlib
import itertools
import json

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from duocal.data import (
    FORMATS,
    IGNORE_INDEX,
    Haystack,
    PasskeyFormat,
    PasskeyGenerator,
    SyntheticFiller,
    TokenKind,
    collate,
)
from duocal.demo.tokenizer import build_tokenizer

ENGLISH = (
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
    "It was a bright cold day in April, and the clocks were striking thirteen. "
)


@pytest.fixture(scope="module")
def chars():
    return build_tokenizer()


@pytest.fixture(scope="module")
def bpe():
    """A byte-level BPE (GPT-2 style: merges across letters and digits, leading spaces in tokens)."""
    core = Tokenizer(models.BPE(unk_token=None))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    corpus = [
        ENGLISH * 3,
        " ".join(FORMATS["nato"].values) * 5,
        FORMATS["digits"].prefix,
        FORMATS["nato"].needle + FORMATS["nato"].question,
        " ".join(FORMATS["digits"].keys),
        "0123456789 " * 5,
    ]
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=["<s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    core.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>")


def check_sample(sample, tokenizer, generator):
    ids, labels = sample.input_ids, sample.labels
    assert len(ids) == len(labels) == len(sample.kinds)
    lo, hi = generator.context_length
    assert lo <= len(ids) <= hi
    answer_positions = {p for a in sample.answers for p in range(a.start, a.end)}
    for t, label in enumerate(labels):
        if t in answer_positions:
            assert label == ids[t]
            assert sample.kinds[t] == TokenKind.ANSWER
        else:
            assert label == IGNORE_INDEX
    for a in sample.answers:
        needle = sample.needles[a.needle]
        assert tuple(ids[a.start : a.end]) == a.ids == tuple(ids[slice(*needle.value_span)])
        assert tokenizer.decode(list(a.ids)).strip() == needle.value
        assert list(a.predict_positions) == list(range(a.start - 1, a.end - 1))
        assert tokenizer.decode(ids[slice(*needle.key_span)]).strip() == needle.key
    assert sample.prompt_ids == ids[: sample.answers[0].start]
    assert sample.answer_ids == sample.answers[0].ids
    assert sample.predict_positions == tuple(p - 1 for a in sample.answers for p in range(a.start, a.end))


@pytest.mark.parametrize("fmt", ["demo", "digits", "nato"])
@pytest.mark.parametrize("questions", ["one", "all"])
def test_labels_only_on_answers(chars, bpe, fmt, questions):
    for tokenizer in (chars, bpe):
        n, context = {"demo": ((1, 4), (300, 500)), "digits": ((1, 3), (600, 900)), "nato": ((1, 2), (700, 900))}[fmt]
        gen = PasskeyGenerator(
            tokenizer, context_length=context, num_passkeys=n, format=fmt, questions=questions, seed=3
        )
        for sample in gen.samples(6):
            check_sample(sample, tokenizer, gen)
            asked = [a.needle for a in sample.answers]
            if questions == "all":
                assert sorted(asked) == list(range(len(sample.needles)))
            else:
                assert len(asked) == 1


def test_same_seed_same_samples_other_seed_differs(chars):
    def make(seed):
        return PasskeyGenerator(
            chars, context_length=(200, 400), num_passkeys=(1, 6), format="demo", questions="all", seed=seed
        )

    a, b, c = make(7), make(7), make(8)
    assert [s for s in a.samples(5)] == [s for s in b.samples(5)]
    assert a[3] == b[3]  # random access gives the same sample as iteration
    assert all(x.input_ids != y.input_ids for x, y in zip(a.samples(5), c.samples(5), strict=True))
    assert a[0].input_ids != a[1].input_ids


def test_a_chosen_length_keeps_the_drawn_passkeys(chars):
    gen = PasskeyGenerator(chars, context_length=(200, 400), num_passkeys=(1, 6), format="demo", seed=2)
    for i in range(5):
        drawn, chosen = gen[i], gen.sample(i, context_length=333)
        assert len(chosen) == 333
        assert [(n.key, n.value) for n in chosen.needles] == [(n.key, n.value) for n in drawn.needles]


def test_samples_are_the_same_on_every_machine(chars):
    # A fingerprint of seed 0's first samples: changes only if the sampling algorithm changes.
    gen = PasskeyGenerator(chars, context_length=(64, 256), num_passkeys=(1, 3), format="demo", questions="all")
    digest = hashlib.sha256(json.dumps([s.input_ids for s in gen.samples(4)]).encode()).hexdigest()
    assert digest == GOLDEN_DIGEST


GOLDEN_DIGEST = "f4b5f50787c8f9041d291e6e9eeb97c9b835b331957c5c9c6420a4f16fc12629"


def test_needles_at_requested_depths(chars):
    for depth in (0.0, 0.3, 0.75, 1.0):
        gen = PasskeyGenerator(chars, context_length=500, num_passkeys=1, depth=(depth, depth), format="demo")
        s = gen[0]
        (needle,) = s.needles
        context_end = s.answers[0].start - len("?X")  # the question is "?" key answer ";"
        room = context_end - 1 - (needle.end - needle.start)  # 1 = BOS
        assert needle.start - 1 == round(depth * room)
        assert needle.depth == depth
    gen = PasskeyGenerator(chars, context_length=2000, num_passkeys=(2, 6), depth=(0.2, 0.6), format="demo")
    for s in gen.samples(10):
        context_end = min(a.start for a in s.answers) - 2
        for needle in s.needles:
            assert 0.2 <= needle.depth <= 0.6
            assert 0.2 - 0.05 <= (needle.start - 1) / (context_end - 1) <= 0.6 + 0.05
        assert all(p.end <= q.start for p, q in itertools.pairwise(s.needles))  # ordered, no overlap
        assert all(s.kinds[t] == TokenKind.NEEDLE for n in s.needles for t in range(n.start, n.end))


def test_demo_symbols_are_distinct_within_a_sample(chars):
    gen = PasskeyGenerator(chars, context_length=(300, 300), num_passkeys=6, format="demo", questions="all")
    for s in gen.samples(20):
        symbols = "".join(n.key + n.value for n in s.needles)
        assert len(symbols) == len(set(symbols)) == 36


def test_haystack_from_text_jsonl_and_dataset(chars, tmp_path):
    text = tmp_path / "book.txt"
    text.write_text("once upon a time there was a tiny model. " * 40)
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text("".join(json.dumps({"text": f"document {i} says hello. ", "id": i}) + "\n" for i in range(50)))
    import datasets

    dataset = datasets.load_dataset("json", data_files=str(jsonl), split="train")
    cases = [
        (text, "there was a tiny model"),
        (jsonl, "says hello"),
        (dataset, "says hello"),
        (["abc def "] * 3, "abc def"),
    ]
    for source, expected in cases:
        gen = PasskeyGenerator(chars, context_length=600, num_passkeys=2, format="demo", haystack=source, seed=1)
        s = gen[0]
        hay = chars.decode([t for t, k in zip(s.input_ids, s.kinds, strict=True) if k == TokenKind.HAYSTACK])
        assert len(hay) == 600 - 1 - 2 * 8 - 8  # BOS, two needles, one question
        assert expected in hay
        assert "says hello" not in hay or source in (jsonl, dataset)


def test_synthetic_filler_is_words_from_its_lexicon(chars):
    filler = SyntheticFiller(num_words=10, seed=5)
    assert len(set(filler.lexicon)) == 10 and filler.lexicon == SyntheticFiller(num_words=10, seed=5).lexicon
    gen = PasskeyGenerator(chars, context_length=300, format="demo", haystack=filler)
    s = gen[0]
    hay = chars.decode([t for t, k in zip(s.input_ids, s.kinds, strict=True) if k == TokenKind.HAYSTACK])
    words = hay.split()[1:-1]  # the window may cut the first and last word
    assert words and set(words) <= set(filler.lexicon)


def test_collate_pads_right(chars):
    gen = PasskeyGenerator(chars, context_length=(100, 200), format="demo", num_passkeys=2)
    samples = list(gen.samples(3))
    batch = collate(samples, chars.pad_token_id)
    width = max(len(s) for s in samples)
    assert batch["input_ids"].shape == batch["labels"].shape == (3, width)
    for row, s in enumerate(samples):
        assert batch["input_ids"][row, : len(s)].tolist() == list(s.input_ids)
        assert batch["attention_mask"][row].sum().item() == len(s)
        assert (batch["labels"][row, len(s) :] == IGNORE_INDEX).all()


# --- errors ---------------------------------------------------------------------------------------


def test_passkeys_that_do_not_fit_are_an_error(chars):
    with pytest.raises(ValueError, match="raise context_length or lower num_passkeys"):
        PasskeyGenerator(chars, context_length=(40, 400), num_passkeys=3, format="demo", questions="all")
    with pytest.raises(ValueError, match="at most 6"):
        PasskeyGenerator(chars, context_length=2000, num_passkeys=7, format="demo")


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_empty_haystack_is_an_error(chars, tmp_path, content):
    path = tmp_path / "empty.txt"
    path.write_text(content)
    with pytest.raises(ValueError, match="empty"):
        PasskeyGenerator(chars, haystack=path, format="demo")
    jsonl = tmp_path / "empty.jsonl"
    jsonl.write_text(content)
    with pytest.raises(ValueError, match="empty"):
        PasskeyGenerator(chars, haystack=jsonl, format="demo")
    with pytest.raises(ValueError, match="empty"):
        PasskeyGenerator(chars, haystack=Haystack.from_texts([content]), format="demo")


def test_haystack_without_the_text_field_is_an_error(chars, tmp_path):
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text(json.dumps({"body": "hello"}) + "\n")
    with pytest.raises(ValueError, match="no text field 'text'"):
        PasskeyGenerator(chars, haystack=jsonl, format="demo")
    with pytest.raises(ValueError, match="does not exist"):
        PasskeyGenerator(chars, haystack=tmp_path / "missing.txt", format="demo")


def test_tokenizer_that_splits_the_markers_is_an_error():
    # "#k" is one token, so the key cannot be told apart from the needle's marker.
    vocab = {c: i for i, c in enumerate(["<unk>", "#", "?", ";", "k", "#k", *"0123456789", " ", "a"])}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[("#", "k")], unk_token="<unk>"))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>")
    fmt = PasskeyFormat(
        needle="#{key}{value};", question="?{key}{value};", keys=("k",), values=tuple("0123456789"), value_length=3
    )
    with pytest.raises(ValueError, match="splits the passkey markers"):
        PasskeyGenerator(tokenizer, context_length=100, format=fmt, haystack=["a a a "])
    ok = fmt.replace(needle="# {key} {value};", question="? {key} {value};")  # whitespace: clean boundaries
    assert PasskeyGenerator(tokenizer, context_length=100, format=ok, haystack=["a a a "])[0].answers


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"depth": (0.5, 0.2)}, "depth"),
        ({"depth": (0.0, 1.5)}, "depth"),
        ({"context_length": (500, 100)}, "context_length"),
        ({"num_passkeys": 0}, "num_passkeys"),
        ({"questions": "some"}, "questions"),
        ({"format": "klingon"}, "unknown passkey format"),
    ],
)
def test_bad_parameters_are_errors(chars, kwargs, message):
    with pytest.raises(ValueError, match=message):
        PasskeyGenerator(chars, **{"format": "demo", **kwargs})


def test_bad_formats_are_errors():
    with pytest.raises(ValueError, match="exactly one"):
        PasskeyFormat(needle="{key}", question="{key}{value}", values=("a",), value_length=1)
    with pytest.raises(ValueError, match="a \\{key\\} and then"):
        PasskeyFormat(needle="{key}{value}", question="{value} {key}", values=("a",), value_length=1)
    with pytest.raises(ValueError, match="distinct"):
        PasskeyFormat(needle="{key}{value}", question="{key}{value}", values=("a", "b"), value_length=3, distinct=True)


def test_needle_starts_keep_order_room_and_depth():
    from duocal.data.passkey import needle_starts

    assert needle_starts([0.0], [8], 100) == [0]
    assert needle_starts([1.0], [8], 100) == [100]  # ends exactly at the end of the context
    assert needle_starts([0.5, 0.5], [8, 8], 100) == [54, 62]  # the second is pushed past the first
    assert needle_starts([1.0, 1.0], [8, 8], 100) == [100, 108]  # the first is pushed left to leave room
    assert needle_starts([0.0, 0.0, 1.0], [5, 5, 5], 0) == [0, 5, 10]  # no filler: back to back

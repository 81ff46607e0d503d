"""The tuning data is read and checked before any model loads: JSONL conversations with their answers, a
text file, and every malformed file refused with the file, the line and what to do; the generated prompts
mix every kind of needle in both sets, the confirming set with other keys and lengths; a user's file too small
to split in two sets is refused."""

import json

import pytest

from duocal.data.chat_prompts import FRAMINGS
from duocal.data.needle_values import VALUE_KINDS, kind_of
from duocal.data.prompt_kinds import prompt_mix
from duocal.tuning.tune_data import passkey_data, read_data, split_sets
from duocal.tuning.tune_prompts import CONFIRM_LENGTHS, answered_prompts


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_conversations_and_answers_are_read_with_a_fingerprint_of_the_bytes(tmp_path):
    lines = [
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}], "answer": "4"},
        {"prompt": "Capital of France?", "answer": "Paris"},
    ]
    path = write(tmp_path, "chats.jsonl", "\n".join(map(json.dumps, lines)) + "\n\n")
    data = read_data(path)
    assert data.kind == "chat" and len(data.conversations) == 2
    assert data.conversations[1].messages == ({"role": "user", "content": "Capital of France?"},)
    assert data.conversations[0].answer == "4"
    same = read_data(write(tmp_path, "copy.jsonl", path.read_text()))
    other = read_data(write(tmp_path, "other.jsonl", json.dumps(lines[0])))
    assert data.fingerprint == same.fingerprint != other.fingerprint


def test_a_text_file_is_perplexity_data(tmp_path):
    data = read_data(write(tmp_path, "book.txt", "Some words. More words.\n"))
    assert data.kind == "text" and data.text.startswith("Some words")


def test_the_default_prompts_are_fingerprinted_by_their_settings():
    assert passkey_data(16, 1536).fingerprint == passkey_data(16, 1536).fingerprint != passkey_data(8, 1536).fingerprint
    held_out = passkey_data(16, 1536, seed=9191, haystacks=("text",))
    others = {passkey_data(16, 1536, seed=9191).fingerprint, passkey_data(16, 1536).fingerprint}
    assert held_out.fingerprint not in others
    assert "seed 9191" in held_out.name and "haystacks text" in held_out.name
    numbers = passkey_data(16, 1536, values=("number",), framings=("chat",))
    assert numbers.fingerprint not in others and "number values; chat" in numbers.name


def test_both_sets_hold_every_kind_and_the_confirming_set_other_keys_and_lengths(smollm2_tokenizer):
    mix = prompt_mix(VALUE_KINDS, FRAMINGS, ("repeated", "text"))
    measuring = answered_prompts(smollm2_tokenizer, 12, 700, 5151, mix)
    confirming = answered_prompts(smollm2_tokenizer, 12, 700, "5151:confirm", mix, CONFIRM_LENGTHS)
    assert {p.key for p in measuring}.isdisjoint(p.key for p in confirming)
    assert {kind_of(p.key) for p in measuring} == {kind_of(p.key) for p in confirming} == set(VALUE_KINDS)
    assert all(650 <= len(p.prompt) <= 700 for p in measuring)
    lengths = sorted(len(p.prompt) for p in confirming)
    assert 500 <= lengths[0] <= lengths[5] <= 525 and 1000 <= lengths[6] <= lengths[-1] <= 1050  # 0.75x and 1.5x
    for p in measuring + confirming:
        text = smollm2_tokenizer.decode(p.prompt)
        chat = "<|im_start|>assistant" in text
        assert text.endswith("The pass key is") != chat  # plain prompts end in the cue
        answer = smollm2_tokenizer.decode(p.answer)
        assert answer == (f"The pass key is {p.key}." if chat else f" {p.key}.")
        assert f"The pass key is {p.key}." in text  # the needle


def test_the_seed_decides_the_prompts_and_the_haystacks_are_those_asked(smollm2_tokenizer):
    mix = prompt_mix(VALUE_KINDS, FRAMINGS, ("text",))
    assert answered_prompts(smollm2_tokenizer, 4, 700, 9191, mix) == answered_prompts(
        smollm2_tokenizer, 4, 700, 9191, mix
    )
    texts = [smollm2_tokenizer.decode(p.prompt) for p in answered_prompts(smollm2_tokenizer, 4, 700, 9191, mix)]
    assert all("Read this text carefully" in t for t in texts)


@pytest.mark.parametrize("kind, count, least", [("chat", 15, 16), ("text", 3, 4)])
def test_a_file_too_small_to_split_in_two_sets_is_refused_naming_the_minimum(kind, count, least):
    with pytest.raises(ValueError, match=f"needs at least {least}"):
        split_sets(tuple(range(count)), kind, "data.jsonl")
    assert split_sets(tuple(range(least + 1)), kind, "data.jsonl") == (
        tuple(range(0, least + 1, 2)),
        tuple(range(1, least + 1, 2)),
    )


BAD = {
    "empty": ("a.jsonl", "  \n", "is empty"),
    "not json": ("a.jsonl", '{"answer": "x"\n', "line 1 is not JSON"),
    "not an object": ("a.jsonl", '["x"]\n', "line 1 is not a JSON object"),
    "answer missing": ("a.jsonl", '{"prompt": "hi"}\n{"prompt": "hi", "answer": "yo"}\n', "line 1 has no answer"),
    "answer empty": ("a.jsonl", '{"prompt": "hi", "answer": " "}\n', "has no answer"),
    "no messages": ("a.jsonl", '{"answer": "yo"}\n', "has no messages"),
    "bad message": ("a.jsonl", '{"messages": [{"role": "user"}], "answer": "yo"}\n', "message 0 must be"),
    "assistant last": (
        "a.jsonl",
        '{"messages": [{"role": "assistant", "content": "yo"}], "answer": "yo"}\n',
        "the last message is the assistant's",
    ),
    "other suffix": ("a.csv", "a,b\n", "give a .jsonl file"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_malformed_data_is_refused_with_what_to_do(case, tmp_path):
    name, text, message = BAD[case]
    with pytest.raises(ValueError, match=message):
        read_data(write(tmp_path, name, text))


def test_a_missing_file_and_a_folder_are_refused(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        read_data(tmp_path / "none.jsonl")
    with pytest.raises(ValueError, match="is a folder"):
        read_data(tmp_path)

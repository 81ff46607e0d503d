"""The tuning data is read and checked before any model loads: JSONL conversations with their answers, a
text file, and every malformed file refused with the file, the line and what to do."""

import json

import pytest

from duocal.tuning.tune_curve import passkey_prompts
from duocal.tuning.tune_data import passkey_data, read_data


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
    assert "seed 9191, haystacks text" in held_out.name


def test_held_out_prompts_follow_the_seed_and_haystacks(smollm2_tokenizer):
    default = passkey_prompts(smollm2_tokenizer, 4, 700)
    held_out = passkey_prompts(smollm2_tokenizer, 4, 700, seed=9191, haystacks=("text",))
    assert {p.key for p in default}.isdisjoint(p.key for p in held_out)
    texts = [smollm2_tokenizer.decode(p.prompt) for p in held_out]
    assert all("Read this text carefully" in t for t in texts) and len(texts) == 4
    in_text = ["Read this text carefully" in smollm2_tokenizer.decode(p.prompt) for p in default]
    assert in_text == [False, False, True, True]


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

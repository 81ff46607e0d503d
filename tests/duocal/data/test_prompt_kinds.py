"""The mix of passkey prompt kinds: every combination of value, framing and haystack, ordered so that a few
prompts already vary all three; in the plain framing the needle's tokens and the answer's key rows are found as
in the chat template."""

from duocal.data.chat_answers import answered_chat
from duocal.data.chat_prompts import FRAMINGS
from duocal.data.needle_values import VALUE_KINDS
from duocal.data.prompt_kinds import PromptKind, mixed_prompts, prompt_mix


def test_the_mix_holds_every_kind_and_its_first_kinds_vary_all_three():
    mix = prompt_mix(VALUE_KINDS, FRAMINGS, ("repeated", "text"))
    assert len(mix) == len(set(mix)) == 12
    assert mix[0] == PromptKind("number", "chat", "repeated")  # README's quick-start prompt comes first
    first = mix[:4]
    assert {k.values for k in first} == set(VALUE_KINDS) and {k.framing for k in first} == set(FRAMINGS)
    assert {k.haystack for k in first} == {"repeated", "text"}
    assert prompt_mix(("uuid",), ("plain",), ("text",)) == [PromptKind("uuid", "plain", "text")]
    assert len(prompt_mix(("number", "word"), FRAMINGS, ("text",))) == 4  # kinds the formula never reaches too


def test_every_kind_places_its_needle_and_its_answers_key_rows(smollm2_tokenizer):
    mix = prompt_mix(VALUE_KINDS, FRAMINGS, ("repeated", "text"))
    for prompt in mixed_prompts(smollm2_tokenizer, 12, 600, 11, mix):
        sample = answered_chat(smollm2_tokenizer, prompt)
        needle = smollm2_tokenizer.decode(sample.ids[sample.needle[0] : sample.needle[1]])
        assert f"The pass key is {prompt.key}." in needle, (prompt.framing, needle)
        key = smollm2_tokenizer.decode([sample.ids[r + 1] for r in sample.rows])  # each row predicts the next token
        assert key.strip() == str(prompt.key), (prompt.framing, key)
        prompt_text = smollm2_tokenizer.decode(sample.ids[: sample.prompt_end])
        assert prompt_text.endswith("The pass key is") == (prompt.framing == "plain")

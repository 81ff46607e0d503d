"""`duocal profile` on chat prompts (issue 38): the answer written out after the chat template, the needle
placed in tokens, heads scored by the answer's loss; the default for a model with a chat template."""

import json

import pytest
import torch
from typer.testing import CliRunner

from duocal.cli.app import app
from duocal.data.chat_answers import ANSWER, answered_chat
from duocal.data.chat_prompts import chat_ids, chat_prompts
from duocal.data.needle_values import kind_of
from duocal.measure import decoding
from duocal.profiling import ProfilerConfig, profiler
from duocal.profiling.profiler import own_answer, scored_answer, sequences

NAME = "smollm2-135m-instruct"
runner = CliRunner()


@pytest.mark.parametrize("haystack", ["repeated", "text"])
def test_the_answer_follows_the_prompt_and_its_rows_predict_the_key(smollm2_tokenizer, haystack):
    for prompt in chat_prompts(smollm2_tokenizer, 600, 3, (0.25, 0.5, 0.75), haystack, seed=5):
        sample = answered_chat(smollm2_tokenizer, prompt)
        assert sample.ids[: sample.prompt_end] == chat_ids(smollm2_tokenizer, prompt.text)
        assert smollm2_tokenizer.decode(sample.ids[sample.prompt_end :]) == ANSWER.format(key=prompt.key)
        predicted = smollm2_tokenizer.decode([sample.ids[row + 1] for row in sample.rows])
        assert predicted.strip() == str(prompt.key) and min(sample.rows) >= sample.prompt_end
        needle = smollm2_tokenizer.decode(sample.ids[sample.needle[0] : sample.needle[1]]).strip()
        assert needle.startswith(f"The pass key is {prompt.key}.") and needle.endswith(
            f"{prompt.key} is the pass key." if haystack == "repeated" else "Remember it."
        )


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(format="chat", haystack="synthetic"), "the chat format's haystack must be repeated, text"),
        (dict(format="chat", haystack="repeated", num_passkeys=2), "hides one key per prompt"),
        (dict(format="chat", haystack="repeated", depths=(1.5,)), "depths must be in [0, 1]"),
        (dict(score="gates"), "score must be one of loss, retrieval, kept"),
        (dict(data="text", text="a. b. c.", score="retrieval"), "text windows have no needle"),
        (dict(format="chat", haystack="repeated,synthetic"), "the chat format's haystack must be repeated, text"),
        (dict(format="chat", haystack="repeated,repeated"), "names a haystack twice"),
        (dict(format="chat", haystack="repeated", answer="mine"), "answer must be one of right, own, written"),
        (dict(format="chat", haystack="repeated", values=("emoji",)), "--values takes number, word, uuid"),
        (dict(format="chat", haystack="repeated", framings=("chat", "chat")), "--framing takes chat, plain, each once"),
        (dict(format="digits", values=("uuid",)), "give --format chat"),
    ],
)
def test_chat_and_score_settings_are_checked(settings, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        ProfilerConfig(**settings)


def test_chosen_score_follows_the_data():
    assert ProfilerConfig(format="chat", haystack="repeated").chosen_score == "loss"
    assert ProfilerConfig().chosen_score == "retrieval"
    assert ProfilerConfig(data="text", text="a. b.").chosen_score == "kept"
    assert ProfilerConfig(score="loss").chosen_score == "loss"


def test_cli_profiles_a_chat_model_on_chat_prompts_by_answer_loss(tmp_path):
    out = tmp_path / "chat.json"
    args = ["profile", NAME, "--contexts", "700", "--samples", "1", "--sink", "16", "--recent", "128"]
    result = runner.invoke(app, [*args, "--kv-bits", "none", "--output", str(out)])
    assert result.exit_code == 0, result.output
    profile = json.loads(out.read_text())
    assert profile["source"]["score"] == "loss" and profile["source"]["format"] == "chat"
    assert profile["source"]["haystacks"] == ["repeated", "text"] and profile["source"]["answer"] == "right"
    assert profile["source"]["written_answers"] in (0, 1)  # the one prompt: full attention's answer or the written
    scores = [s for row in profile["scores"] for s in row]
    assert min(scores) == 0.0 and max(scores) == 1.0 and len(set(scores)) > 80  # ranked, hardly any ties
    assert {"retrieval", "kept:sink_window"} <= set(profile["measurements"])  # mixed plans still get them
    assert "profile: 2/2 (100%), " in result.stderr and "answer loss" in result.stderr  # both passes counted
    shown = runner.invoke(app, ["profiles", "show", str(out)])
    assert shown.exit_code == 0 and "source: profiler (scores: loss)" in shown.output, shown.output


def test_a_mixed_chat_profile_ranks_on_every_kind_asked(smollm2_tokenizer):
    """--values and --framing: the sequences hold every value kind and both framings, each key's rows predicting
    the key; README's numbers in the chat template stay the default (the same sequences as before)."""
    config = ProfilerConfig(
        format="chat", haystack="repeated,text", samples=6, contexts=(600,), values=("number", "word", "uuid"),
        framings=("chat", "plain"),
    )  # fmt: skip
    mixed = list(sequences(smollm2_tokenizer, config))
    assert len(mixed) == 6 and {kind_of(seq.key) for seq in mixed} == {"number", "word", "uuid"}
    texts = [smollm2_tokenizer.decode(seq.ids) for seq in mixed]
    assert sum("<|im_start|>assistant" in t for t in texts) == 3  # half in the chat template, half plain
    for seq in mixed:
        assert smollm2_tokenizer.decode([seq.ids[row + 1] for row in seq.rows]).strip() == str(seq.key)
    default = ProfilerConfig(format="chat", haystack="repeated,text", samples=2, contexts=(600,))
    assert not default.mixed and all(isinstance(seq.key, int) for seq in sequences(smollm2_tokenizer, default))


def test_cli_refuses_the_chat_format_for_a_tokenizer_without_a_chat_template(tmp_path):
    result = runner.invoke(
        app, ["profile", "--format", "chat", "--haystack", "repeated", "--output", str(tmp_path / "x.json")]
    )
    assert result.exit_code == 1 and "chat template" in result.output, result.output
    assert not (tmp_path / "x.json").exists()


def test_the_cli_default_depths_are_the_chat_prompts_own():
    from duocal.cli.options import CHAT_DEPTHS_TEXT
    from duocal.data.chat_prompts import CHAT_DEPTHS

    assert tuple(float(d) for d in CHAT_DEPTHS_TEXT.split(",")) == CHAT_DEPTHS


def test_chat_prompts_alternate_between_the_haystacks_named(smollm2_tokenizer):
    config = ProfilerConfig(format="chat", haystack="repeated,text", samples=3, contexts=(600,))
    texts = [smollm2_tokenizer.decode(seq.ids) for seq in sequences(smollm2_tokenizer, config)]
    assert ["Read this text carefully" in t for t in texts] == [False, False, True]
    assert all(t.endswith(ANSWER.format(key=t.split("The pass key is ")[1].split(".")[0])) for t in texts)


def test_the_own_answer_is_full_attentions_greedy_answer_and_its_rows_predict_it(tiny_llama):
    ids = [5, 9, 3, 17, 22, 8, 40, 41, 42, 43]  # a prompt of 7 tokens, then a written answer the model never gave
    said, rows = own_answer(tiny_llama, ids, 7, eos=None)
    assert said[:7] == ids[:7] and len(said) == 7 + 16 and rows == list(range(6, 22))
    logits = tiny_llama(input_ids=torch.tensor([said])).logits[0]
    assert [int(logits[r].argmax()) for r in rows] == said[7:]


def test_the_own_answer_decoded_from_the_attention_passs_cache_is_the_one_a_new_prefill_gives(tiny_llama):
    """The attention pass runs over the prompt and the written answer with a cache; cut back to the prompt, that
    cache decodes the same greedy answer as generate() from scratch (one prefill less per prompt)."""
    from transformers import DynamicCache

    from duocal.profiling.attention_stats import recording

    ids = [5, 9, 3, 17, 22, 8, 40, 41, 42, 43]
    cache = DynamicCache(config=tiny_llama.config)
    with torch.no_grad(), recording(tiny_llama, [7, 8]):
        tiny_llama(input_ids=torch.tensor([ids]), use_cache=True, cache=cache, logits_to_keep=1)
    assert cache.get_seq_length() == len(ids)
    assert own_answer(tiny_llama, ids, 7, eos=None, cache=cache) == own_answer(tiny_llama, ids, 7, eos=None)


@pytest.mark.parametrize("answer, written", [("right", 1), ("own", 0)])
def test_the_right_answer_is_full_attentions_own_answer_where_it_gives_the_key(
    smollm2_tokenizer, monkeypatch, answer, written
):
    """Where full attention's greedy answer is wrong ("The pass key is the name of ..."), `right` scores the
    written answer instead: scored on a wrong answer, the loss ranks the heads that keep the wrong answer."""
    config = ProfilerConfig(format="chat", haystack="repeated", samples=2, contexts=(600,))
    chat = list(sequences(smollm2_tokenizer, config))
    said = {
        chat[0].key: f"The pass key mentioned is {chat[0].key}. Remember it.",
        chat[1].key: "The pass key is the name of a specific type of pass key",
    }

    def own(model, ids, prompt_end, eos, cache):  # a greedy answer as the model could give it
        text = said[next(seq.key for seq in chat if seq.ids == ids)]
        answer_ids = smollm2_tokenizer(text, add_special_tokens=False)["input_ids"]
        return ids[:prompt_end] + answer_ids, list(range(prompt_end - 1, prompt_end + len(answer_ids) - 1))

    monkeypatch.setattr(profiler, "own_answer", own)
    monkeypatch.setattr(decoding, "own_answer", own)  # `right` asks for it through the measuring floor
    pairs, counted = zip(
        *[scored_answer(None, smollm2_tokenizer, seq, answer, cache="kept") for seq in chat], strict=True
    )
    assert sum(counted) == written
    for seq, (ids, rows) in zip(chat, pairs, strict=True):
        prompt_end = seq.loss_rows[0] + 1
        scored = smollm2_tokenizer.decode(ids[prompt_end:])
        kept_own = seq is chat[0] or answer == "own"
        assert scored == (said[seq.key] if kept_own else ANSWER.format(key=seq.key))
        assert ids[:prompt_end] == seq.ids[:prompt_end] and rows == list(range(prompt_end - 1, len(ids) - 1))

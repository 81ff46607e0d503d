"""`duocal chat` on a tiny random Llama whose (one token per character) tokenizer is given a chat template:
turns prefill only their own tokens, a cache reused across turns answers as the whole conversation fed at
once, the streaming plan goes past the trained length at constant memory, a plan with full heads refuses a
turn past it and goes on, scripts, commands, Ctrl-C, and refusals."""

import re
import shutil

import pytest
import torch
from typer.testing import CliRunner

import duocal_runtime as dr
from duocal.chat.session import ChatSession, TurnRefused, streaming_plan
from duocal.cli.app import app
from duocal.cli.chat import stopping_on_interrupt
from duocal.models import ModelRef

from helpers.profiles import random_profile

TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


@pytest.fixture(scope="module")
def chat_folder(tiny_llama_folder, tmp_path_factory):
    """The tiny model (trained on 1,024 positions) with a chat template."""
    folder = tmp_path_factory.mktemp("chat") / "model"
    shutil.copytree(tiny_llama_folder, folder)
    tokenizer = ModelRef.resolve(str(folder)).load_tokenizer()
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(folder)
    return folder


def session(folder, plan=None, max_new_tokens=8, **plan_sizes):
    ref = ModelRef.resolve(str(folder))
    model = ref.load_model()
    runtime = dr.apply(model, plan or streaming_plan(model.config, **plan_sizes))
    return ChatSession(model, ref.load_tokenizer(), runtime, 1024, max_new_tokens)


def test_each_turn_prefills_only_its_own_tokens_and_answers_as_the_whole_conversation(chat_folder):
    chat = session(chat_folder, sink=4, recent=60)
    first = chat.turn("hello there")
    before = chat.tokens
    second = chat.turn("and how are you?")
    assert second.new_tokens == chat.tokens - before - 8 < 40  # its message and template, not the history
    template_tokens = chat.tokenizer("<user>hello there</s>\n<assistant>", add_special_tokens=False)["input_ids"]
    assert first.new_tokens == len(template_tokens)
    # the same conversation fed whole to a fresh cache gives the same answer
    fresh = chat.runtime.new_cache()
    ids = chat.ids[:, : chat.tokens - 8]
    again = chat.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), cache=fresh, max_new_tokens=8,
                                do_sample=False, pad_token_id=2)  # fmt: skip
    assert torch.equal(again[0, -8:], chat.ids[0, -8:])


def test_the_streaming_plan_goes_past_the_trained_length_at_constant_memory(chat_folder):
    chat = session(chat_folder, sink=4, recent=60)
    sizes = []
    while chat.tokens < 3 * 1024:
        chat.turn("tell me more about the weather today, please " * 3)
        sizes.append(chat.kv_bytes())
    assert len(set(sizes[2:])) == 1 and chat.tokens > 3 * 1024


def test_a_plan_with_full_heads_refuses_a_turn_past_the_trained_length_and_goes_on(chat_folder):
    model_config = ModelRef.resolve(str(chat_folder)).load_config()
    profile = random_profile(layers=2, kv_heads=2, heads=4, head_dim=8)
    plan = dr.plan(profile, sparsity=0.5)
    assert dr.shape_of_config(model_config) == plan.shape
    chat = session(chat_folder, plan)
    chat.turn("hi")
    with pytest.raises(TurnRefused, match=r"past the model's trained length \(1,024\): 4 of 4 KV heads see original"):
        chat.turn("x" * 1100)
    assert chat.turn("short again").new_tokens < 40  # the chat goes on where it was


def test_a_stop_ends_the_answer_and_the_next_turn_goes_on(chat_folder):
    chat = session(chat_folder, sink=4, recent=60, max_new_tokens=50)
    pieces = []

    def write(piece):
        pieces.append(piece)
        chat.stop.set()  # as the first Ctrl-C does

    stopped = chat.turn("hello", write)
    assert stopped.stopped and len(chat.ids[0]) < chat.tokens + 50
    assert not chat.turn("again").stopped
    handler = stopping_on_interrupt(chat)
    chat.stop.clear()
    handler._interrupt(None, None)
    assert chat.stop.is_set()
    with pytest.raises(KeyboardInterrupt):  # the second one leaves
        handler._interrupt(None, None)


def test_a_scripted_chat_answers_each_line_with_commands(chat_folder, tmp_path):
    script = tmp_path / "script.txt"
    script.write_text("hello\n/stats\n\nwhat next?\n/reset\n/stats\nbye\n/exit\nnever sent\n")
    result = CliRunner().invoke(
        app, ["chat", str(chat_folder), "--streaming", "--recent", "60", "--max-new-tokens", "5", "--script",
              str(script)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert [line for line in lines if line.startswith("you> ")] == [
        "you> hello", "you> /stats", "you> ", "you> what next?", "you> /reset", "you> /stats", "you> bye", "you> /exit",
    ]  # fmt: skip
    assert sum(line.startswith("bot> ") for line in lines) == 3
    stats = [line for line in lines if line.startswith("[")]
    assert re.match(r"\[\d\d tokens, KV [\d.]+ KiB\] trained length 1,024", stats[0]) and stats[1].startswith(
        "[0 tokens"
    )
    assert "(a new conversation)" in result.stdout


def test_stdin_to_its_end_exits_zero(chat_folder):
    result = CliRunner().invoke(app, ["chat", str(chat_folder), "--streaming", "--max-new-tokens", "3"], input="hi\n")
    assert result.exit_code == 0, result.output
    assert "you> hi" in result.stdout and "bot> " in result.stdout


def test_refusals_before_the_weights_load(tiny_llama_folder, chat_folder, tmp_path, monkeypatch):
    def never(self):
        raise AssertionError("the weights were loaded before the arguments were checked")

    monkeypatch.setattr(ModelRef, "load_model", never)
    cases = [
        ([str(tiny_llama_folder), "--streaming"], "has no chat template"),
        ([str(chat_folder), "--streaming", "--sparsity", "0.5"], "--streaming makes every head a sink window"),
        ([str(chat_folder)], "no profile for"),
        ([str(chat_folder), "--streaming", "--script", str(tmp_path)], "is a folder"),
        ([str(chat_folder), "--streaming", "--max-new-tokens", "0"], "--max-new-tokens must be a positive"),
    ]
    for args, message in cases:
        result = CliRunner().invoke(app, ["chat", *args])
        assert not isinstance(result.exception, AssertionError), (args, result.exception)
        assert result.exit_code == 1 and message in result.output and "Traceback" not in result.output, args


@pytest.mark.parametrize(
    "template, refilled",
    [
        (TEMPLATE.replace("{{ m['content'] }}", "{{ m['content'] | trim }}"), False),  # Llama-3 trims contents
        (TEMPLATE.replace("{{ m['content'] }}", "{{ m['content'] if loop.last else m['content'][:2] }}"), True),
    ],
    ids=["trimmed answers", "earlier turns re-rendered"],
)
def test_templates_that_change_answers_text_keep_the_cache_or_refill_it(chat_folder, template, refilled):
    chat = session(chat_folder, sink=4, recent=60)
    chat.tokenizer.chat_template = template
    chat.turn("hello there ")
    second = chat.turn("and then?")
    assert second.refilled is refilled
    assert second.new_tokens > 40 if refilled else second.new_tokens < 40
    third = chat.turn("more")
    assert third.refilled is refilled and chat.cache.get_seq_length() == chat.tokens - 1

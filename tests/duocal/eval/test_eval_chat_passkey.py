"""`duocal eval passkey --format chat` (issue 38): README's prompt style on SmolLM2, scored exact and clean.

The prompt builder and the refusals need only the tokenizer; one real-model run (full attention,
2 keys at 700 tokens, ~10 s) shows the scores come out as the answers say.
"""

import json

import pytest
from typer.testing import CliRunner

from duocal.cli.app import app
from duocal.data.chat_prompts import chat_ids, chat_prompts, fitted_prompt, haystack_sentences
from duocal.eval.chat_passkey import readme_prompt

NAME = "smollm2-135m-instruct"
runner = CliRunner()


def test_readme_prompt_is_the_quick_start_one():
    filler = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. " * 25
    assert readme_prompt(71432) == (
        f"There is important info hidden in this text. Find it and memorize it. {filler}"
        f"The pass key is 71432. Remember it. 71432 is the pass key. {filler}\nWhat is the pass key?"
    )


@pytest.mark.parametrize("haystack", ["repeated", "text"])
def test_prompts_fill_the_context_with_the_key_at_its_depth(smollm2_tokenizer, haystack):
    prompts = chat_prompts(smollm2_tokenizer, 1024, 4, (0.25, 0.75), haystack, seed=3)
    assert [p.depth for p in prompts] == [0.25, 0.75, 0.25, 0.75]
    assert len({p.key for p in prompts}) == 4 and all(10000 <= p.key <= 99999 for p in prompts)
    assert prompts == chat_prompts(smollm2_tokenizer, 1024, 4, (0.25, 0.75), haystack, seed=3)  # the seed decides
    for p in prompts:
        assert 950 <= len(chat_ids(smollm2_tokenizer, p.text)) <= 1024  # as many whole sentences as fit
        at = p.text.index(f"The pass key is {p.key}.")
        share = at / len(p.text)
        assert abs(share - p.depth) < (0.02 if haystack == "repeated" else 0.1), (share, p.depth)  # a sentence
        question = (
            "\nWhat is the pass key?" if haystack == "repeated" else "\nWhat is the pass key mentioned in the text?"
        )
        assert p.text.endswith(question) and p.haystack == haystack


def test_readme_prompt_is_what_the_builder_makes_at_its_length(smollm2_tokenizer):
    _, pool = haystack_sentences("repeated")
    length = len(chat_ids(smollm2_tokenizer, readme_prompt(71432)))
    assert fitted_prompt(smollm2_tokenizer, pool, True, length, 71432, 0.5) == readme_prompt(71432)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--format", "xml"], "unknown passkey format 'xml'; choose one of chat, demo, digits, nato"),
        (["--format", "chat", "--depths", "0.5,1.5"], "depths must be in [0, 1]"),
        (["--format", "chat", "--haystack", "synthetic"], "haystack must be repeated, text or a .txt file"),
        (["--format", "chat", "--answer-tokens", "0"], "answer tokens must be at least 1"),
        (["--format", "chat", "--passkeys", "2"], "leave --passkeys out"),
        (["--format", "chat", "--contexts", "20"], "too short for the chat prompt"),
        (["--format", "chat", "--contexts", "9000"], "beyond the model's max_position_embeddings"),
        (["--format", "chat", "--protocol", "query-agnostic"], "leave --protocol and --questions out"),
    ],
)
def test_chat_refusals_come_before_the_weights(monkeypatch, args, message):
    monkeypatch.setattr("duocal.models.resolve.ModelRef.load_model", lambda *a: pytest.fail("loaded the weights"))
    result = runner.invoke(app, ["eval", "passkey", "--model", NAME, "--no-plot", *args])
    assert result.exit_code == 1, result.output
    assert message in result.stderr, result.stderr


@pytest.mark.slow
def test_full_attention_answers_chat_prompts(tmp_path):
    result = runner.invoke(
        app,
        [
            "eval",
            "passkey",
            "--model",
            NAME,
            "--format",
            "chat",
            "--rows",
            "full",
            "--contexts",
            "700",
            "--samples",
            "2",
            "--depths",
            "0.5",
            "--answer-tokens",
            "12",
            "--batch-size",
            "1",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout)
    assert row["row"] == "full" and row["format"] == "chat" and row["haystack"] == "repeated"
    assert row["samples"] == 2 and row["exact_match"] == 1.0 and row["clean"] == 1.0, row
    assert "passkey: 1/2 (50%)" in result.stderr and "passkey: 2/2 (100%)" in result.stderr  # one per batch


def test_quick_defaults_cap_contexts_and_name_the_text():
    from types import SimpleNamespace

    from duocal.eval.passkey_defaults import REAL, default_contexts, default_sparsity, haystack_source

    assert default_contexts(REAL, SimpleNamespace(max_position_embeddings=1024)) == "1024"
    assert default_contexts(REAL, SimpleNamespace(max_position_embeddings=8192)) == "2048"
    assert default_sparsity(None) == "0.5"
    assert haystack_source("text", "chat") == "text" and haystack_source("repeated", "digits") == "repeated"
    assert haystack_source("text", "digits").endswith("gpl-3.0.txt")

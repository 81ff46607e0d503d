"""The demo model's tokenizer: one token per character, built with the ``tokenizers`` library.

128 ids: 4 special tokens, newline, the 95 printable ASCII characters, the 24 lowercase Greek
letters (separate key symbols used early in the demo curriculum) and 4 reserved tokens. Every
other character becomes ``<unk>``. ``tokenizer("text")`` starts with ``<s>``, like Llama's.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, processors

SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")
RESERVED_TOKENS = tuple(f"<reserved_{i}>" for i in range(4))
CHARACTERS = ("\n", *(chr(c) for c in range(32, 127)), *"αβγδεζηθικλμνξοπρστυφχψω")


def build_tokenizer():
    """A ``PreTrainedTokenizerFast`` (transformers' tokenizers-backed class) over ``CHARACTERS``."""
    from transformers import PreTrainedTokenizerFast

    symbols = (*SPECIAL_TOKENS, *CHARACTERS, *RESERVED_TOKENS)
    assert len(symbols) == len(set(symbols)) == 128
    vocab = {s: i for i, s in enumerate(symbols)}
    # A BPE model without merges splits text into single characters and maps unknown ones to <unk>.
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    core.add_special_tokens(list(SPECIAL_TOKENS + RESERVED_TOKENS))
    core.decoder = decoders.Fuse()
    core.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", vocab["<s>"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        model_max_length=4096,
        clean_up_tokenization_spaces=False,
    )


def save_tokenizer(directory: str | Path) -> None:
    build_tokenizer().save_pretrained(str(directory))

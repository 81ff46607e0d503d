"""A conversation that keeps one KV cache across turns: each turn prefills only its own tokens.

The tokens of a turn are what the chat template adds after the tokens the model saw and gave: the
closing of the last answer (less the end-of-turn token when the model gave it), then the difference between
the conversation rendered with the new message and without it. The model's own answer tokens stay as they
were generated, whatever the template does to their text. A template that re-renders earlier turns (the
conversation so far is not a prefix of the new rendering) gets the whole conversation prefilled again in a
new cache, and the turn says so (`refilled`). generate() then reads only the tokens the cache has not seen.

With a plan whose every head sees positions within its cache (`plan.distances_bounded`) the
conversation goes on at constant memory past the model's trained length; with any other plan a turn
that would take it past that length is refused (the conversation goes on: start over or ask less).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import StoppingCriteria, StoppingCriteriaList, TextStreamer

import duocal_runtime as dr


class TurnRefused(ValueError):
    """A turn the conversation cannot take (it goes on without it)."""


@dataclass
class TurnResult:
    answer: str
    new_tokens: int  # tokens the turn prefilled (its own, never the history)
    stopped: bool  # interrupted before the answer ended
    refilled: bool = False  # the template re-rendered earlier turns: the whole conversation was prefilled again


class _Stop(StoppingCriteria):
    def __init__(self, flag: threading.Event):
        self.flag = flag

    def __call__(self, input_ids, scores, **kwargs):
        return torch.full((input_ids.shape[0],), self.flag.is_set(), dtype=torch.bool, device=input_ids.device)


class _TextOut(TextStreamer):
    """transformers' streamer, handing each finished piece of text to `write`."""

    def __init__(self, tokenizer, write: Callable[[str], None]):
        super().__init__(tokenizer, skip_prompt=True, skip_special_tokens=True)
        self.write = write

    def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
        self.write(text)


class ChatSession:
    """`turn(text)` answers one message; `tokens`, `kv_bytes` say what the cache holds."""

    def __init__(self, model, tokenizer, runtime, trained_length: int, max_new_tokens: int = 256, system=None):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                f"{getattr(tokenizer, 'name_or_path', 'this tokenizer')} has no chat template: duocal chat needs an "
                "instruction-tuned model whose tokenizer has one"
            )
        self.model, self.tokenizer, self.runtime = model, tokenizer, runtime
        self.trained_length, self.max_new_tokens = trained_length, max_new_tokens
        self.system = system
        self.stop = threading.Event()
        self.reset()

    def reset(self) -> None:
        self.messages = [{"role": "system", "content": self.system}] if self.system else []
        self.ids: torch.Tensor | None = None  # every token of the conversation (the cache saw all but the last)
        self.cache = self.runtime.new_cache()

    @property
    def tokens(self) -> int:
        return 0 if self.ids is None else self.ids.shape[1]

    def kv_bytes(self) -> int:
        return self.cache.kv_bytes()

    def turn(self, text: str, write: Callable[[str], None] = lambda piece: None, **sampling) -> TurnResult:
        """Answer `text`, handing the answer's text to `write` as it is generated. Refuses (TurnRefused) a
        turn past the trained length of a plan that cannot go there; `self.stop.set()` ends the answer."""
        self.stop.clear()
        ids, refilled = self._with_turn(text)
        new_tokens = ids.shape[1] - (0 if refilled or self.ids is None else self.tokens)
        self._check_room(new_tokens, ids.shape[1] + self.max_new_tokens)
        if refilled:
            self.cache = self.runtime.new_cache()
        out = self.model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            cache=self.cache,
            max_new_tokens=self.max_new_tokens,
            streamer=_TextOut(self.tokenizer, write),
            stopping_criteria=StoppingCriteriaList([_Stop(self.stop)]),
            pad_token_id=self.tokenizer.eos_token_id,
            **({"do_sample": False} if not sampling else {"do_sample": True, **sampling}),
        )
        answer_ids = out[0, ids.shape[1] :]
        answer = self.tokenizer.decode(answer_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        self.ids = out
        self.messages += [{"role": "user", "content": text}, {"role": "assistant", "content": answer}]
        return TurnResult(answer, new_tokens, self.stop.is_set(), refilled)

    def _with_turn(self, text: str) -> tuple[torch.Tensor, bool]:
        """The conversation's tokens with the new message and the generation prompt added: the tokens the model
        saw and gave, then what the template adds after them; else (True) the whole conversation rendered
        again, for a new cache (a template that re-renders earlier turns)."""
        turn = [*self.messages, {"role": "user", "content": text}]
        added = None if self.ids is None else self._added_text(turn)
        if added is None:
            return self._tokens(self._render(turn, generation_prompt=True)), self.ids is not None
        return torch.cat([self.ids, self._tokens(added)], dim=1), False

    def _added_text(self, turn: list[dict]) -> str | None:
        """What the template adds after the last answer: its closing, the new message, the generation prompt.
        None where the conversation so far is not a prefix of the new rendering."""
        before, after = self._render(self.messages), self._render(turn, generation_prompt=True)
        closing = self._closing()
        if closing is None or not after.startswith(before):
            return None
        eos = self.tokenizer.eos_token
        if eos and closing.startswith(eos) and int(self.ids[0, -1]) == self.tokenizer.eos_token_id:
            closing = closing[len(eos) :]  # the model gave the end-of-turn token itself
        return closing + after[len(before) :]

    def _closing(self) -> str | None:
        """The template's text after an answer's content (None if it does not show the content as given)."""
        marker = "DuocalAnswerMarker7f3a"  # letters only: templates trim and escape contents
        rendered = self._render([*self.messages[:-1], {"role": "assistant", "content": marker}])
        return rendered[rendered.rindex(marker) + len(marker) :] if marker in rendered else None

    def _render(self, messages: list[dict], generation_prompt: bool = False) -> str:
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=False)

    def _tokens(self, text: str) -> torch.Tensor:
        ids = self.tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        return ids.to(next(self.model.parameters()).device)

    def _check_room(self, new_tokens: int, at_most: int) -> None:
        plan = self.runtime.plan
        if plan.distances_bounded or at_most <= self.trained_length:
            return
        full = sum(not p.cache_positions for row in plan.policies for p in row)
        raise TurnRefused(
            f"this turn ({new_tokens:,} tokens, up to {self.max_new_tokens:,} more in the answer) would take the "
            f"conversation to {at_most:,} tokens, past the model's trained length ({self.trained_length:,}): "
            f"{full} of {plan.num_heads} KV heads see original positions. Say less, /reset, or chat with --streaming "
            "(every head a sink window that sees positions within its cache: no length limit)"
        )


def streaming_plan(model_config, sink: int, recent: int) -> dr.Plan:
    """Every head a sink window that sees positions within its cache (StreamingLLM): a chat without end."""
    return dr.uniform_plan(dr.shape_of_config(model_config), dr.SinkWindow(sink, recent, positions="cache"))

"""What one request asks of sampling: OpenAI's `temperature` (0: greedy), `top_p`, `seed`, `presence_penalty`,
`frequency_penalty`, `logit_bias`, and vLLM's extensions `top_k`, `repetition_penalty`, `min_tokens`. Fields left
out take the model's generation config (as `generate()` reads it: greedy unless it says `do_sample`).

request_checks.py checks each field's type and range; this module checks what needs the model (token ids in
its vocabulary) or other fields (`min_tokens` at most the answer's length), and makes the settings the batched
step applies (batch_sampling.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

from .api_errors import ApiError

# Fields this module reads; transformers' handlers never see them (they would reseed torch's global generator
# for `seed`, and refuse the extensions as unexpected fields).
OPENAI_SAMPLING_FIELDS = ("temperature", "top_p", "seed", "presence_penalty", "frequency_penalty", "logit_bias")
EXTENSION_FIELDS = ("top_k", "repetition_penalty", "min_tokens")  # as vLLM accepts them
SAMPLING_FIELDS = OPENAI_SAMPLING_FIELDS + EXTENSION_FIELDS
ANSWER_LENGTH_FIELDS = ("max_completion_tokens", "max_tokens", "max_output_tokens")  # the first given wins
# Warpers of a generation config that the batched step does not apply (a warning at start-up says so).
UNSERVED_WARPERS = {"min_p": None, "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "top_h": None}
GREEDY_BELOW = 1e-5  # a smaller temperature is greedy, as in vLLM (dividing by it overflows to ties at inf)


@dataclass(frozen=True)
class SamplingSettings:
    """One request's sampling. temperature 0 (below `GREEDY_BELOW`) is greedy: top_p, top_k and seed then
    change nothing; top_k 0 or -1 is off; penalties and biases apply to greedy requests too (before the
    argmax), as in vLLM."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None  # None: drawn with torch's global generator, as transformers draws
    presence_penalty: float = 0.0  # subtracted once from the logit of every token generated so far
    frequency_penalty: float = 0.0  # subtracted per occurrence in the tokens generated so far
    repetition_penalty: float = 1.0  # divides positive (multiplies negative) logits of prompt and answer tokens
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit)
    min_tokens: int = 0  # end-of-sequence tokens are forbidden before this many tokens

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    @property
    def shapes_logits(self) -> bool:
        """Whether anything changes this request's logits before its token is chosen (besides temperature,
        top-k and top-p, which only sampled requests apply)."""
        return bool(
            self.presence_penalty
            or self.frequency_penalty
            or self.repetition_penalty != 1
            or self.logit_bias
            or self.min_tokens
        )

    @property
    def top_k_or_off(self) -> int:
        return max(self.top_k, 0)

    @classmethod
    def of_generation_config(cls, config) -> SamplingSettings:
        """The defaults a model's generation config gives (what `generate()` would do for a request)."""
        sample = bool(getattr(config, "do_sample", False))
        return cls(
            temperature=(config.temperature if config.temperature is not None else 1.0) if sample else 0.0,
            top_p=config.top_p if config.top_p is not None else 1.0,
            top_k=config.top_k or 0,
            repetition_penalty=config.repetition_penalty or 1.0,
            min_tokens=config.min_new_tokens or 0,
        )

    def asked(self, body: dict, vocab_size: int) -> SamplingSettings:
        """These defaults with the sampling fields of `body` (a checked request body) on top."""
        given = {field: body[field] for field in SAMPLING_FIELDS if body.get(field) is not None}
        if "logit_bias" in given:
            given["logit_bias"] = token_biases(given["logit_bias"], vocab_size)
        for field in ("temperature", "top_p", "presence_penalty", "frequency_penalty", "repetition_penalty"):
            if field in given:
                given[field] = float(given[field])
        settings = replace(self, **given)
        check_min_tokens(settings.min_tokens, body)
        return settings


def token_biases(logit_bias: dict, vocab_size: int) -> tuple[tuple[int, float], ...]:
    """`logit_bias` (token id strings to numbers, their form checked) as (id, bias) pairs; 400 for an id
    outside the vocabulary or named twice ("7" and "07")."""
    biases: dict[int, float] = {}
    for key, bias in logit_bias.items():
        token = int(key)
        if token >= vocab_size:
            raise ApiError(
                400, f"logit_bias: token id {token} is outside the vocabulary (0-{vocab_size - 1})", param="logit_bias"
            )
        if token in biases:
            raise ApiError(400, f"logit_bias names token id {token} twice", param="logit_bias")
        biases[token] = float(bias)
    return tuple(sorted(biases.items()))


def check_min_tokens(min_tokens: int, body: dict) -> None:
    lengths = [(field, body[field]) for field in ANSWER_LENGTH_FIELDS if body.get(field) is not None]
    if lengths and min_tokens > lengths[0][1]:
        field, most = lengths[0]
        raise ApiError(
            400, f"min_tokens must be at most {field} ({most}); got {json.dumps(min_tokens)}", param="min_tokens"
        )


def read_here(accepted: set[str]) -> frozenset[str]:
    """The sampling fields a route whose handler accepts `accepted` takes (those and the extensions): this
    module reads them, the handler never sees them. Others (a penalty on /v1/responses) stay in the body, for
    the handler to refuse as unexpected."""
    return frozenset(SAMPLING_FIELDS) & (accepted | set(EXTENSION_FIELDS))


def unserved_warpers(config) -> list[str]:
    """The sampling settings of a generation config that the batched step does not apply."""
    if not getattr(config, "do_sample", False):
        return []
    return [
        f"{name}={getattr(config, name)}"
        for name, neutral in UNSERVED_WARPERS.items()
        if getattr(config, name, None) not in (None, neutral)
    ]

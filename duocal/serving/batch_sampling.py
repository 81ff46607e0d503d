"""Per-request sampling in transformers' continuous batching: each request's settings (sampling_settings.py)
travel with it, and each row of a step's logits is processed and decoded as its own request asked.

Why not transformers' per-request warpers (`ContinuousBatchingLogitsProcessorList(per_request_processors=True)`):
in 5.24 they cover temperature, top-k and top-p only, and exist only when the server's generation config sets
them away from neutral; whether a step samples or takes the argmax is one flag for the whole batch
(`ModelRunner.do_sample`: a greedy request batched with sampled ones would be sampled), and every draw comes
from torch's global generator (a seed cannot hold in a batch: one request's draws depend on the others').
So one `BatchSampler` stands in for the batch's processor list, knowing which request each row belongs to, and
for the runner's sampler: a greedy row is the argmax of its logits (untouched unless it asked for a penalty,
a bias or `min_tokens`), a sampled row is drawn with its request's own generator when it has a seed (torch's
global one otherwise, as transformers draws).

Version-specific (transformers 5.24): `ContinuousBatchProcessor.logit_processor`, `ModelRunner.logit_processor`
and `ModelRunner._sample(scores, output_ids)`; the list's interface (`tensors_required`, `do_processing`,
`check_kwargs`, `fill_defaults`, `prepare_tensor_args`, `__call__`); a step's rows of logits are its requests
that have a new token, in order (`logits_indices`); `add_request(..., **kwargs)` keeps `kwargs` in the request's
`RequestState.logit_processor_kwargs`.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass

import torch

from . import logits_processing as lp
from .sampling_settings import SamplingSettings

KEY = "duocal_sampling"  # the request's RequestSampling, in its logit_processor_kwargs
OWNED_CONFIG_FIELDS = {  # cleared in the engine's generation config: requests decide them
    "do_sample": False,
    "temperature": None,
    "top_p": None,
    "top_k": None,
    "repetition_penalty": None,
    "min_new_tokens": None,
}


def engine_config(generation_config):
    """A copy of `generation_config` without what `SamplingSettings` decides per request, for the engine (which
    would otherwise also apply the model's warpers to every row)."""
    config = copy.deepcopy(generation_config)
    for name, value in OWNED_CONFIG_FIELDS.items():
        setattr(config, name, value)
    return config


class RequestSampling:
    """One request's settings and, for a seeded one, its generator (made at its first draw, on the device of the
    logits, from its seed: the same seed gives the same draws whatever else is in the batch)."""

    def __init__(self, settings: SamplingSettings):
        self.settings, self._generator = settings, None

    def generator(self, device: torch.device) -> torch.Generator | None:
        if self.settings.seed is None:
            return None
        if self._generator is None:
            self._generator = torch.Generator(device=device)
            self._generator.manual_seed(self.settings.seed)
        return self._generator


@dataclass(frozen=True)
class Row:
    """One row of a step's logits: its request and what it asked."""

    state: object  # transformers' RequestState
    sampling: RequestSampling

    @property
    def settings(self) -> SamplingSettings:
        return self.sampling.settings

    def prompt_and_answer(self) -> tuple[list[int], list[int]]:
        """The prompt and the tokens generated so far (a request prefilled again carries some in its prompt)."""
        state = self.state
        true_prompt = state._true_initial_tokens or len(state.initial_tokens)
        return state.initial_tokens[:true_prompt], state.initial_tokens[true_prompt:] + state.generated_tokens

    def eos_ids(self) -> list[int]:
        eos = self.state.eos_token_id
        ids = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
        return [i for i in ids if i >= 0]


def shaped(scores: torch.Tensor, row: Row) -> torch.Tensor:
    """`scores` [V] of `row` with its logit bias, `min_tokens` and penalties applied."""
    s, long = row.settings, {"dtype": torch.int64, "device": scores.device}
    prompt, answer = row.prompt_and_answer()
    if s.logit_bias:
        ids, biases = zip(*s.logit_bias, strict=True)
        scores = lp.add_bias(scores, torch.tensor(ids, **long), torch.tensor(biases, device=scores.device))
    eos = row.eos_ids()
    if len(answer) < s.min_tokens and eos:
        scores = lp.forbid(scores, torch.tensor(eos, **long))
    if (s.presence_penalty or s.frequency_penalty) and answer:
        counts = lp.token_counts(torch.tensor(answer, **long), scores.size(-1))
        scores = lp.penalize(scores, counts, s.presence_penalty, s.frequency_penalty)
    if s.repetition_penalty != 1 and (prompt or answer):
        scores = lp.repetition_penalize(scores, torch.tensor(prompt + answer, **long), s.repetition_penalty)
    return scores


def warped(scores: torch.Tensor, settings: list[SamplingSettings]) -> torch.Tensor:
    """`scores` [R, V] of sampled rows with their temperature, top-k and top-p applied."""
    device = scores.device
    scores = lp.scale(scores, torch.tensor([s.temperature for s in settings], device=device))
    cut = [i for i, s in enumerate(settings) if s.top_k > 0]
    if cut:
        k = torch.tensor([settings[i].top_k for i in cut], device=device)
        scores = scores.index_copy(0, torch.tensor(cut, device=device), lp.keep_top_k(scores[cut], k))
    cut = [i for i, s in enumerate(settings) if s.top_p < 1]
    if cut:
        p = torch.tensor([settings[i].top_p for i in cut], device=device)
        scores = scores.index_copy(0, torch.tensor(cut, device=device), lp.keep_top_p(scores[cut], p))
    return scores


class BatchSampler:
    """Stands in for a batch processor's `ContinuousBatchingLogitsProcessorList` (`base`, still applied first:
    what the model's generation config asks besides sampling) and for its runner's sampler. Requests without
    settings of their own (`generate_batch`) take `defaults`."""

    do_processing = True  # read by the runner each step: rows may need nothing, then __call__ changes nothing

    def __init__(self, base, defaults: SamplingSettings, vocab_size: int):
        self.base, self.defaults, self.vocab_size = base, defaults, vocab_size
        self.rows: list[Row] = []  # this step's rows of logits (set by prepare_tensor_args, on the worker thread)
        self.waiting: dict[str, SamplingSettings] = {}  # request id -> settings, until its add_request

    # --- the server's side
    def asked(self, body: dict) -> SamplingSettings:
        return self.defaults.asked(body, self.vocab_size)

    @contextlib.contextmanager
    def expecting(self, request_id: str, settings: SamplingSettings):
        """While the handler runs: its `add_request` for `request_id` carries `settings`."""
        self.waiting[request_id] = settings
        try:
            yield
        finally:
            self.waiting.pop(request_id, None)

    def adding(self, add_request):
        """`add_request` (the manager's) giving each request the settings its route registered."""

        def add_with_sampling(input_ids, request_id=None, *args, **kwargs):
            settings = self.waiting.get(request_id)
            if settings is not None:
                kwargs[KEY] = RequestSampling(settings)
            return add_request(input_ids, request_id, *args, **kwargs)

        return add_with_sampling

    # --- the processor list's interface
    @property
    def tensors_required(self) -> int:
        return self.base.tensors_required

    def check_kwargs(self, kwargs: dict) -> None:
        if KEY in kwargs and not isinstance(kwargs[KEY], RequestSampling):
            raise TypeError(f"{KEY} must be a RequestSampling, got {type(kwargs[KEY]).__name__}")
        self.base.check_kwargs({key: value for key, value in kwargs.items() if key != KEY})

    def fill_defaults(self, int32_tensor: torch.Tensor) -> None:
        self.base.fill_defaults(int32_tensor)

    def prepare_tensor_args(self, requests_in_batch, arg_storage: torch.Tensor) -> torch.Tensor:
        self.rows = [self.row(future.state) for future in requests_in_batch if future.has_new_token]
        return self.base.prepare_tensor_args(requests_in_batch, arg_storage)

    def row(self, state) -> Row:
        sampling = state.logit_processor_kwargs.setdefault(KEY, RequestSampling(self.defaults))
        return Row(state, sampling)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, tensor_args: torch.Tensor) -> torch.Tensor:
        """`scores` [N, V] (N >= len(rows): rows past them are padding) processed per row."""
        if self.base.do_processing:
            scores = self.base(input_ids, scores, tensor_args)
        shaping = [i for i, row in enumerate(self.rows) if row.settings.shapes_logits]
        if shaping:
            new = torch.stack([shaped(scores[i], self.rows[i]) for i in shaping])
            scores = scores.index_copy(0, torch.tensor(shaping, device=scores.device), new)
        drawn = [i for i, row in enumerate(self.rows) if not row.settings.greedy]
        if drawn:
            new = warped(scores[drawn], [self.rows[i].settings for i in drawn])
            scores = scores.index_copy(0, torch.tensor(drawn, device=scores.device), new)
        return scores

    # --- the runner's sampler
    def sample(self, scores: torch.Tensor, output_ids: torch.Tensor) -> None:
        """Each row's token into `output_ids[0]`: the argmax of `scores` [1, N, V], or a draw for sampled rows."""
        logits = scores[0]
        tokens = logits.argmax(dim=-1)  # [N]
        drawn = [i for i, row in enumerate(self.rows) if not row.settings.greedy]
        if drawn:
            # a logit at +inf (a tiny repetition penalty) would make the row NaN and fail the whole batch
            probs = logits[drawn].clamp(max=torch.finfo(logits.dtype).max).softmax(dim=-1)  # [R, V]
            unseeded = [j for j, i in enumerate(drawn) if self.rows[i].settings.seed is None]
            if unseeded:
                tokens[[drawn[j] for j in unseeded]] = lp.draw_tokens(probs[unseeded], None)
            for j, i in enumerate(drawn):
                generator = self.rows[i].sampling.generator(logits.device)
                if generator is not None:
                    tokens[i] = lp.draw_tokens(probs[j : j + 1], generator)[0]
        output_ids[0, : tokens.size(0)].copy_(tokens)


def install_batch_sampling(manager, defaults: SamplingSettings) -> BatchSampler:
    """Make `manager` (a continuous-batching manager, not started yet) sample per request; its requests then
    carry the settings their routes register with the returned sampler's `expecting`."""
    manager.cache  # noqa: B018 (duocal's manager makes its batch processor with its pool)
    processor = manager.batch_processor
    if processor.return_logprobs:
        raise ValueError("per-request sampling does not return log probabilities: leave return_logprobs off")
    sampler = BatchSampler(processor.logit_processor, defaults, manager.model.config.get_text_config().vocab_size)
    manager.logit_processor = processor.logit_processor = processor.model_runner.logit_processor = sampler
    processor.model_runner._sample = sampler.sample
    manager.add_request = sampler.adding(manager.add_request)
    return sampler

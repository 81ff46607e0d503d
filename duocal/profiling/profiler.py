"""The training-free profiler: per-head scores and kept-attention measurements from a model's own
attention on calibration data, written as a profile (`duocal profile`).

Data: passkey samples (one question each; the rows are the positions that predict the answer and
the retrieval score looks at the queried needle), chat prompts with their answer written out (the
`chat` format: data/chat_answers.py), or text windows of a text file (the rows are the last `text_rows`
positions of each text window; no retrieval score). The profile's scores (`score`, profile_scores.py)
are the answer's loss rise when one head streams (chat; a second pass with a backward pass,
measure/answer_loss.py), the retrieval score (other passkeys) or 1 − the sink window's kept share
(text); its measurements are
`retrieval`, `kept:<policy>` for sink_window, h2o, sink_h2o and snapkv at the same capacity per
head, and `error:full-kv8` / `error:full-kv4` (what KIVI codes change in a full head's output,
quantization_error.py), which let the mixed planner choose a width per head. snapkv is
query-aware, so its kept share depends on when the question comes (`protocol`, recorded in its
settings): `query-aware` selects at the end of the prompt (the question in it),
`query-agnostic` at the end of the context and again at the end of the question (eval's protocols).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

import torch
from transformers import DynamicCache

import duocal_runtime as dr
from duocal.data import PasskeyGenerator
from duocal.data.chat_answers import answered_chat
from duocal.data.chat_prompts import CHAT_DEPTHS, FRAMINGS, alternating, chat_prompts, check_chat_template
from duocal.data.needle_values import NUMBER, VALUE_KINDS, check_choices
from duocal.data.prompt_kinds import mixed_prompts, needs_template, prompt_mix
from duocal.measure.answer_loss import streaming_loss
from duocal.measure.chat_answer import check_chat
from duocal.measure.decoding import own_answer, question_start, right_answer
from duocal.measure.limits import Progress, refuse_beyond_positions
from duocal.measure.nested_order import order_from_answer_loss
from duocal.measure.text_windows import text_windows
from duocal.profiling import PROFILER_SEED
from duocal.profiling.attention_stats import recording
from duocal.profiling.head_scores import kept_keys, kept_share, retrieval_score, selected_by_passes, snapkv_kept
from duocal.profiling.loss_at_plan import check_loss_at_sparsity, loss_at_sparsity
from duocal.profiling.profile_scores import SCORE_METHODS, SCORES, chosen_scores
from duocal_runtime.profile.measurements import Measurement, error_name, kept_name
from duocal_runtime.quant.codes import default_group

# What the chat format's loss score scores (ProfilerConfig.answer): full attention's own greedy answer where it
# is right, else the written one ("right"); its own answer always ("own"); the written answer always ("written").
ANSWERS = ("right", "own", "written")


@dataclass(frozen=True)
class ProfilerConfig:
    data: str = "passkey"  # "passkey" or "text"
    text: str | None = None  # the text itself, for data="text"
    samples: int = 16  # passkey samples (or most text windows) per context
    contexts: tuple[int, ...] = (1024,)
    format: str = "digits"
    haystack: Any = "synthetic"
    num_passkeys: int | tuple[int, int] = 1
    seed: int = PROFILER_SEED
    sink: int = 64
    recent: int = 256
    text_rows: int = 64
    protocol: str = "query-aware"  # when snapkv's selection meets the question (module docstring)
    kv_bits: tuple[int, ...] = (8, 4)  # widths whose output error is measured on full heads
    depths: tuple[float, ...] = CHAT_DEPTHS  # the chat format: where the key sits in the haystack, in turn
    score: str | None = None  # SCORES; default: loss for the chat format, retrieval for passkeys, kept for text
    loss_at_sparsity: float | None = None  # the loss score with the gates at this sparsity's plan (loss_at_plan.py)
    answer: str = "right"  # what the chat format's loss score scores (ANSWERS)
    values: tuple[str, ...] = (NUMBER,)  # the chat format: the keys' kinds, mixed (data/prompt_kinds.py)
    framings: tuple[str, ...] = ("chat",)  # and framings: the chat template, plain text or both
    nested: bool = False  # the loss score's heads ordered sparsest plan first (measure/nested_order.py)

    @property
    def mixed(self) -> bool:
        """Whether the chat format's prompts mix kinds beyond README's numbers in the chat template."""
        return (self.values, self.framings) != ((NUMBER,), ("chat",))

    @property
    def haystacks(self) -> tuple:
        """The chat format's haystacks, prompts alternating between them (`haystack` may name several: a,b)."""
        if self.format == "chat" and isinstance(self.haystack, str):
            return tuple(h.strip() for h in self.haystack.split(","))
        return (self.haystack,)

    def __post_init__(self):
        if self.data not in ("passkey", "text") or (self.data == "text" and not self.text):
            raise ValueError("data must be 'passkey', or 'text' with the text given (--text FILE)")
        if self.samples < 1 or not self.contexts or min(self.contexts) < 2 or self.text_rows < 1:
            raise ValueError("samples, text_rows and every context must be positive (contexts at least 2 tokens)")
        dr.SinkWindow(self.sink, self.recent)  # checks the sizes
        if self.protocol not in ("query-aware", "query-agnostic"):
            raise ValueError(f"protocol must be 'query-aware' or 'query-agnostic', got {self.protocol!r}")
        if self.protocol == "query-agnostic" and self.data == "text":
            raise ValueError("text windows ask no question: the query-agnostic protocol needs passkey data")
        if self.score not in (None, *SCORES) or (self.data == "text" and self.score == "retrieval"):
            raise ValueError(f"score must be one of {', '.join(SCORES)} (text windows have no needle: no retrieval)")
        check_loss_at_sparsity(self.loss_at_sparsity, self.chosen_score)
        if self.nested and (self.chosen_score != "loss" or self.loss_at_sparsity is not None):
            raise ValueError(
                "--nested orders heads by the loss score at each plan: give no --loss-at-sparsity or --score"
            )
        if self.format == "chat":
            for haystack in self.haystacks:
                check_chat(self.depths, 1, self.protocol, "one", haystack)
            if len(set(self.haystacks)) != len(self.haystacks):
                raise ValueError(f"--haystack names a haystack twice: {self.haystack}")
            if self.num_passkeys != 1:
                raise ValueError("the chat format hides one key per prompt: leave --passkeys out")
            check_choices("--values", self.values, VALUE_KINDS)
            check_choices("--framing", self.framings, FRAMINGS)
        elif self.mixed:
            raise ValueError("--values and --framing mix the chat format's prompts: give --format chat")
        if self.answer not in ANSWERS:
            raise ValueError(f"answer must be one of {', '.join(ANSWERS)}, got {self.answer!r}")
        if not set(self.kv_bits) <= {8, 4} or len(set(self.kv_bits)) != len(self.kv_bits):
            raise ValueError(f"kv_bits must be distinct widths among 8 and 4 (16 has no error), got {self.kv_bits}")

    @property
    def chosen_score(self) -> str:
        if self.score is not None:
            return self.score
        return "kept" if self.data == "text" else "loss" if self.format == "chat" else "retrieval"

    @property
    def scores_own_answer(self) -> bool:
        """Whether the loss score scores full attention's own answer where it can (chat, `answer` own or right)."""
        return self.chosen_score == "loss" and self.format == "chat" and self.answer != "written"

    def policies(self) -> list[dr.HeadPolicy]:
        """The policies whose kept share is measured: the sink window, H2O with the same capacity per
        head (half heavy hitters, half recent, as in the H2O paper), and those H2O sizes plus the sinks
        and SnapKV with its observation window of 32 (a quarter of a smaller capacity): the sizes `dr.plan` gives
        these policies from the profile's deploy defaults)."""
        capacity = self.sink + self.recent
        h2o = dr.H2O.halves(capacity)
        return [
            dr.SinkWindow(self.sink, self.recent),
            h2o,
            dr.SinkH2O(self.sink, h2o.heavy, h2o.recent),
            dr.SnapKV.keeping(capacity),
        ]

    def quantized(self, head_dim: int) -> list[dr.Full]:
        """The quantized full heads whose output error is measured (groups as `dr.plan` makes them)."""
        return [dr.Full.storing(bits, default_group(head_dim)) for bits in self.kv_bits]


@dataclass(frozen=True)
class ProfiledSequence:
    ids: list[int]
    rows: list[int]  # the query positions scored
    spans: list[tuple[int, int]] | None  # the needle each row answers about (passkey data)
    pass_ends: tuple[int, ...]  # where snapkv's prefill passes end (the protocol)
    answer_rows: list[int] | None = None  # the rows whose next tokens the loss score scores (default: rows)
    key: int | str | None = None  # the chat format: the pass key the answer gives

    @property
    def loss_rows(self) -> list[int]:
        return self.rows if self.answer_rows is None else self.answer_rows


def sequences(tokenizer, config: ProfilerConfig):
    """A `ProfiledSequence` for every sample of every context."""
    for context in config.contexts:
        if config.data == "text":
            for text_window in text_windows(tokenizer, config.text, context, config.samples):
                rows = list(range(context - min(config.text_rows, context - 1), context))
                yield ProfiledSequence(text_window.tolist(), rows, None, (rows[0] + 1,))
            continue
        if config.format == "chat":
            yield from chat_sequences(tokenizer, config, context)
            continue
        generator = PasskeyGenerator(
            tokenizer,
            context_length=context,
            num_passkeys=config.num_passkeys,
            questions="one",
            haystack=config.haystack,
            format=config.format,
            seed=config.seed,
        )
        for sample in generator.samples(config.samples):
            (answer,) = sample.answers
            needle = sample.needles[answer.needle]
            rows = list(answer.predict_positions)
            ends = (answer.start,) if config.protocol == "query-aware" else (question_start(sample), answer.start)
            yield ProfiledSequence(list(sample.input_ids), rows, [(needle.start, needle.end)] * len(rows), ends)


def chat_sequences(tokenizer, config: ProfilerConfig, context: int):
    """The chat format: prompts of at most `context` tokens, alternating between the haystacks (or mixing every
    kind asked, `ProfilerConfig.mixed`), each with its answer written out; the rows predict the answer's key, the
    pass ends where the prompt does (the question is in it)."""
    mix = prompt_mix(config.values, config.framings, config.haystacks)
    if needs_template(mix):
        check_chat_template(tokenizer, "give --framing plain" if config.mixed else "use --format digits")
    if config.mixed:
        prompts = mixed_prompts(tokenizer, config.samples, context, config.seed, mix, depths=config.depths)
    else:
        asked = alternating(config.samples, config.haystacks)
        prompts = [p for h, n in asked for p in chat_prompts(tokenizer, context, n, config.depths, h, config.seed)]
    for prompt in prompts:
        sample = answered_chat(tokenizer, prompt)
        spans = [sample.needle] * len(sample.rows)
        answer = list(range(sample.prompt_end - 1, len(sample.ids) - 1))  # every token of the answer
        yield ProfiledSequence(sample.ids, sample.rows, spans, (sample.prompt_end,), answer, prompt.key)


@dataclass
class Measured:
    """What the attention pass gives: the mean per-head measures, name -> [L, G] (`retrieval` only for passkey
    data), and the (token ids, answer rows) of every sequence as the loss score scores it (chat: full attention's
    own answer or the written one, `ProfilerConfig.answer`) with how many are the written answer."""

    means: dict[str, torch.Tensor]
    scored: list[tuple[list[int], list[int]]]
    written: int = 0


@torch.no_grad()
def measure(model, tokenizer, config: ProfilerConfig, progress: Progress | None = None) -> Measured:
    """The attention pass over every sequence; `progress(done, total, what)` after each (total: the most
    sequences; text may give fewer text windows). Where the loss score scores full attention's own answer, the
    pass keeps its cache and the answer is decoded from it (one prefill less per prompt)."""
    shape = dr.shape_of_config(model.config)
    policies = config.policies()
    sums: dict[str, torch.Tensor] = {}
    scored, written = [], 0
    device = next(model.parameters()).device
    most = config.samples * len(config.contexts)
    report = progress or (lambda done, total, what: None)
    report(0, most, "sequences measured")
    for seq in sequences(tokenizer, config):
        cache = DynamicCache(config=model.config) if config.scores_own_answer else None
        with recording(model, recorded_rows(seq, policies), config.quantized(shape.head_dim), len(seq.rows)) as stats:
            ids = torch.tensor([seq.ids], device=device)
            model(input_ids=ids, use_cache=cache is not None, cache=cache, logits_to_keep=1)
        for name, value in sample_measures(stats, seq, policies, shape).items():
            sums[name] = sums.get(name, 0) + value
        answer, is_written = scored_answer(model, tokenizer, seq, config.answer, cache)
        scored.append(answer)
        written += is_written
        report(len(scored), max(most, len(scored)), "sequences measured")
    if len(scored) < most:
        report(len(scored), len(scored), "sequences measured")
    return Measured({name: total / len(scored) for name, total in sums.items()}, scored, written)


def observation_windows(seq: ProfiledSequence, policies) -> dict[int, range]:
    """Pass end -> the queries whose attention snapkv's selection at that end sums (none without snapkv)."""
    snapkv = next((p for p in policies if isinstance(p, dr.SnapKV)), None)
    if snapkv is None:
        return {}
    return {end: range(max(0, end - snapkv.window), end) for end in seq.pass_ends}


def recorded_rows(seq: ProfiledSequence, policies) -> list[int]:
    """The scored rows first, then every observation window's queries not among them."""
    extra = sorted({q for observed in observation_windows(seq, policies).values() for q in observed} - set(seq.rows))
    return [*seq.rows, *extra]


def observation_mass(policy: dr.SnapKV, seq: ProfiledSequence, layer, position: dict[int, int], rep: int):
    """Pass end -> [G, T]: its observation window's attention in one layer, summed over the window's
    queries and each group's `rep` query heads (`position`: recorded row index of each query)."""
    return {
        end: layer.rows[:, [position[q] for q in observed]].sum(1).unflatten(0, (-1, rep)).sum(1)
        for end, observed in observation_windows(seq, [policy]).items()
    }


def layer_kept(policy, seq: ProfiledSequence, layer, position: dict[int, int], rep: int) -> torch.Tensor:
    """[G]: the mean share of the scored rows' attention that `policy` keeps in one layer."""
    if isinstance(policy, dr.SnapKV):
        held = selected_by_passes(policy, seq.pass_ends, observation_mass(policy, seq, layer, position, rep))
        keeps = lambda row: snapkv_kept(policy, row, held, seq.pass_ends[-1])  # noqa: E731
    else:
        keeps = lambda row: kept_keys(policy, row, layer.column_mass)  # noqa: E731
    return kept_share(keeps, seq.rows, layer.rows[:, : len(seq.rows)])


def sample_measures(stats, seq: ProfiledSequence, policies, shape: dr.ModelShape) -> dict[str, torch.Tensor]:
    layers = [stats.layers[i] for i in range(shape.num_hidden_layers)]
    position = {q: a for a, q in enumerate(recorded_rows(seq, policies))}
    rep = shape.num_attention_heads // shape.num_key_value_heads
    out = {kept_name(p.name): torch.stack([layer_kept(p, seq, s, position, rep) for s in layers]) for p in policies}
    for label in layers[0].errors:
        out[error_name(label)] = torch.stack([s.errors[label] for s in layers])
    if seq.spans is not None:
        scored = [s.rows[:, : len(seq.rows)] for s in layers]
        out["retrieval"] = torch.stack([retrieval_score(r, seq.spans, shape.num_key_value_heads) for r in scored])
    return out


def check_contexts_fit(config: ProfilerConfig, model_config) -> None:
    """Refuse contexts beyond the model's positions before any work (evaluation and calibration do too)."""
    refuse_beyond_positions(config.contexts, model_config, "measure at most that many tokens")


def profile_model(
    model, tokenizer, config: ProfilerConfig, model_name: str | None = None, progress: Progress | None = None
) -> dr.Profile:
    """Measure and build the profile, its scores as `config.chosen_score` says; `progress(done, total,
    what)` over both passes (the attention measurements, then the answer loss for the `loss` score)."""
    check_contexts_fit(config, model.config)
    report = progress or (lambda done, total, what: None)
    passes = 2 if config.chosen_score == "loss" else 1
    started = time.perf_counter()
    measured = measure(model, tokenizer, config, lambda done, total, what: report(done, total * passes, what))
    means, scored_with = measured.means, {}
    if passes == 2:
        means["loss"], scored_with = answer_loss_score(model, measured, config, report)
    seconds = time.perf_counter() - started
    settings = {"data": config.data, "samples": config.samples, "contexts": list(config.contexts), "seed": config.seed}
    shape = dr.shape_of_config(model.config)
    policies = {kept_name(p.name): p for p in config.policies()}
    policies |= {error_name(p.label): p for p in config.quantized(shape.head_dim)}
    measurements = {
        name: Measurement(_table(values), {**settings, **policy_settings(policies.get(name), config)}, "profiler")
        for name, values in means.items()
        if name != "loss"
    }
    archs = getattr(model.config, "architectures", None) or [None]
    info = dr.ModelInfo(shape, model_name, None, archs[0])
    deploy = dr.DeployDefaults.of(*config.policies(), sparsity=config.loss_at_sparsity or 0.5)  # ranked for it
    source = {"kind": "profiler", "method": SCORE_METHODS[config.chosen_score], "score": config.chosen_score}
    source |= {**settings, **scored_with, "format": config.format, "seconds": round(seconds, 2)}
    if config.format == "chat":
        source |= {"haystacks": list(map(str, config.haystacks))}
        if config.mixed:
            source |= {"values": list(config.values), "framings": list(config.framings)}
        if config.chosen_score == "loss":
            source |= {"answer": config.answer}
    return dr.Profile(info, _table(chosen_scores(means, config.chosen_score)), source, deploy, measurements)


def answer_loss_score(model, measured: Measured, config: ProfilerConfig, report: Progress) -> tuple[torch.Tensor, dict]:
    """([L, G], what the source records): streaming_loss over the attention pass's scored sequences, at g = 1 or
    at `config.loss_at_sparsity`'s plan; progress continues the attention pass's count."""
    pairs = measured.scored
    recorded = {"written_answers": measured.written} if config.scores_own_answer and config.answer == "right" else {}
    sink_window = dr.SinkWindow(config.sink, config.recent)
    what = "sequences scored by answer loss"
    if config.nested:
        progress = lambda done, total: report(len(pairs) + done, len(pairs) + total, what)  # noqa: E731
        order = order_from_answer_loss(model, pairs, sink_window, progress)
        shape = dr.shape_of_config(model.config)
        return torch.tensor(order.scores(shape)), {**recorded, **order.source(shape.num_key_value_heads)}
    if config.loss_at_sparsity is None:
        scores = streaming_loss(model, pairs, sink_window, lambda done: report(len(pairs) + done, 2 * len(pairs), what))
        return scores, recorded
    progress = lambda done, total: report(len(pairs) + done, len(pairs) + total, what)  # noqa: E731
    ranked = loss_at_sparsity(model, pairs, sink_window, config.loss_at_sparsity, progress)
    return ranked.scores, {**recorded, **ranked.source}


def scored_answer(model, tokenizer, seq: ProfiledSequence, answer: str, cache=None) -> tuple[tuple, bool]:
    """((the token ids, the answer rows) the loss score scores, whether that is the written answer): without a
    `cache` (the answer is not the model's own) the sequence as written; else full attention's own greedy answer
    decoded from `cache` (its pass over the sequence), or for `right` the written answer where its own is not
    right (`ChatAnswer.right`: not exact, or garbled before the key). Scored on its own wrong answers ("The pass
    key is the name of a specific type of pass"), the loss ranks the heads that keep that answer (on SmolLM2 such
    a profile lost 12 of 22 of full attention's right answers at 0.75 on held-out prompts; scored on the right
    answer, none)."""
    if cache is None:
        return (seq.ids, seq.loss_rows), False
    prompt_end = seq.loss_rows[0] + 1
    if answer == "right":
        return right_answer(model, tokenizer, seq.ids, prompt_end, seq.key, cache)
    return own_answer(model, seq.ids, prompt_end, tokenizer.eos_token_id, cache), False


def policy_settings(policy: dr.HeadPolicy | None, config: ProfilerConfig) -> dict[str, Any]:
    """What a kept-share measurement was taken at: the policy's sizes, and the protocol for snapkv."""
    if policy is None:
        return {}
    return {"policy": policy.to_dict(), **({"protocol": config.protocol} if isinstance(policy, dr.SnapKV) else {})}


def _table(values: torch.Tensor) -> list[list[float]]:
    return values.clamp(0.0, 1.0).double().tolist()


def with_measurements(base: dr.Profile, measured: dr.Profile) -> dr.Profile:
    """`base`'s scores and source, `measured`'s measurements, and deploy sizes that plan the measured
    policies (`duocal profile --scores-from`): one profile serves `duo` (its gates) and `mix`."""
    deploy = replace(base.deploy, sizes={**base.deploy.sizes, **measured.deploy.sizes})
    source = {**base.source, "measured_by": measured.source}
    return replace(base, source=source, deploy=deploy, measurements=measured.measurements)

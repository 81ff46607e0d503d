"""`duocal serve` samples per request (issue 47, item 1): temperature, top_p, top_k, seed, the penalties,
logit_bias and min_tokens of each request, greedy requests batched with sampled ones keeping their tokens; bad
values are a 400 naming the field. Against a real server on 127.0.0.1 (the demo model: a character-level
tokenizer, so a character is a token), and the batch sampler and its arithmetic on their own."""

import json
import threading
from collections import Counter

import openai
import pytest
import torch

from duocal.serving import logits_processing as lp
from duocal.serving.batch_sampling import KEY, BatchSampler, RequestSampling
from duocal.serving.sampling_settings import SamplingSettings

from helpers.serving import NAME, call, pool_is_whole

PROMPT = "the passkey is"
EOS = 2  # the demo model's end-of-sequence token


def completion(base, **fields) -> dict:
    status, body, _ = call(
        base, "POST", "/v1/completions", {"model": NAME, "prompt": PROMPT, "max_tokens": 24, **fields}
    )
    assert status == 200, body
    return json.loads(body)


def text(base, **fields) -> str:
    return completion(base, **fields)["choices"][0]["text"]


def repeats(answer: str) -> int:
    """How many of the answer's tokens (characters here) repeat an earlier one."""
    return len(answer) - len(set(answer))


def test_a_seed_gives_the_same_text_and_other_seeds_other_texts(demo_server):
    served, _, base = demo_server
    sampled = {"temperature": 1.2, "seed": 11}
    first = text(base, **sampled)
    assert text(base, **sampled) == first
    status, body, _ = call(
        base, "POST", "/v1/completions", {"prompt": PROMPT, "max_tokens": 24, "stream": True, **sampled}
    )
    events = [json.loads(e.removeprefix("data: ")) for e in body.decode().split("\n\n") if e.startswith("data: {")]
    assert status == 200 and "".join(e["choices"][0]["text"] for e in events) == first  # streamed: the same
    others = {text(base, temperature=1.2, seed=seed) for seed in range(4)}
    assert len(others | {first}) >= 3  # sampling, not the argmax under another name
    assert text(base) not in others
    assert pool_is_whole(served)


@pytest.mark.parametrize(
    "fields", [{"temperature": 0}, {"temperature": 1e-6}, {"temperature": 0, "top_p": 0.1, "seed": 3}, {"top_k": 1}]
)
def test_temperature_0_and_top_k_1_are_greedy(demo_server, fields):
    _, _, base = demo_server
    greedy = text(base)
    assert text(base, **{"temperature": 1.5, **fields}) == greedy


def test_a_logit_bias_of_minus_100_on_the_greedy_token_changes_it(demo_server):
    _, _, base = demo_server
    from duocal.models import ModelRef

    greedy = text(base)
    first = ModelRef.resolve(None).load_tokenizer().encode(greedy[0], add_special_tokens=False)[0]
    biased = text(base, logit_bias={str(first): -100})
    assert biased[0] != greedy[0] and greedy[0] not in biased  # never chosen again
    assert set(text(base, logit_bias={str(first): 100}, max_tokens=6)) == {greedy[0]}  # +100: always chosen


@pytest.mark.parametrize(
    "penalty", [{"frequency_penalty": 2}, {"presence_penalty": 2}, {"repetition_penalty": 1.8}], ids=str
)
def test_a_penalty_makes_a_repetitive_greedy_answer_repeat_less(demo_server, penalty):
    _, _, base = demo_server
    greedy = text(base)
    assert repeats(greedy) >= 10  # 24 tokens from a 128-token vocabulary: repetitive
    penalized = text(base, **penalty)
    assert penalized != greedy and repeats(penalized) < repeats(greedy)


def test_min_tokens_holds_the_end_of_sequence_back(demo_server):
    _, _, base = demo_server
    ending = {"logit_bias": {str(EOS): 100}}
    answer = completion(base, **ending)
    assert answer["choices"][0]["text"] == "" and answer["choices"][0]["finish_reason"] == "stop"
    answer = completion(base, **ending, min_tokens=5)
    assert answer["choices"][0]["text"] == text(base)[:5] and answer["choices"][0]["finish_reason"] == "stop"


def test_a_batch_mixing_greedy_and_sampled_requests_keeps_each_ones_tokens(demo_server, monkeypatch):
    served, _, base = demo_server
    bodies = [{}, {"temperature": 1.0, "seed": 5}, {"temperature": 0.8, "top_p": 0.9}, {"temperature": 1.3}]
    bodies += [{"temperature": 0.7, "top_k": 5, "frequency_penalty": 1}, {}]
    alone = [text(base, max_tokens=48, **body) for body in bodies[:2]]
    sampler, mixes = served.manager.logit_processor, []
    prepare = sampler.prepare_tensor_args

    def recorded(requests_in_batch, arg_storage):
        out = prepare(requests_in_batch, arg_storage)
        mixes.append({row.settings.greedy for row in sampler.rows})
        return out

    monkeypatch.setattr(sampler, "prepare_tensor_args", recorded)
    answers, start = [None] * len(bodies), threading.Barrier(len(bodies))

    def ask(i):
        start.wait()
        answers[i] = text(base, max_tokens=48, **bodies[i])

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(bodies))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert {True, False} in mixes  # some steps did batch greedy and sampled rows
    assert answers[0] == answers[-1] == alone[0]  # greedy: exactly its tokens alone
    assert answers[1] == alone[1]  # seeded: the same draws whatever else is in the batch
    assert pool_is_whole(served)


def test_the_openai_client_gets_the_same_text_twice_with_a_seed(demo_server):
    _, _, base = demo_server
    client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=120)
    asked = {"model": NAME, "prompt": PROMPT, "max_tokens": 24, "temperature": 0.7, "top_p": 0.9, "seed": 1}
    first = client.completions.create(**asked).choices[0].text
    assert client.completions.create(**asked).choices[0].text == first
    greedy = client.completions.create(model=NAME, prompt=PROMPT, max_tokens=24).choices[0].text
    assert client.completions.create(**asked, extra_body={"top_k": 1}).choices[0].text == greedy


BAD = [
    ("temperature", 2.5, "temperature must be a number from 0 to 2"),
    ("temperature", "hot", "temperature must be a number"),
    ("top_p", 0, "top_p must be a number above 0 and at most 1"),
    ("top_p", 1.5, "top_p must be a number above 0"),
    ("top_k", -2, "top_k must be an integer"),
    ("top_k", 2.5, "top_k must be an integer"),
    ("presence_penalty", 3, "presence_penalty must be a number from -2 to 2"),
    ("frequency_penalty", -2.5, "frequency_penalty must be a number from -2 to 2"),
    ("repetition_penalty", 0, "repetition_penalty must be a number above 0"),
    ("repetition_penalty", 2.5, "repetition_penalty must be a number above 0 and at most 2"),
    ("logit_bias", {"128": 1}, "token id 128 is outside the vocabulary (0-127)"),
    ("logit_bias", {"5": 101}, "numbers from -100 to 100"),
    ("logit_bias", {"-5": 1}, "an object of token ids"),
    ("logit_bias", {"²": 1}, "an object of token ids"),
    ("logit_bias", {"7": 1, "07": 2}, "names token id 7 twice"),
    ("min_tokens", -1, "min_tokens must be a non-negative integer"),
    ("min_tokens", 25, "min_tokens must be at most max_tokens (24)"),
    ("seed", "one", "seed must be an integer"),
]


@pytest.mark.parametrize("field, value, words", BAD, ids=[f"{f}={v}" for f, v, _ in BAD])
def test_a_bad_sampling_value_is_a_400_naming_the_field(demo_server, field, value, words):
    served, _, base = demo_server
    status, body, _ = call(base, "POST", "/v1/completions", {"prompt": PROMPT, "max_tokens": 24, field: value})
    error = json.loads(body)["error"]
    assert status == 400 and error["param"] == field and words in error["message"], body
    assert pool_is_whole(served)


def test_a_route_reads_only_the_sampling_fields_of_its_api():
    """/v1/responses has no penalties or logit_bias in OpenAI's API: they stay for its handler to refuse."""
    from transformers.cli.serving.response import ResponseHandler

    from duocal.serving.sampling_settings import read_here

    own = read_here(set(ResponseHandler._valid_params_class.__mutable_keys__))
    assert own == {"temperature", "top_p", "seed", "top_k", "repetition_penalty", "min_tokens"}


def test_a_sampling_model_config_gives_the_defaults_and_a_request_overrides_them():
    from transformers import GenerationConfig

    model = SamplingSettings.of_generation_config(
        GenerationConfig(do_sample=True, temperature=0.6, top_p=0.9, top_k=20)
    )
    assert model == SamplingSettings(temperature=0.6, top_p=0.9, top_k=20)
    assert SamplingSettings.of_generation_config(GenerationConfig(temperature=0.6)).greedy  # no do_sample: greedy
    asked = model.asked({"temperature": 0, "seed": 4, "logit_bias": {"9": -1, "3": 2}, "top_k": -1}, vocab_size=10)
    assert asked == SamplingSettings(0.0, 0.9, -1, 4, logit_bias=((3, 2.0), (9, -1.0)))


# --- the batch sampler and its arithmetic, without a server


def fake_step(sampler, rows_settings, generated):
    """Give `sampler` one step whose rows are requests with `rows_settings` (None: no settings of their own)."""
    from transformers.generation.continuous_batching.requests import FutureRequestState, RequestState

    futures = []
    for i, settings in enumerate(rows_settings):
        kwargs = {} if settings is None else {KEY: settings}
        state = RequestState(f"r{i}", [1, 5, 6], eos_token_id=EOS, logit_processor_kwargs=kwargs)
        state.generated_tokens = list(generated[i])
        futures.append(FutureRequestState(state, has_new_token=True, complete_blocks={}, query_length=1))
    sampler.prepare_tensor_args(futures, torch.empty(0, 8, dtype=torch.int32))


class NoBase:
    tensors_required, do_processing = 0, False

    def prepare_tensor_args(self, requests, arg_storage):
        return arg_storage


LOGITS = torch.randn(6, 4, 12, generator=torch.Generator().manual_seed(0))  # [steps, rows, vocab]


def run_steps(rows, logits):
    """The tokens each of `rows` takes over the steps of `logits` [steps, rows, V]: [rows][steps]."""
    sampler = BatchSampler(NoBase(), SamplingSettings(), logits.size(-1))
    out, generated = [], [[] for _ in rows]
    for step_logits in logits:
        fake_step(sampler, rows, generated)
        output = torch.zeros(2, len(rows), dtype=torch.int64)
        sampler.sample(sampler(None, step_logits.clone(), None).unsqueeze(0), output)
        out.append(output[0].tolist())
        for i, token in enumerate(output[0].tolist()):
            generated[i].append(token)
    return [list(column) for column in zip(*out, strict=True)]


def test_greedy_rows_are_the_argmax_and_a_seeded_row_draws_the_same_among_others():
    seeded = RequestSampling(SamplingSettings(temperature=1.0, seed=9))
    tokens = run_steps([None, seeded, RequestSampling(SamplingSettings(temperature=2.0)), None], LOGITS)
    greedy = LOGITS.argmax(-1).T.tolist()  # [rows][steps]
    assert tokens[0] == greedy[0] and tokens[3] == greedy[3]  # no settings: the defaults, greedy
    assert tokens[1] != greedy[1]  # drawn (at temperature 1 from random logits: not the argmax every time)
    alone = run_steps([RequestSampling(SamplingSettings(temperature=1.0, seed=9))], LOGITS[:, 1:2])
    assert tokens[1] == alone[0]


def test_shaping_a_greedy_row_leaves_the_others_bitwise_as_they_were():
    sampler = BatchSampler(NoBase(), SamplingSettings(), 12)
    fake_step(sampler, [None, RequestSampling(SamplingSettings(frequency_penalty=1.0, min_tokens=3))], [[4, 4], [4]])
    scores = torch.randn(3, 12)  # a third row: padding, past the rows
    out = sampler(None, scores.clone(), None)
    assert torch.equal(out[0], scores[0]) and torch.equal(out[2], scores[2])
    assert out[1, 4] == scores[1, 4] - 1 and out[1, EOS] == float("-inf")


def test_top_k_and_top_p_keep_the_most_likely_tokens():
    scores = torch.tensor([[1.0, 5.0, 3.0, 2.0], [1.0, 5.0, 3.0, 2.0]])
    kept = lp.keep_top_k(scores, torch.tensor([2, 0])).isfinite()
    assert kept.tolist() == [[False, True, True, False], [True] * 4]
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]] * 3)
    kept = lp.keep_top_p(probs.log(), torch.tensor([0.7, 0.5, 1.0])).isfinite()
    assert kept.tolist() == [[True, True, False, False], [True, False, False, False], [True] * 4]


def test_the_penalties_are_openais_and_ctrls():
    scores = torch.tensor([2.0, -2.0, 1.0, 0.5])
    counts = lp.token_counts(torch.tensor([0, 0, 1]), 4)
    assert lp.penalize(scores, counts, presence=0.5, frequency=0.25).tolist() == [1.0, -2.75, 1.0, 0.5]
    assert lp.repetition_penalize(scores, torch.tensor([0, 1, 1]), 2.0).tolist() == [1.0, -4.0, 1.0, 0.5]
    assert Counter(lp.forbid(scores, torch.tensor([3])).tolist())[float("-inf")] == 1
    assert lp.add_bias(scores, torch.tensor([2]), torch.tensor([-1.5])).tolist() == [2.0, -2.0, -0.5, 0.5]


def test_a_row_with_a_logit_at_infinity_still_draws_and_fails_nobody():
    """A tiny repetition penalty divides a logit to +inf: softmax would make the row NaN, and the draw would
    fail every request of the batch."""
    sampler = BatchSampler(NoBase(), SamplingSettings(), 12)
    fake_step(sampler, [RequestSampling(SamplingSettings(temperature=1.0, seed=1)), None], [[], []])
    scores = torch.randn(2, 12)
    scores[0, 3] = scores[0, 7] = float("inf")
    output = torch.zeros(2, 2, dtype=torch.int64)
    sampler.sample(scores.unsqueeze(0), output)
    assert output[0, 0] in (3, 7) and output[0, 1] == scores[1].argmax()

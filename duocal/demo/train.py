"""Train the bundled demo model from a recipe (see recipes/demo_model.yaml for the method).

    OMP_NUM_THREADS=1 python -m duocal.demo.train recipes/demo_model.yaml [key=value ...]

Writes the model, its tokenizer and ``training.json`` (the resolved recipe, the stages' steps and
accuracies, the held-out exact match per context and the attention of every KV head on the
queried needle) into ``output_dir``.
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml

from duocal.calibrate.overrides import apply_overrides
from duocal.data import PasskeyGenerator, PasskeySample, SyntheticFiller, TokenKind, collate, get_format
from duocal.data.passkey_formats import DEMO_KEYS
from duocal.demo.tokenizer import build_tokenizer
from duocal.eval.retrieval_heads import needle_attention, top_heads
from duocal_runtime import compat


def load_training_recipe(path: str | Path, overrides: list[str] = ()) -> dict:
    """The YAML recipe with ``key=value`` overrides applied (dotted keys reach nested fields)."""
    return apply_overrides(yaml.safe_load(Path(path).read_text()), list(overrides))


def build_model(model_config: dict, tokenizer) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **model_config,
    )
    return LlamaForCausalLM(config)


def demo_generator(tokenizer, data: dict, context, seed: int, keys: str = "values", questions: str = "all"):
    """A generator of the demo model's data (``keys``: ``separate`` symbols or drawn from the ``values``)."""
    fmt = get_format(data["format"])
    if keys == "separate":
        fmt = fmt.replace(keys=DEMO_KEYS)
    elif keys != "values":
        raise ValueError(f"stage keys must be 'separate' or 'values', got {keys!r}")
    return PasskeyGenerator(
        tokenizer,
        context_length=tuple(context) if not isinstance(context, int) else context,
        num_passkeys=tuple(data["num_passkeys"]),
        depth=tuple(data["depth"]),
        questions=questions,
        haystack=SyntheticFiller(**data.get("filler", {})),
        format=fmt,
        seed=seed,
    )


def token_weights(samples: list[PasskeySample], width: int, weights: dict) -> torch.Tensor:
    """Loss weight of every target token, ``[B, width]`` (0 where nothing is predictable)."""
    by_kind = torch.zeros(len(TokenKind))
    by_kind[TokenKind.HAYSTACK] = weights["haystack"]
    by_kind[TokenKind.ANSWER] = weights["answer"]
    out = torch.zeros(len(samples), width)
    for row, s in enumerate(samples):
        out[row, : len(s)] = by_kind[torch.tensor(s.kinds)]
    return out


def weighted_loss(logits: torch.Tensor, input_ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    # logits: [B, T, V]; token t+1 is predicted at position t
    ce = F.cross_entropy(logits[:, :-1].flatten(0, 1), input_ids[:, 1:].flatten(), reduction="none")
    w = weights[:, 1:].flatten()
    return (ce * w).sum() / w.sum().clamp_min(1.0)


@torch.no_grad()
def answer_accuracy(model, samples: list[PasskeySample], pad_token_id: int, batch_size: int = 16) -> dict:
    """Teacher-forced accuracy on the answers: ``exact`` (every token right), ``token``, and ``by_position``.

    ``exact`` equals greedy exact match: greedy decoding reproduces an answer exactly when each of
    its tokens is the argmax after the correct earlier ones.
    """
    exact, total, by_position = 0, 0, torch.zeros(0)
    for i in range(0, len(samples), batch_size):
        chunk = samples[i : i + batch_size]
        ids = collate(chunk, pad_token_id)["input_ids"]
        predicted = model(input_ids=ids).logits.argmax(-1)  # [B, T]
        for row, s in enumerate(chunk):
            for a in s.answers:
                right = predicted[row, a.start - 1 : a.end - 1] == torch.tensor(a.ids)  # [answer length]
                if by_position.numel() < right.numel():
                    by_position = torch.cat([by_position, torch.zeros(right.numel() - by_position.numel())])
                by_position[: right.numel()] += right
                exact += bool(right.all())
                total += 1
    by_position = (by_position / total).tolist()
    return {"exact": exact / total, "token": sum(by_position) / len(by_position), "by_position": by_position}


@torch.no_grad()
def greedy_exact_match(model, samples: list[PasskeySample], new_cache=None) -> float:
    """Greedy-decode each sample's first answer from its prompt with ``model.generate``; exact-match rate.

    ``new_cache``: a function returning a fresh cache per sample (e.g. a duocal runtime's ``new_cache``).
    """
    hits = 0
    for s in samples:
        prompt = torch.tensor([s.prompt_ids])
        extra = {"cache": new_cache()} if new_cache is not None else {}
        out = model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=len(s.answer_ids),
            do_sample=False,
            pad_token_id=model.config.pad_token_id,
            **extra,
        )
        hits += tuple(out[0, prompt.shape[1] :].tolist()) == s.answer_ids
    return hits / len(samples)


def head_ablation(model, samples: list[PasskeySample], heads: list[list[int]], sink: int, recent: int) -> dict:
    """Exact match when only ``heads`` keep their full KV cache, and when only they do not.

    The other heads keep ``sink`` + ``recent`` tokens (StreamingLLM), through duocal's runtime: a
    real per-head cache, not a mask.
    """
    import duocal_runtime as dr

    shape = dr.shape_of_config(model.config)
    k = shape.num_key_value_heads
    chosen = {layer * k + head for layer, head in heads}
    everything = set(range(shape.num_hidden_layers * k))
    streaming = dr.SinkWindow(sink=sink, recent=recent)
    out = {}
    for name, streamed in (
        ("only_these_full", everything - chosen),
        ("all_but_these_full", chosen),
        ("none_full", everything),
    ):
        with dr.apply(model, dr.plan_from_bounded_set(shape, streamed, streaming)) as runtime:
            out[name] = greedy_exact_match(model, samples, runtime.new_cache)
    return out


def train(recipe: dict, log=print) -> dict:
    torch.set_num_threads(recipe["threads"])
    torch.manual_seed(recipe["seed"])
    tokenizer = build_tokenizer()
    pad = tokenizer.pad_token_id
    model = build_model(recipe["model"], tokenizer)
    compat.set_attention_implementation(model, "sdpa")
    optim_cfg = recipe["optim"]
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=optim_cfg["lr"], betas=tuple(optim_cfg["betas"]), weight_decay=optim_cfg["weight_decay"]
    )
    data, ev = recipe["data"], recipe["eval"]
    history, step, started, cpu_started = [], 0, time.perf_counter(), time.process_time()
    for index, stage in enumerate(recipe["stages"]):
        stage_seed = recipe["seed"] * 1000 + index
        stage_data = {**data, "num_passkeys": stage.get("num_passkeys", data["num_passkeys"])}
        generator = demo_generator(tokenizer, stage_data, stage["context"], stage_seed, stage["keys"])
        eval_context = stage.get("eval_context", stage["context"])
        held_out = demo_generator(tokenizer, stage_data, eval_context, ev["seed"] + index, stage["keys"])
        held_out = list(held_out.samples(ev["samples"]))
        lengths = random.Random(f"demo-lengths:{stage_seed}")
        lr = stage.get("lr", optim_cfg["lr"])
        metric = stage.get("metric", "exact")
        accuracy, stage_step, losses = {metric: 0.0}, 0, []
        model.train()
        while stage_step < stage["max_steps"]:
            for group in optimizer.param_groups:
                group["lr"] = lr * min(1.0, (step + 1) / optim_cfg["warmup_steps"])
            # One length per step and as many sequences as fit in tokens_per_step: no padding.
            length = lengths.randint(*stage["context"])
            batch = max(1, recipe["tokens_per_step"] // length)
            samples = list(
                generator.samples(batch, start=stage_step * recipe["tokens_per_step"], context_length=length)
            )
            ids = collate(samples, pad)["input_ids"]
            weights = token_weights(samples, ids.shape[1], stage.get("loss_weights", recipe["loss_weights"]))
            loss = weighted_loss(model(input_ids=ids).logits, ids, weights)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), optim_cfg["clip"])
            optimizer.step()
            losses.append(loss.item())
            step, stage_step = step + 1, stage_step + 1
            if stage_step % ev["every"] == 0 or stage_step == stage["max_steps"]:
                model.eval()
                accuracy = answer_accuracy(model, held_out, pad)
                model.train()
                elapsed = time.process_time() - cpu_started
                per_symbol = " ".join(f"{p:.2f}" for p in accuracy["by_position"])
                log(
                    f"stage {stage['name']} step {stage_step} (total {step}) loss {sum(losses) / len(losses):.3f} "
                    f"exact {accuracy['exact']:.3f} per symbol [{per_symbol}]  {elapsed:.0f} CPU s"
                )
                losses = []
                if accuracy[metric] >= stage["advance_at"] and stage_step >= stage.get("min_steps", 0):
                    break
        history.append(
            {
                "name": stage["name"],
                "steps": stage_step,
                "metric": metric,
                "accuracy": accuracy[metric],
                "reached": accuracy[metric] >= stage["advance_at"],
                "seconds": round(time.perf_counter() - started, 1),
                "cpu_seconds": round(time.process_time() - cpu_started, 1),
            }
        )
    train_seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    model.eval()
    results = evaluate(model, tokenizer, recipe)
    # Wall time depends on what else runs on the machine; CPU time (one thread) much less so.
    results.update(
        training_seconds=round(train_seconds, 1),
        training_cpu_seconds=round(cpu_seconds, 1),
        total_steps=step,
        stages=history,
    )
    return {"model": model, "tokenizer": tokenizer, "results": results}


def evaluate(model, tokenizer, recipe: dict) -> dict:
    """Held-out greedy exact match per context, and needle attention per (layer, KV head)."""
    final, data = recipe["final_eval"], recipe["data"]
    exact = {}
    for context in final["contexts"]:
        samples = list(
            demo_generator(tokenizer, data, context, final["seed"], questions="one").samples(final["samples"])
        )
        exact[str(context)] = greedy_exact_match(model, samples)
    probe = demo_generator(tokenizer, data, final["attention_context"], final["seed"] + 1, questions="one")
    mass = needle_attention(model, list(probe.samples(final["attention_samples"])))
    heads = [list(head) for head in top_heads(mass)]
    results = {"exact_match": exact, "needle_attention": mass.tolist(), "retrieval_heads": heads}
    if "ablation" in final:
        ab = final["ablation"]
        samples = list(
            demo_generator(tokenizer, data, ab["context"], final["seed"] + 2, questions="one").samples(ab["samples"])
        )
        results["ablation"] = {**ab, "heads": heads, **head_ablation(model, samples, heads, ab["sink"], ab["recent"])}
    return results


def save_demo_model(model, tokenizer, recipe: dict, results: dict, output_dir: str | Path) -> None:
    output = Path(output_dir)
    output.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(output, safe_serialization=True)
    tokenizer.save_pretrained(output)
    weights = (output / "model.safetensors").stat().st_size
    params = sum(p.numel() for p in model.parameters())
    record = {"recipe": recipe, "parameters": params, "weights_bytes": weights, "torch": torch.__version__, **results}
    (output / "training.json").write_text(json.dumps(record, indent=2) + "\n")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0].startswith("-"):
        raise SystemExit("usage: python -m duocal.demo.train RECIPE.yaml [key=value ...]")
    recipe = load_training_recipe(argv[0], argv[1:])
    out = train(recipe)
    save_demo_model(out["model"], out["tokenizer"], recipe, out["results"], recipe["output_dir"])
    r = out["results"]
    print(
        json.dumps(
            {
                "exact_match": r["exact_match"],
                "retrieval_heads": r["retrieval_heads"],
                "training_seconds": r["training_seconds"],
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()

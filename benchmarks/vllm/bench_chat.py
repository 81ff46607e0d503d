"""Multi-turn chats against stock vLLM-CPU and duocal on vLLM, in one run: each turn sends the whole history again.

Each configuration gets a fresh OpenAI server with the same KV space (bench_serving.py's servers). `--conversations`
chats run at once, each `--turns` turns long; a chat opens with its own ~`--context` tokens of the GPL text duocal
ships, then every turn adds a question, and its request is the whole history (the earlier questions and the answers
as the server gave them: the chat template of the model renders them, as any client's would) + the new question,
`--answer-len` greedy tokens each (`ignore_eos`). Per turn: TTFT (the first streamed token) over the chats, and the
prompt tokens read from the prefix cache (each answer's `usage.prompt_tokens_details.cached_tokens`); per
configuration: vLLM's prefix cache counters (hit rate) and output tok/s. Ratios are to stock in the same run.

    OMP_NUM_THREADS=2 VLLM_CPU_OMP_THREADS_BIND=0-1 .venv-vllm/bin/python benchmarks/vllm/bench_chat.py \\
        --conversations 8 --turns 6 --json out/vllm-chat.json -- --dtype float32

Not collected by pytest (no `test_` prefix): it takes many minutes and measures, it does not check.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
import urllib.request
from pathlib import Path

from bench_serving import CONFIGS, NAME, PORT, PrefixHits, RunningPeak, running_server

GPL = Path(__file__).parents[2] / "duocal" / "assets" / "texts" / "gpl-3.0.txt"
QUESTIONS = ("What is this text about? Answer in two sentences.", "Which obligations does it name?",
             "Summarize your last answer in one sentence.", "What would a company have to do to comply?",
             "Which part did you find the hardest to read, and why?", "List three words that matter most in it.",
             "What did you say two answers ago?", "Give one example of what it allows.")  # fmt: skip


def openers(count: int, words: int) -> list[str]:
    """`count` different passages of the GPL text, `words` words each (about 1.3 tokens a word)."""
    text = GPL.read_text().split()
    step = max(1, (len(text) - words) // max(count, 1))
    return [" ".join(text[i * step : i * step + words]) for i in range(count)]


def ask(messages: list[dict], answer_len: int) -> dict:
    """One streamed chat completion: the answer, the seconds to its first token, its prompt and cached tokens."""
    body = {"model": NAME, "messages": messages, "max_tokens": answer_len, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    request = urllib.request.Request(f"http://127.0.0.1:{PORT}/v1/chat/completions", json.dumps(body).encode(),
                                     {"content-type": "application/json"})  # fmt: skip
    start, first, text, usage = time.monotonic(), None, [], {}
    with urllib.request.urlopen(request, timeout=3600) as response:
        for line in response:
            if not line.startswith(b"data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices", []):
                if choice["delta"].get("content"):
                    first = first if first is not None else time.monotonic() - start
                    text.append(choice["delta"]["content"])
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return {"answer": "".join(text), "ttft": first, "prompt": usage.get("prompt_tokens", 0), "cached": cached,
            "output": usage.get("completion_tokens", 0)}  # fmt: skip


def chat(opener: str, turns: int, answer_len: int, into: list) -> None:
    messages = [{"role": "user", "content": f"{opener}\n\n{QUESTIONS[0]}"}]
    for turn in range(turns):
        result = ask(messages, answer_len)
        into.append({"turn": turn + 1, **{k: v for k, v in result.items() if k != "answer"}})
        messages += [{"role": "assistant", "content": result["answer"]},
                     {"role": "user", "content": QUESTIONS[(turn + 1) % len(QUESTIONS)]}]  # fmt: skip


def run_chats(options) -> tuple[list[dict], float]:
    """Every chat at once, each on its own thread: the turns' results and the wall time."""
    results: list[dict] = []
    threads = [threading.Thread(target=chat, args=(opener, options.turns, options.answer_len, results))
               for opener in openers(options.conversations, options.context_words)]  # fmt: skip
    start = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results, time.monotonic() - start


def run_config(label: str, folder: str, options, workdir: Path) -> dict:
    with running_server(label, CONFIGS[label], folder, options, workdir):
        with RunningPeak() as peak, PrefixHits() as hits:
            results, seconds = run_chats(options)
    turns = {}
    for turn in range(1, options.turns + 1):
        done = [r for r in results if r["turn"] == turn]
        turns[turn] = {"ttft_p50": statistics.median(r["ttft"] for r in done),
                       "cached": sum(r["cached"] for r in done) / max(1, sum(r["prompt"] for r in done)),
                       "prompt": statistics.mean(r["prompt"] for r in done)}  # fmt: skip
    row = {"label": label, "turns": turns, "hit_rate": hits.rate, "peak_running": peak.peak, "seconds": seconds,
           "output_throughput": sum(r["output"] for r in results) / seconds}  # fmt: skip
    print(f"{label}: {json.dumps(row)}", flush=True)
    return row


def table(rows: list[dict]) -> str:
    stock = next((r for r in rows if r["label"] == "stock"), rows[0])
    turns = list(stock["turns"])
    lines = ["| config | hit rate | output tok/s | " + " | ".join(f"turn {t} TTFT p50 (s), cached" for t in turns)
             + " |", "|---" * (3 + len(turns)) + "|"]  # fmt: skip
    for r in rows:
        cells = [f"{r['turns'][t]['ttft_p50']:.2f} ({r['turns'][t]['ttft_p50'] / stock['turns'][t]['ttft_p50']:.2f}x)"
                 f", {r['turns'][t]['cached']:.0%}" for t in turns]  # fmt: skip
        speed = f"{r['output_throughput']:.1f} ({r['output_throughput'] / stock['output_throughput']:.2f}x)"
        lines.append(f"| {r['label']} | {r['hit_rate']:.1%} | {speed} | " + " | ".join(cells) + " |")
    prompts = " / ".join(f"{stock['turns'][t]['prompt']:.0f}" for t in turns)
    return "\n".join(lines) + f"\n\nprompt tokens per turn (mean): {prompts}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--context-words", type=int, default=1200, help="words of GPL text opening each chat")
    parser.add_argument("--answer-len", type=int, default=64)
    parser.add_argument("--kv-gib", type=int, default=1)
    parser.add_argument("--configs", default="stock,duo 0.5,duo 0.75", help=f"of {', '.join(CONFIGS)}")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("engine_args", nargs="*", default=["--dtype", "float32", "--enforce-eager"],
                        help="vLLM engine options for every server (after --)")  # fmt: skip
    options = parser.parse_args()
    from duocal.models import ModelRef

    folder = str(ModelRef.resolve(NAME).path)
    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / "duocal-bench-chat"
    workdir.mkdir(exist_ok=True)
    rows = [run_config(label, folder, options, workdir) for label in options.configs.split(",")]
    print(table(rows))
    if options.json:
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        options.json.write_text(json.dumps({"rows": rows, "options": vars(options) | {"json": str(options.json)},
                                            "ended": when, "load": os.getloadavg()}))  # fmt: skip


if __name__ == "__main__":
    main()

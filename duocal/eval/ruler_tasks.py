"""RULER's tasks as lm-evaluation-harness builds them, offline.

lm-eval 0.4.13's `ruler` group has 13 tasks (Hsieh et al. 2024, arXiv 2404.06654). Offline:

- `niah_single_1`, `niah_multikey_2`, `niah_multikey_3` (repeated-noise or needle haystacks),
  `ruler_vt` (variable tracking), `ruler_cwe` / `ruler_fwe` (common / frequent word extraction)
  run as lm-eval ships them;
- the five essay-haystack tasks load Paul Graham's essays from the Hub (`baber/paul_graham_essays`).
  Here they run as `<task>_local`: lm-eval's own task config (prompt, generation settings,
  scoring) with one change, the haystack: the words of a local text (default: the GPL-3.0 text in
  duocal/assets/texts, repeated when shorter than the context), through lm-eval's own sample
  generator with the same needle settings. Their numbers are not the published essay numbers;
  their names say so. They split the haystack into sentences with NLTK (`nltk_punkt.py`);
- `ruler_qa_squad` and `ruler_qa_hotpot` download their QA sets from the web and are skipped.

Datasets are generated once, when the tasks are built (`build_tasks`); every row then sees the
same prompts.
"""

from __future__ import annotations

import random
import re
from functools import cache
from pathlib import Path

AS_SHIPPED = ("niah_single_1", "niah_multikey_2", "niah_multikey_3", "ruler_vt", "ruler_cwe", "ruler_fwe")
# The needle settings of lm-eval's essay tasks (lm_eval/tasks/ruler/niah_utils.py), by task.
ESSAY_NEEDLES = {
    "niah_single_2": dict(type_needle_k="words", type_needle_v="numbers"),
    "niah_single_3": dict(type_needle_k="words", type_needle_v="uuids"),
    "niah_multikey_1": dict(type_needle_k="words", type_needle_v="numbers", num_needle_k=4),
    "niah_multivalue": dict(type_needle_k="words", type_needle_v="numbers", num_needle_v=4),
    "niah_multiquery": dict(type_needle_k="words", type_needle_v="numbers", num_needle_q=4),
}
ESSAY_TASKS = tuple(f"{name}_local" for name in ESSAY_NEEDLES)
SKIPPED = {
    "ruler_qa_squad": "downloads SQuAD from rajpurkar.github.io",
    "ruler_qa_hotpot": "downloads HotpotQA from huggingface.co",
}
ALL_TASKS = AS_SHIPPED + ESSAY_TASKS


def check_task_names(names) -> None:
    for name in names:
        if name in SKIPPED:
            raise ValueError(f"{name} cannot run offline ({SKIPPED[name]}); choose from {', '.join(ALL_TASKS)}")
        if name in ESSAY_NEEDLES:
            raise ValueError(f"{name} loads its haystack from the Hub; use {name}_local (a local haystack)")
        if name not in ALL_TASKS:
            raise ValueError(f"unknown RULER task {name!r}; choose from {', '.join(ALL_TASKS)}")


@cache
def haystack_words(path: str, min_words: int = 0) -> tuple[str, ...]:
    """The file's words, split as lm-eval splits the essays (whitespace runs to one space), repeated
    until there are at least `min_words` (at least a token per word: enough for that context)."""
    words = re.sub(r"\s+", " ", Path(path).read_text(encoding="utf-8")).strip().split(" ")
    out = list(words)
    while len(out) < min_words:
        out += words
    return tuple(out)


def essay_dataset(task: str, **kwargs):
    """`custom_dataset` of `<task>_local`: lm-eval's own generator on the local haystack."""
    from lm_eval.tasks.ruler.common_utils import DEFAULT_SEQ_LENGTHS, get_tokenizer, resolve_tokenizer_name
    from lm_eval.tasks.ruler.niah_utils import TEMPLATE, download_dataset
    from lm_eval.tasks.ruler.prepare_niah import generate_samples

    lengths = kwargs.pop("max_seq_lengths", DEFAULT_SEQ_LENGTHS)
    tokenizer = get_tokenizer(resolve_tokenizer_name(kwargs))
    haystack = list(haystack_words(str(kwargs["haystack_file"]), max(lengths)))
    return download_dataset(
        generate_samples(
            haystack,
            max_seq_length=length,
            template=TEMPLATE,
            type_haystack="essay",
            num_samples=int(kwargs.get("num_samples", 500)),
            TOKENIZER=tokenizer,
            **ESSAY_NEEDLES[task],
        )
        for length in lengths
    )


def niah_single_2(**kwargs):
    return essay_dataset("niah_single_2", **kwargs)


def niah_single_3(**kwargs):
    return essay_dataset("niah_single_3", **kwargs)


def niah_multikey_1(**kwargs):
    return essay_dataset("niah_multikey_1", **kwargs)


def niah_multivalue(**kwargs):
    return essay_dataset("niah_multivalue", **kwargs)


def niah_multiquery(**kwargs):
    return essay_dataset("niah_multiquery", **kwargs)


def write_task_folder(folder: Path, lengths) -> None:
    """The `<task>_local` configs: lm-eval's niah_single_1.yaml included, the dataset ours."""
    import lm_eval.tasks

    shipped = Path(lm_eval.tasks.__file__).parent / "ruler" / "niah_single_1.yaml"
    metrics = "".join(
        f'  - metric: "{n}"\n    aggregation: !function lm_eval.tasks.ruler.common_utils.aggregate_metrics\n'
        "    higher_is_better: true\n"
        for n in sorted(set(lengths) | {4096})  # lm-eval always reports 4096 (-1: no document of it)
    )
    for task in ESSAY_NEEDLES:
        (folder / f"{task}_local.yaml").write_text(
            f"task: {task}_local\ninclude: {shipped}\ntag: []\n"
            f"custom_dataset: !function duocal.eval.ruler_tasks.{task}\nmetric_list:\n{metrics}"
        )


def build_tasks(names, lengths, tokenizer_dir: str, haystack: Path, folder: Path, samples: int, seed: int = 0):
    """lm-eval Task objects for `names` at `lengths` (their datasets generated now), built as
    `simple_evaluate` builds them (Python's random seeded first)."""
    from lm_eval.tasks import TaskManager

    write_task_folder(folder, lengths)
    manager = TaskManager(
        include_path=str(folder),
        metadata={
            "tokenizer": tokenizer_dir,
            "max_seq_lengths": list(lengths),
            "haystack_file": str(haystack),
            "num_samples": samples,
        },
    )
    random.seed(seed)
    return list(manager.load(list(names))["tasks"].values())


def docs_per_length(tasks, lengths, samples: int) -> dict[str, list[int]]:
    """`simple_evaluate(samples=...)`: the first `samples` documents of each length of each task."""
    chosen = {}
    for task in tasks:
        lengths_of_docs = task.dataset["test"]["max_length"]
        chosen[task.task_name] = [
            i for n in lengths for i in [j for j, m in enumerate(lengths_of_docs) if m == n][:samples]
        ]
    return chosen

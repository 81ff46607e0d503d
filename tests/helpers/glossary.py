"""The glossary's words in the code (docs/contributing/glossary.md): the spellings it retired, and the names that
say "window" without the glossary's qualifier. tests/test_architecture.py runs both checks over the tree."""

import ast
import re

# Retired spellings, as identifiers (split at "_" and at case changes) or as words of the source text (comments,
# docstrings, messages): the new word for each.
RETIRED_NAMES = {
    "hf_compat": "compat",
    "window_blocks": "key_blocks",
    "non_retrieval": "bounded",
    "non_full": "bounded",
    # "capacity" is the most tokens one bounded head keeps, nothing else
    "capacity_line": "kv_tokens_line (vLLM's KV tokens)",
    "capacity_tokens": "kv_tokens (vLLM's KV tokens)",
    "capacity_bytes": "pool_size (the pool's bytes)",
    "full_capacity": "full_slots (slots a dynamic full head allocates)",
}
RETIRED_WORDS = re.compile(r"\b(coded|uncoded|non-retrieval|non-full)\b", re.IGNORECASE)

# "window" alone named five things: a name part "window(s)" says which, through the part before it.
QUALIFIERS = {"sink", "text", "observation"}
# Names that keep a bare "window", each with why: other projects' names, and the ones users meet.
KEPT_NAMES = {
    "sliding_window": "transformers' config field; vLLM's SlidingWindowSpec field (SinkWindowSpec's recent)",
    "use_sliding_window": "transformers' config field (Qwen2)",
    "per_layer_sliding_window": "vLLM's Attention keyword",
    "SlidingWindowSpec": "vLLM's KV cache spec, which SinkWindowSpec extends",
    "SlidingWindowManager": "vLLM's KV cache manager, which the sink-window manager extends",
    "window_size": "vLLM-CPU's attention metadata builder field",
}
# `window` itself, only as a class member, an attribute or a keyword (never a local, an argument or a function):
# SnapKV's size field, named so in profiles and plans ("snapkv": {"selected": 544, "window": 32}).
KEPT_FIELD = ("window", {"member", "attribute", "keyword"})


def name_parts(identifier: str) -> list[str]:
    """'StaticCodedH2OGroup' -> ['static', 'coded', 'h', '2', 'o', 'group']; 'decoded' stays one part."""
    return [p.lower() for p in re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+", identifier)]


def retired_spellings(text: str) -> list[str]:
    identifiers = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text))
    found = [f"identifier {n!r}: say {RETIRED_NAMES[n.lower()]}" for n in identifiers if n.lower() in RETIRED_NAMES]
    found += [
        f"identifier {n!r}: say quantized (the integers are codes)" for n in identifiers if "coded" in name_parts(n)
    ]
    found += [f"word {m.group(0)!r}: see the glossary" for m in RETIRED_WORDS.finditer(text)]
    return sorted(found)


KINDS = {ast.Name: "name", ast.Attribute: "attribute", ast.keyword: "keyword", ast.arg: "argument"}
KINDS |= {ast.FunctionDef: "function", ast.AsyncFunctionDef: "function", ast.ClassDef: "class", ast.alias: "import"}


def identifiers(source: str) -> list[tuple[str, str, int]]:
    """(kind, name, line) of every name the code defines or uses; strings and comments are not names."""
    tree = ast.parse(source)
    members = set()
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for s in cls.body:
            targets = s.targets if isinstance(s, ast.Assign) else [getattr(s, "target", s)]
            members |= {id(t) for t in targets}
    found = []
    for node in ast.walk(tree):
        name = getattr(node, "id", None) or getattr(node, "attr", None) or getattr(node, "name", None)
        if isinstance(node, (ast.keyword, ast.arg)):
            name = node.arg
        elif isinstance(node, ast.alias):
            name = node.asname or node.name
        kind = "member" if id(node) in members else KINDS.get(type(node))
        if kind and isinstance(name, str):
            found.append((kind, name, getattr(node, "lineno", 0)))
    return found


def says_which(name: str) -> bool:
    """Whether each "window" part of `name` has one of the glossary's qualifiers before it."""
    parts = name_parts(name)
    return all(p not in ("window", "windows") or (i and parts[i - 1] in QUALIFIERS) for i, p in enumerate(parts))


def unqualified_names(source: str) -> list[str]:
    """ "line N: kind 'name'" for each name that says "window" without saying which, outside the kept ones."""
    return [
        f"line {line}: {kind} {name!r}"
        for kind, name, line in sorted(identifiers(source), key=lambda found: (found[2], found[0], found[1]))
        if not says_which(name) and name not in KEPT_NAMES and not (name == KEPT_FIELD[0] and kind in KEPT_FIELD[1])
    ]

"""`duocal profiles list | pull | push`: prebuilt profiles, the local cache, the Hub.

Registered on `profiles_app` by importing this module (see duocal/cli/app.py).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from duocal_runtime.fetching.prebuilt_index import IndexEntry, load_index
from duocal_runtime.fetching.profile_cache import ProfileCache
from duocal_runtime.files.cache_root import default_cache_dir

from .options import json_only_stdout
from .profiles import profiles_app
from .user_errors import user_errors

# `\\[` keeps rich from reading [/PATH] as markup in --help.
RefArg = Annotated[
    str,
    typer.Argument(
        metavar="REF", help="A prebuilt name (see `list`), an https:// URL, or hf://OWNER/REPO\\[/PATH]\\[@REV]."
    ),
]


def _source(entry: IndexEntry) -> str:
    if entry.shipped:
        return "shipped"
    return f"{entry.origin}@{entry.revision[:7]}" if entry.origin and entry.revision else "url"


def _row(entry: IndexEntry, cache: ProfileCache) -> dict[str, Any]:
    path, _ = cache.lookup(cache.folder("index", entry.name), entry.expected_sha256())
    return {
        "name": entry.name,
        "model": entry.model,
        "num_layers": entry.shape.num_hidden_layers,
        "num_kv_heads": entry.shape.num_key_value_heads,
        "format": entry.format,
        "source": _source(entry),
        "size": entry.size,
        "cached": path is not None or entry.shipped,
    }


@profiles_app.command("list")
def list_profiles(
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON list instead of a table.")] = False,
):
    """Every prebuilt profile: name, model, layers x KV heads, format, source, size, cached.

    Example: duocal profiles list --json
    """
    with user_errors(), json_only_stdout(as_json):
        cache = ProfileCache(default_cache_dir())
        rows = [_row(entry, cache) for entry in load_index().entries]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table("name", "model", "layers x KV heads", "format", "source", "size", "cached")
    for r in rows:
        table.add_row(
            r["name"],
            r["model"],
            f"{r['num_layers']} x {r['num_kv_heads']}",
            r["format"],
            r["source"],
            f"{r['size'] / 1000:.1f} kB",
            "yes" if r["cached"] else "",
        )
    Console(width=200).print(table)


@profiles_app.command("pull")
def pull(
    ref: RefArg,
    force: Annotated[bool, typer.Option("--force", help="Download again even if cached.")] = False,
    offline: Annotated[
        bool | None,
        typer.Option("--offline/--online", help="Use only the cache (default: HF_HUB_OFFLINE).", show_default=False),
    ] = None,
    mirror: Annotated[
        str | None, typer.Option(help="Fetch index URLs from BASE_URL + their path (default: DUOCAL_MIRROR).")
    ] = None,
):
    """Download, verify (sha256), convert if upstream, cache; the last line is the profile's path.

    Examples: duocal profiles pull duo-attention/Meta-Llama-3.1-8B-Instruct;
    duocal profiles pull hf://OWNER/REPO; duocal profiles pull NAME --mirror http://mirror.local/dl
    """
    with user_errors():
        from duocal_runtime.fetching.pull import pull as pull_profile

        pulled = pull_profile(ref, offline=offline, force=force, mirror=mirror)
    if pulled.note:
        typer.echo(f"note: {pulled.note}", err=True)
    typer.echo(
        f"{pulled.ref}: {pulled.profile.shape.describe()}, model "
        f"{pulled.profile.model.name_or_path or 'unnamed'} ({pulled.origin})"
    )
    typer.echo(str(pulled.path))


@profiles_app.command("push")
def push(
    profile: Annotated[
        str, typer.Argument(metavar="PROFILE", help="Profile to publish: path, prebuilt name, URL or hf://.")
    ],
    target: Annotated[str, typer.Argument(metavar="TARGET", help="hf://OWNER/REPO (created if missing).")],
    token: Annotated[str | None, typer.Option(help="Hub token (default: HF_TOKEN or `hf auth login`).")] = None,
    private: Annotated[
        bool | None, typer.Option("--private/--public", show_default=False, help="Visibility of a new repo.")
    ] = None,
    message: Annotated[str | None, typer.Option(help="Commit message.")] = None,
):
    """Publish PROFILE as a Hub repo: profile.json, a README card and a scores heatmap.

    Example: duocal profiles push my-profile.json hf://me/llama3-duocal
    """
    with user_errors():
        from ..reports.hub_card import push_profile

        result = push_profile(profile, target, token=token, private=private, message=message)
    typer.echo(f"pushed {', '.join(result.files)} to {result.repo_url}")
    typer.echo(result.commit_url)

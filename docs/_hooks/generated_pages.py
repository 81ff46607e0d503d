"""mkdocs hook: pages generated from the code, so they cannot drift from it.

A page holds a marker line and the hook replaces it before the page is rendered:
`<!-- generated: cli -->` (every `duocal` command, from the typer app), `<!-- generated: python-api -->`
(mkdocstrings blocks for each public name of `duocal_runtime`, from its export table) and
`<!-- generated: layers -->` (the layer order `tests/test_architecture.py` enforces) and
`<!-- generated: quick-start -->` (README's "Quick start" section, which `tests/test_real_model.py` runs).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^<!-- generated: ([\w-]+) -->$", re.M)


def on_page_markdown(markdown: str, page, config, files) -> str:
    return MARKER.sub(lambda m: GENERATORS[m.group(1)](), markdown)


# --- the command line --------------------------------------------------------------------------
def cli_reference() -> str:
    """Click's command tree as typer builds it (typer vendors click from 0.2x on: read it by duck typing)."""
    import typer.main

    from duocal.cli import app

    root = typer.main.get_command(app)
    sections = _command_sections(root, root.context_class(root, info_name="duocal"))
    if not sections:
        raise RuntimeError("the typer app has no commands: the CLI reference would be empty")
    return "\n\n".join(sections)


def _command_sections(command, ctx) -> list[str]:
    sections = [] if ctx.parent is None else [_command_section(command, ctx)]
    if hasattr(command, "list_commands"):  # a group
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                sections += _command_sections(sub, type(ctx)(sub, info_name=name, parent=ctx))
    return sections


def _command_section(command, ctx) -> str:
    path = ctx.command_path
    usage = " ".join(command.collect_usage_pieces(ctx))
    lines = [f"## `{path}`", "", f"```\n{path} {usage}\n```", "", _plain(command.help or "")]
    rows = [_param_row(p, ctx) for p in command.get_params(ctx) if not getattr(p, "hidden", False)]
    rows = [r for r in rows if r]
    if rows:
        lines += ["", "| argument or option | default | what it does |", "|---|---|---|", *rows]
    if command.epilog:
        lines += ["", _plain(command.epilog)]
    return "\n".join(lines)


def _param_row(param, ctx) -> str | None:
    """One table row from the parameter's own help record (names with metavar, help text)."""
    record = None if param.name == "help" else param.get_help_record(ctx)
    if record is None:
        return None
    names, help_text = record
    if param.required:
        default = "required"
    elif param.default in (None, False, (), "") or callable(param.default):
        default = ""
    else:
        default = f"`{param.default}`"
    return f"| `{names}` | {default} | {_cell(help_text)} |"


def _plain(text: str) -> str:
    """Help text as Markdown: typer's `\\b` paragraph marks dropped, indented examples kept as code."""
    text = text.replace("\b\n", "").replace("\b", "")
    out, block = [], []
    for line in text.splitlines():
        if line.startswith("  ") and line.strip():
            block.append(line.strip())
            continue
        if block and not line.strip():  # a blank line between examples: the block goes on
            continue
        if block:
            out += ["", "```", *block, "```", ""]
            block = []
        out.append(line)
    if block:
        out += ["", "```", *block, "```"]
    return "\n".join(out).strip()


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


# --- the Python API ----------------------------------------------------------------------------
def python_api() -> str:
    """One mkdocstrings block per public name, under the module that defines it."""
    import duocal_runtime

    blocks = []
    for module, names in duocal_runtime._EXPORTS.items():
        target = "duocal_runtime" + module
        blocks.append(f"## `{target}`")
        blocks += [f"::: {target}.{name}" for name in names]
    return "\n\n".join(blocks)


# --- the layers --------------------------------------------------------------------------------
def layers_table() -> str:
    """LAYERS from tests/test_architecture.py, read without importing the test module."""
    tree = ast.parse((REPO / "tests" / "test_architecture.py").read_text())
    layers = next(
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "LAYERS" for t in node.targets)
    )
    rows = [f"| {n} | {', '.join(f'`{room}`' for room in sorted(rooms))} |" for n, rooms in enumerate(layers)]
    return "\n".join(["| layer | rooms (folders or modules) |", "|---|---|", *rows])


# --- README's quick start ----------------------------------------------------------------------
def readme_quick_start() -> str:
    """The body of README's "## Quick start" section: the site shows the commands README shows, not a copy."""
    readme = (REPO / "README.md").read_text()
    if "## Quick start" not in readme:
        raise ValueError("README has no '## Quick start' section")
    return readme.split("## Quick start", 1)[1].split("\n## ", 1)[0].split("\n", 1)[1].strip()


GENERATORS = {"cli": cli_reference, "python-api": python_api, "layers": layers_table, "quick-start": readme_quick_start}

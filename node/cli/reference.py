"""The full CLI reference (``specs/cli.md``), generated from the Typer app itself.

:func:`render` walks the click command tree that Typer builds from :data:`node.cli.main.app`
(every command of the registration table, :data:`node.cli.app.COMMANDS`), and writes one section per
command: usage line, its help text, its arguments and options (names, value, default,
environment variable, help). Nothing is written by hand, so the reference cannot drift
from ``--help``: ``tests/test_cli_reference.py`` fails when ``specs/cli.md`` differs from
:func:`render`'s output, and ``scripts/cli_reference`` rewrites it.
"""

from __future__ import annotations

import inspect
from typing import Any

HEADER = """# `kith` command reference

Generated from the CLI itself by `scripts/cli_reference` (do not edit by hand:
`tests/test_cli_reference.py` fails when this file differs from `kith ... --help`).
Exit codes: 0 ok, 1 a refusal or failure (`error [code]: message` on stderr; the codes are in
[error-codes.md](error-codes.md)), 2 a usage error; `--json` puts only JSON on stdout.
Options before the command (`kith --home DIR <command>`) are the global ones below.
"""


def _cell(text: str) -> str:
    """``text`` as one Markdown table cell (pipes escaped, lines joined)."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _param_rows(cmd: Any, ctx: Any) -> list[str]:
    """One table row per argument and option: exactly the record ``--help`` prints
    (names with the value's metavar, then the help with default, env var, range)."""
    rows = []
    for param in cmd.params:
        if getattr(param, "hidden", False):
            continue
        record = param.get_help_record(ctx)
        if record is None:
            continue
        names, help_text = record
        kind = "option" if getattr(param, "param_type_name", "") == "option" else "argument"
        rows.append(f"| `{_cell(names)}` | {kind} | {_cell(help_text)} |")
    return rows


def _is_group(cmd: Any) -> bool:
    return hasattr(cmd, "list_commands")


def _walk(cmd: Any, path: list[str], parent: Any, out: list[tuple[list[str], Any, Any]]) -> None:
    ctx = cmd.context_class(cmd, info_name=path[-1] if path else "kith", parent=parent)
    out.append((path, cmd, ctx))
    if _is_group(cmd):
        for name in sorted(cmd.list_commands(ctx)):
            sub = cmd.get_command(ctx, name)
            if sub is None or getattr(sub, "hidden", False):
                continue
            _walk(sub, [*path, name], ctx, out)


def commands() -> list[tuple[list[str], Any, Any]]:
    """Every command of ``kith`` as ``(path, click command, context)``, the root first,
    then sub-commands in name order (depth first)."""
    import typer

    from node.cli.main import _register, app

    _register()
    root = typer.main.get_command(app)
    out: list[tuple[list[str], Any, Any]] = []
    _walk(root, [], None, out)
    return out


def render() -> str:
    """The whole reference as Markdown (deterministic: same app, same text)."""
    parts = [HEADER]
    listed = commands()
    parts.append("## Commands\n")
    for path, cmd, _ctx in listed[1:]:
        if _is_group(cmd):
            continue
        anchor = "kith-" + "-".join(path)
        short = cmd.get_short_help_str(limit=200)
        parts.append(f"- [`kith {' '.join(path)}`](#{anchor}) — {_cell(short)}")
    parts.append("")
    for path, cmd, ctx in listed:
        title = "kith " + " ".join(path) if path else "kith (global options)"
        parts.append(f"## {title.strip()}\n")
        pieces = cmd.collect_usage_pieces(ctx)
        parts.append("```\n" + " ".join(["kith", *path, *pieces]) + "\n```\n")
        help_text = inspect.cleandoc(cmd.help or "")
        if help_text:
            parts.append(help_text.split("\f")[0].strip() + "\n")
        rows = _param_rows(cmd, ctx)
        if rows:
            parts.append("| name | kind | help |\n|---|---|---|")
            parts.extend(rows)
            parts.append("")
        if _is_group(cmd):
            subs = [n for n in sorted(cmd.list_commands(ctx))
                    if not getattr(cmd.get_command(ctx, n), "hidden", False)]
            parts.append("Sub-commands: " + ", ".join(f"`{n}`" for n in subs) + "\n")
    return "\n".join(parts).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    """``scripts/cli_reference [--check] [PATH]``: write the reference to PATH (default
    ``specs/cli.md``), or with ``--check`` exit 1 when the file is stale."""
    import sys
    from pathlib import Path

    args = list(sys.argv[1:] if argv is None else argv)
    check = "--check" in args
    rest = [a for a in args if a != "--check"]
    target = Path(rest[0]) if rest else Path(__file__).resolve().parents[2] / "specs" / "cli.md"
    text = render()
    current = target.read_text("utf-8") if target.is_file() else None
    if check:
        if current != text:
            print(f"{target} is stale; run scripts/cli_reference", file=sys.stderr)
            return 1
        return 0
    if current != text:
        target.write_text(text, "utf-8")
        print(f"wrote {target}", file=sys.stderr)
    return 0

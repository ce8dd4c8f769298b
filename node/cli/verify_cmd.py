"""``kith verify ANSWER.json``: check every signed citation of a saved answer
(specs/citations.md §3-5, results from a copy §7; node/answer/citation.py)."""

from __future__ import annotations

from pathlib import Path

import typer

from node.cli.common import emit_json, home_of, untrusted_console as console


def verify_cmd(
    ctx: typer.Context,
    answer: Path = typer.Argument(..., metavar="ANSWER.json", help="A saved answer: `kith join --json` lines, `kith ask --json`, or an MCP or API answer."),
    json_out: bool = typer.Option(False, "--json", help="One JSON object: {ok, counts, rows}."),
    against_host: bool = typer.Option(False, "--against-host", help="Also ask each pinned host whether the cited document versions are still current (stale vs forged)."),
    local: bool = typer.Option(False, "--offline", "--local", envvar="KITH_OFFLINE", help="With --against-host: offline, loopback only, relays off (--local: the old spelling, deprecated)."),
) -> None:
    """Check the signed citations of a saved answer: signature, exact text, span, and
    whether the signing key is a pinned peer. A result answered from a copy is checked
    against the copy document this home keeps (the host's signature over the whole
    document, the result's text at its copySpan). Exits 0 only when every result verifies."""
    import anyio

    from node.answer.citation import known_keys, read_answer, report, summary, verify_answer
    from node.guest.copies.search import copy_texts

    home = home_of(ctx)
    rows = verify_answer(read_answer(answer), known=known_keys(home), copies=copy_texts(home))
    if against_host:
        from node.guest.citecheck import against_hosts
        from node.guest.owner import Guest

        guest = Guest(home, local=local)  # the asking side of this process
        rows = anyio.run(lambda: against_hosts(guest, rows))
    doc = report(rows)
    ok = doc["ok"]
    if json_out:
        emit_json(doc)
    elif not rows:
        console.print("no results with citations in this answer")
    else:
        from rich.table import Table

        table = Table(box=None, pad_edge=False)
        for col in ("result", "source", "host", "peer", "where", "detail"):
            table.add_column(col)
        for r in rows:  # a result from a copy says so in its result column
            table.add_row(r.result + (" (copy)" if r.copy is not None else ""), r.source or "-", (r.host_key or "-")[:16],
                          r.peer or "-", r.where or "-", r.detail)
        console.print(table)
        counts = ", ".join(f"{n} {k}" for k, n in summary(rows).items())
        console.print(f"{'all verified' if ok else 'NOT all verified'}: {counts}")
    raise typer.Exit(0 if ok else 1)

"""``kith ask``: one question to several pinned peers at once, one merged, attributed
answer (specs/ask.md; node/guest/fanout.py).

Exit status (specs/ask.md §6): 0 when at least one peer (or ``--local``) answered ``ok``,
or ``--later`` kept the question in the outbox (specs/outbox.md); 1 otherwise (every peer refused, was unreachable or timed out, or had no verified
results); 2 for a bad command line (``usage``, ``ask-too-many-peers``, ``peer-bad-name``,
``query-invalid``).
"""

from __future__ import annotations

import sys
from typing import Any, Optional

import anyio
import typer

from node.answer.contract import TOP_K_DEFAULT
from node.cli.common import (TransportArgs, console, emit_json, err_console, identity_home_of, safe_text,
                             stdin_is_terminal, transport_options)


def _who_said(r: dict[str, Any]) -> str:
    """``[alice, bob] /src/a.md`` — or, when the peers returned the same text under
    different source ids, each peer with its own: ``[alice] /x/a.md; [bob] /y/a.md``."""
    atts = [{**a, "source": a.get("source", r["source"])}
            for a in r["attributions"] or [{"peer": r["peer"], "source": r["source"]}]]
    if len({a["source"] for a in atts}) <= 1:
        who = ", ".join(safe_text(a["peer"]["name"]) for a in atts)
        return f"[{who}] {safe_text(r['source'])}"
    return "; ".join(f"[{safe_text(a['peer']['name'])}] {safe_text(a['source'])}" for a in atts)


def render(env: dict[str, Any]) -> None:
    """Print the merged answer for a person: results (who said it), then the per-peer
    table. Peer text is neutralised (:func:`safe_text`) and never parsed as markup."""
    from rich.table import Table

    results = env["results"]
    head = f"{len(results)} result(s) from {env['answered']} of {len(env['peers'])} source(s)"
    if env["missing"]:
        head += " — missing: " + ", ".join(safe_text(n) for n in env["missing"])
    console.print(head, highlight=False, markup=False, style="bold")
    from node.cli.render import (
        Line, also_in_text, format_lines, heading_text, location_text, preview_lines, suspicious_text)

    lines: list[Line] = []
    for r in results:
        where = location_text(r.get("location"))
        lines.append(Line(f"#{r['rank']} {_who_said(r)}" + (f"  {where}" if where else ""), indent=2, hang=5))
        if r.get("fromCopy"):  # specs/copies.md §6: every result from a copy says so
            from node.guest.copies.search import copy_age_text

            lines.append(Line(copy_age_text(safe_text(r["peer"]["name"]), r.get("copyAsOf")), indent=5, hang=5))
        heading = heading_text(r.get("location"))
        if heading:
            lines.append(Line(heading, indent=5, hang=5))
        flagged = suspicious_text(r)
        if flagged:
            lines.append(Line(flagged, indent=5, hang=7))
        lines.extend(preview_lines(r["textPreview"], 5))
        copies = also_in_text([c for a in r["attributions"] for c in a.get("alsoIn", [])])
        if copies:
            lines.append(Line(copies, indent=5, hang=7))
    width = console.width if console.is_terminal else None
    for text in format_lines(lines, width):
        console.print(text, highlight=False, markup=False, soft_wrap=True)
    if any(r["untrusted"] for r in results) and not console.is_terminal:
        # the notice speaks to an agent reading the output — in the words of this output,
        # not of the JSON's `untrusted` field; a person at a terminal sees who said what
        # from the [peer] attributions (issue 20)
        from node.answer.fence import TEXT_NOTICE

        console.print(TEXT_NOTICE, highlight=False, markup=False, style="dim")
    table = Table("peer", "status", "detail", "latency", "results", "path", box=None, header_style="bold")
    for p in env["peers"]:
        detail = p["code"] or ""
        if p["approvalId"]:
            detail = f"approval {p['approvalId']}"
        if p["retryAfterS"] is not None:
            detail = f"retry in {p['retryAfterS']} s"
        if p.get("fromCopy"):  # specs/copies.md §6
            from node.guest.copies.search import copy_age_text

            detail = copy_age_text(p["name"], p.get("copyAsOf"))
        latency = "-" if p["latencyMs"] is None else f"{p['latencyMs']:.0f} ms"
        path = p.get("path") or {}
        shown = ("relayed via " + safe_text(path.get("relayUrl") or "?") if path.get("kind") == "relayed"
                 else path.get("kind") or "-")
        table.add_row(safe_text(p["name"]), p["status"], safe_text(detail), latency, str(p["results"]), shown)
    console.print(table)


@transport_options()
def ask_cmd(
    ctx: typer.Context,
    question: str = typer.Argument(..., metavar="QUESTION", help="The question, in plain words."),
    peer: list[str] = typer.Option([], "--peer", "-p", metavar="NAME", help="A pinned peer to ask (repeatable; `kith peers list`)."),
    all_peers: bool = typer.Option(False, "--all-peers", help="Ask every pinned, unblocked peer."),
    local_corpus: bool = typer.Option(False, "--local", help="Search this node's own corpus too."),
    top_k: int = typer.Option(TOP_K_DEFAULT, "--top-k", min=1, max=20, help="Merged results to keep (1-20); each peer is asked for as many."),
    timeout: float = typer.Option(10.0, "--timeout", min=0.1, max=120.0, metavar="SECONDS", help="One deadline for every peer; the answer comes then with what arrived."),
    transport: TransportArgs = TransportArgs(),
    json_out: bool = typer.Option(False, "--json", help="Print the merged envelope (specs/ask.schema.json) as JSON."),
    citations: bool = typer.Option(False, "--citations", help="Ask each peer to sign a citation for its results (hosts with --sign-citations do); save --json and check it with `kith verify`."),
    later: bool = typer.Option(False, "--later", help="Keep the question for every peer that is offline now (or whose answer waits for its owner's approval) in this home's outbox; a running `kith host`, `kith api serve`, `kith mcp` or `kith outbox run` delivers it when the peer is back (`kith outbox list`). A peer answered from its copy (or with --copy) is kept too: the copy answers now, the live host later."),
    copy_only: bool = typer.Option(False, "--copy", help="Answer only from this node's copies of the peers (`kith copies sync`); no peer is asked. Without it, a peer that is unreachable is answered from its copy when one is kept, marked \"from NAME's copy of ...\". With --later the question is also kept for the live hosts (they are not dialled now)."),
    keep: Optional[str] = typer.Option(None, "--keep", metavar="DURATION", help="With --later: how long the outbox keeps the question (30m, 12h, 7d, 2w; default 7d)."),
    yes: bool = typer.Option(False, "--yes", help="Send the question even when the outbound gate holds it (it carries 12+ words of a source hidden from a peer, a personal value or a secret); without it you are asked at a terminal, and refused (outbound-needs-confirmation) without one."),
) -> None:
    """Ask pinned peers one question at once; print one merged answer citing who said what."""
    from node.answer import contract
    from node.common.errors import KithError, UsageError, error_for
    from node.guest.fanout import fan_out, local_searcher
    from node.guest.owner import Guest

    home = identity_home_of(ctx)
    mode = transport.mode(home, "ask")
    if all_peers and peer:
        raise UsageError("usage", "give --peer NAME... or --all-peers, not both")
    guest = Guest(home, mode=mode, local=mode.offline)  # the asking side of this process
    registry = guest.peers.now()  # peers.json, read once (again only if it changes meanwhile)
    from node.guest.fanout import askable_peers

    names = askable_peers(registry) if all_peers else list(peer)
    if not names and not local_corpus:
        if all_peers:
            raise UsageError("usage", "--all-peers: no unblocked peer is pinned here "
                             "(`kith join --pin NAME`, `kith peers add NAME KEY --invite ...`)")
        raise UsageError("usage", "name a peer (--peer NAME, repeatable), --all-peers or --local")
    from node.guest.fanout import LOCAL_NAME

    if local_corpus and LOCAL_NAME in names:  # two rows named `local`: citations ambiguous
        raise UsageError("usage", f"a pinned peer is named {LOCAL_NAME!r}, the name of --local's row; "
                         f"ask it without --local, or pin it under another name")
    if keep is not None and not later:
        raise UsageError("usage", "--keep is for --later")
    if copy_only and (local_corpus or all_peers and not names):
        raise UsageError("usage", "--copy answers from the copies of the peers named (--peer NAME or --all-peers)")
    from node.guest.outbox import parse_keep

    keep_s = parse_keep(keep)  # outbox-keep-invalid (exit 2) before anything is asked
    request = {"query": question, "topK": top_k}
    try:
        contract.validate(request)
    except KithError as exc:  # a bad question is a bad command line: exit 2 (specs/ask.md §6)
        raise error_for(exc.code, exc.message, hint=exc.hint, exit_code=2) from None
    if citations:  # a knowledge-query message field beside the request (node/answer/citation.py)
        request["citations"] = True
    if later:  # a full outbox refuses before anyone is asked (outbox-full)
        from node.guest.outbox import OUTBOX_FILE, OutboxStore

        if (home / OUTBOX_FILE).exists():  # none yet has room: made only when a question is kept
            with OutboxStore(home) as store:
                store.check_room(request)
    ticket = None
    # the outbound gate, before anything leaves (specs/agents.md §5), for the pinned peers
    # named: a name pinned to no one is refused peer-not-found in its row and sent nothing,
    # so it is neither checked nor logged (a command that sends nothing leaves the home as it was)
    receivers = [n for n in names if registry.by_name(n) is not None]
    if receivers and not copy_only:
        from node.cli.common import confirm_outbound
        from node.policy.outbound import OWNER, gate

        ticket = gate(home, request, receivers, actor=OWNER, rule="ask", yes=yes,
                      confirm=confirm_outbound if stdin_is_terminal() and sys.stderr.isatty() else None)
    identity = guest.identity

    def show(env: dict[str, Any]) -> None:
        if json_out:
            emit_json(env)
        else:
            render(env)
            for p in env["peers"]:
                if p["status"] == "pending-approval" and p["approvalId"]:
                    err_console.print(f"{safe_text(p['name'])}: waiting for its owner's approval ({p['approvalId']})",
                                      highlight=False, markup=False)
                elif p.get("lastHeardAt"):  # went silent with the question out (specs/session.md §7.2)
                    err_console.print(f"{safe_text(p['name'])} stopped answering: nothing from it since "
                                      f"{p['lastHeardAt']} while the question was out; it was stopped, went to "
                                      "sleep or lost its network — ask again once it is back",
                                      highlight=False, markup=False)
        sys.stdout.flush()

    def say_waiting(out: list[str], elapsed_s: float) -> None:
        # stderr only: with --json, stdout carries the one envelope and nothing else
        err_console.print(f"waiting for {', '.join(safe_text(n) for n in out)} "
                          f"({elapsed_s:.0f} s of {timeout:g} s)…", highlight=False, markup=False)

    async def main() -> dict[str, Any]:
        import time

        from node.cli.render import WAIT_NOTICE_S, WAIT_REPEAT_S
        from node.guest.fanout import ASK_END_WAIT_S, dedupe_names

        started = time.monotonic()

        dedupe_names(names)  # ask-too-many-peers before binding anything
        async with guest.session_pool(end_wait_s=ASK_END_WAIT_S) as pool:
            if not copy_only:  # a damaged person record fails here, before dialling, with its own hint,
                pool.person.now()  # not as each peer's refusal; the sessions reuse what is read (once)
            env = await fan_out(pool, request, names, timeout_s=timeout,
                                local=local_searcher(home) if local_corpus else None, own_key=identity.public_key,
                                on_waiting=(WAIT_NOTICE_S, WAIT_REPEAT_S, say_waiting),
                                copies="only" if copy_only else "fallback")
            if ticket is not None:
                ticket.done(env)
            if later:  # the outbox (specs/outbox.md): kept for the peers that did not answer
                from node.guest.outbox import keep_for_later

                kept = keep_for_later(home, request, env, keep_s=keep_s)
                if kept is not None:
                    copied = [p["name"] for p in env["peers"] if p.get("fromCopy")]
                    if copied:
                        err_console.print(f"answered from the copy of {', '.join(safe_text(n) for n in copied)} now; "
                                          "the live answer is kept for later", highlight=False, markup=False)
                    err_console.print(f"kept in the outbox as {kept['id'][:12]} for "
                                      f"{', '.join(safe_text(n) for n in kept['peers'])} until {kept['expiresAt']}: "
                                      f"`kith outbox show {kept['id'][:12]}` (delivered while `kith host`, "
                                      "`kith api serve`, `kith mcp` or `kith outbox run` runs)",
                                      highlight=False, markup=False)
            # The answer is printed at the deadline, not after the pool has closed its
            # sessions (closing a session to a silent host can take seconds).
            show(env)
            # a handshake told a copy's grant changed: what its host withdrew is recorded now and
            # never answered from the copy again (specs/copies.md §5.1), within the deadline's slack
            live = [p["name"] for p in env["peers"] if p.get("status") in ("ok", "no-verified-results")
                    and not p.get("fromCopy") and p.get("name")]
            if live and not copy_only:
                from node.guest.copies.sync import note_withdrawn

                with anyio.move_on_after(max(0.0, timeout + 0.3 - (time.monotonic() - started))):
                    await note_withdrawn(pool, live, notify=pool.on_copy_notice)
        return env

    env = anyio.run(main, backend="asyncio")
    # Everything is printed and every session closed: end the process now. The
    # interpreter's own teardown of the loaded libraries takes ~0.25 s more, and the
    # whole of `kith ask` must end within its deadline + 0.5 s (specs/ask.md §1).
    import logging
    import os

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1 if env["answered"] == 0 and not env.get("outbox") else 0)

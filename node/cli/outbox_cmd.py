"""``kith outbox``: the questions kept for peers that were offline (``kith ask --later``)
and their answers (specs/outbox.md)."""

from __future__ import annotations

import signal
from typing import Any

import typer

from node.cli.common import (TransportArgs, emit_json, err_console, home_of, identity_home_of, safe_text,
                             transport_options, untrusted_console as console, command_group, json_option)
from node.common.names import holder_text

outbox_app = command_group(
    "Questions kept for peers that were offline (`kith ask --later`), delivered when the "
    "peer is back by whichever of `kith host`, `kith api serve`, `kith mcp` or `kith outbox run` "
    "runs for this home; each answer is kept here until you remove it."
)

_JSON = json_option()


def say_delivery(ev: dict[str, Any]) -> None:
    """One stderr line for a delivery event of the home's runner (``outbox-answered``,
    ``outbox-pending``, ``outbox-failed``, ``outbox-left``, ``outbox-expired``; the copies' ``copy-synced``
    and ``copy-ended``): how ``kith outbox run`` and
    ``kith host`` report the outbox's work."""
    what = {"outbox-answered": "answered", "outbox-pending": "waits for its owner's approval",
            "outbox-failed": "cannot be delivered"}.get(ev.get("event", ""))
    if what is not None:
        err_console.print(f"outbox {ev['id'][:12]}: {safe_text(ev['peer'])} {what}"
                          + (f" ({ev['code']})" if ev.get("code") else ""), highlight=False, markup=False)
    elif ev.get("event") == "outbox-left":
        err_console.print(f"outbox {ev['id'][:12]}: {safe_text(ev['peer'])} unreachable; left sealed with "
                          f"{safe_text(holder_text(ev['holder']))}", highlight=False, markup=False)
    elif ev.get("event") == "outbox-expired":
        err_console.print(f"outbox: {ev['rows']} question(s) expired unanswered", highlight=False, markup=False)
    elif ev.get("event") == "copy-synced" and (ev.get("fetched") or ev.get("removed")):  # node/guest/copies/task.py
        err_console.print(f"copy of {safe_text(ev['peer'])}: fetched {ev['fetched']}, deleted {ev['removed']}",
                          highlight=False, markup=False)
    elif ev.get("event") == "copy-ended":
        err_console.print(f"copy of {safe_text(ev['peer'])}: the host no longer grants it; deleted "
                          f"{ev['removed']} document(s)", highlight=False, markup=False)


def _store(ctx: typer.Context, *, reading: bool = False) -> Any:
    """The home's outbox; a home where nothing was ever kept has none, and reading it
    creates none (``outbox-not-found`` for an id). ``reading``: only read (``list``,
    ``show``), so a home this process may not write is opened read-only
    (:meth:`node.guest.outbox.OutboxStore.for_reading`) instead of refused."""
    from node.common.errors import ConfigError
    from node.guest.outbox import OUTBOX_FILE, OutboxStore

    home = home_of(ctx)
    if not (home / OUTBOX_FILE).exists():
        raise ConfigError("outbox-not-found", "nothing was ever kept in this home's outbox",
                          hint="`kith ask QUESTION --peer NAME --later` keeps a question")
    return OutboxStore.for_reading(home) if reading else OutboxStore(home)


@outbox_app.command("list")
def list_cmd(ctx: typer.Context, as_json: bool = _JSON) -> None:
    """List the kept questions, newest first: state per peer, expiry, unread answers."""
    from rich.table import Table

    from node.guest.outbox import OUTBOX_FILE, empty_usage

    if not (home_of(ctx) / OUTBOX_FILE).exists():
        records: list[dict[str, Any]] = []
        usage = empty_usage()
    else:
        with _store(ctx, reading=True) as store:
            records = store.list()
            usage = store.usage()
    if as_json:
        emit_json({"questions": records, "usage": usage})
        return
    if not records:
        console.print("the outbox is empty", highlight=False)
        return
    table = Table(box=None, header_style="bold")
    table.add_column("id", no_wrap=True, min_width=12)
    for name in ("state", "query", "peers", "expires"):
        table.add_column(name, overflow="fold")
    for r in records:
        peers = ", ".join(f"{safe_text(p['name'])} {p['state']}" + (f" ({p['code']})" if p["code"] and
                                                                        p["state"] != "answered" else "")
                          + (" [copy answered meanwhile]" if p.get("fromCopy") else "")
                          + (f" [left with {safe_text(holder_text(p['leftWith']))}]" if p.get("leftWith") and
                             p["state"] != "answered" else "")
                          for p in r["peers"])
        state = r["state"] + (" *new*" if r["unread"] else "")
        table.add_row(r["id"][:12], state, safe_text(r["query"] or ""), peers, r["expiresAt"])
    console.print(table)
    console.print(f"{usage['questions']} of {usage['maxQuestions']} questions, "
                  f"{usage['bytes'] / 2**20:.1f} of {usage['maxBytes'] / 2**20:.0f} MiB", highlight=False, style="dim")


@outbox_app.command("show")
def show_cmd(ctx: typer.Context, question_id: str = typer.Argument(..., metavar="ID",
                                                                  help="The id or a unique prefix (4+ hex)."),
             as_json: bool = _JSON) -> None:
    """Show one kept question and the merged answer of the peers that answered (marks the
    answers read; on a home you may read but not write, shows them without marking)."""
    from node.guest.outbox import public_record

    with _store(ctx, reading=True) as store:
        qid = store.resolve(question_id)
        record = store.get(qid)
        assert record is not None
        if not store.readonly:
            store.mark_read(qid)
    out = public_record(record)
    if as_json:
        emit_json(out)
        return
    console.print(f"{out['id']}  {out['state']}  asked {out['createdAt']}, kept until {out['expiresAt']}",
                  highlight=False)
    console.print(f"query: {safe_text(out['query'] or '')}", highlight=False)
    for p in out["peers"]:
        extra = f" approval {p['approvalId']}" if p["approvalId"] and p["state"] == "pending-approval" else ""
        code = f" ({p['code']})" if p["code"] and p["state"] != "answered" else ""
        console.print(f"  {safe_text(p['name'])}: {p['state']}{code}{extra}, {p['attempts']} attempt(s)"
                      + (f", answered {p['answeredAt']}" if p["answeredAt"] else ""), highlight=False)
        if p.get("leftWith") and p["state"] != "answered":  # specs/sealed.md §10
            console.print(f"    left sealed with {safe_text(holder_text(p['leftWith']))}: its host takes it when it wakes",
                          highlight=False, markup=False)
        if p.get("fromCopy"):  # specs/copies.md §6: the copy answered when it was asked
            live = "the live answer is below" if p["state"] == "answered" else "the live host's answer is awaited"
            console.print(f"    answered meanwhile from {safe_text(p['name'])}'s copy synced "
                          f"{p.get('copyAsOf') or 'at an unknown time'}; {live}", highlight=False, markup=False)
    if out["answer"] is not None:
        from node.cli.ask_cmd import render

        render(out["answer"])


@outbox_app.command("remove")
def remove_cmd(ctx: typer.Context,
               question_ids: list[str] = typer.Argument(None, metavar="ID...", help="Ids or unique prefixes."),
               done: bool = typer.Option(False, "--done", help="Remove every question no peer is still due to answer "
                                                               "(answered, expired or failed); not with ID..."),
               as_json: bool = _JSON) -> None:
    """Remove kept questions and their answers (an open one is no longer delivered): the
    ones named (ID...), or with --done every one no peer is still due to answer — one or
    the other (specs/outbox.md). A question left sealed with a holder is withdrawn there
    (specs/sealed.md §10)."""
    from node.common.errors import UsageError

    if bool(question_ids) == done:  # neither, or both: which is meant is not guessed
        raise UsageError("usage", "give either the question(s) to remove (ID...) or --done, not both" if done
                         else "name the question(s) to remove (ID...) or give --done")
    removed: list[str] = []
    withdrawals: list[dict[str, Any]] = []
    with _store(ctx) as store:
        ids = [store.resolve(q) for q in question_ids or []]
        for qid in ids:
            if store.remove(qid):
                removed.append(qid)
        if done:
            removed.extend(store.remove_done())
        pending = store.withdrawals()  # read once: each read is a write transaction
        if pending:  # sealed copies left with holders: withdrawn there now (specs/sealed.md §10)
            withdrawals = _withdraw(ctx, store, pending)
    if as_json:
        emit_json({"removed": removed, "withdrawals": withdrawals})
        return
    console.print(f"removed {len(removed)} question(s)", highlight=False)
    for w in withdrawals:
        console.print(_withdrawal_line(w), highlight=False, markup=False)


def _withdraw(ctx: typer.Context, store: Any, pending: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Withdraw the removed questions' sealed copies ``pending`` (``store.withdrawals()``)
    at their ``http(s)`` holders now (:func:`node.guest.sealed_outbox.withdraw_left`); an
    ``iroh:`` holder, or one that fails, is left to the home's runner."""
    import anyio

    from node.guest.sealed_outbox import withdraw_left
    from node.trust.identity import load_identity

    home = identity_home_of(ctx)
    identity = load_identity(home)
    return anyio.run(lambda: withdraw_left(home, identity, store, pending=pending), backend="asyncio")


def _withdrawal_line(w: dict[str, Any]) -> str:
    """One line per sealed copy of a removed question: what became of it at its holder."""
    where = safe_text(holder_text(w["holder"]))
    if w["state"] == "withdrawn":
        return f"outbox {w['id'][:12]}: withdrawn from {where}; its host will not see it"
    if w["state"] == "gone":
        return (f"outbox {w['id'][:12]}: no longer at {where} (its host took it already, or the holder "
                "takes no withdrawals); "
                "an answer it sends is not stored")
    why = f"cannot reach it now ({w['code']})" if w["code"] else "it is reached over iroh"
    return (f"outbox {w['id'][:12]}: still at {where}, {why}: this home's runner withdraws it (`kith outbox run`, or "
            "a running `kith host`, `kith api serve`, `kith mcp`); until then its host may answer it, and the "
            "answer is not stored")


@outbox_app.command("run")
@transport_options()
def run_cmd(
    ctx: typer.Context,
    transport: TransportArgs = TransportArgs(),
    json_out: bool = typer.Option(False, "--json", help="One JSON object per line: each delivery event."),
) -> None:
    """Deliver the kept questions — live, or left sealed with the mailbox a sleeping peer's
    card names, whose sealed answers it takes (specs/sealed.md) — and re-sync this home's
    copies (`kith copies`: at start, then every 10 min) until Ctrl-C/SIGTERM (for a home that
    runs no `kith host`, `kith api serve` or `kith mcp`). Only one process of a home delivers
    at a time."""
    import anyio

    from node.guest.owner import Guest

    home = identity_home_of(ctx)
    mode = transport.mode(home, "outbox run")

    def on_event(ev: dict[str, Any]) -> None:
        if json_out:
            emit_json(ev)
        else:
            say_delivery(ev)

    async def main() -> None:
        guest = Guest(home, mode=mode, local=mode.offline)  # the asking side of this process
        # refused at start (identity-corrupt, io-error), as `kith api serve`'s runner and `kith mcp`
        # are: the runner's pool opens only when a question needs it, which may be never
        guest.load()
        runner = guest.runner(command="kith outbox run", on_event=on_event)
        async with anyio.create_task_group() as tg:
            async def until_signal() -> None:
                with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                    async for _ in signals:
                        tg.cancel_scope.cancel()
                        return

            async def say_holding() -> None:
                with anyio.move_on_after(1.0):
                    await runner.holding.wait()
                if not runner.holding.is_set():
                    from node.common.home import lock_owner
                    from node.guest.runner import LOCK_FILE

                    err_console.print(f"another process delivers this home's outbox ({lock_owner(home / LOCK_FILE)}); "
                                      "waiting to take over when it stops", highlight=False, markup=False)
                    await runner.holding.wait()
                if json_out:
                    from node.common.host_events import OutboxRunnerStarted, checked

                    emit_json(checked(OutboxRunnerStarted().to_dict(), command=True))
                else:
                    err_console.print("delivering the outbox (Ctrl-C to stop)", highlight=False)

            tg.start_soon(until_signal)
            tg.start_soon(say_holding)
            await tg.start(runner.run)

    anyio.run(main, backend="asyncio")

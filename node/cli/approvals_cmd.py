"""``kith approvals``: decide the requests ``ask``-tier sources create (DESIGN §10, specs/approvals.md)."""

from __future__ import annotations

import typer
from rich.table import Table

from node.cli.common import (err_console, safe_text, untrusted_console as console, emit_json, home_of,
                             command_group, json_option)
from node.policy.approvals import Approvals, ApprovalRequest

approvals_app = command_group(
    "When a peer's query is best answered by an 'ask' source, the host answers "
    "pending-approval and records a request here. Approve it and the same query gets "
    "the evidence; --remember opens (or closes) those sources for that peer for good."
)

_JSON = json_option()


def _row(req: ApprovalRequest) -> dict:
    return req.to_dict() | {"status": req.decision or "pending"}


def _status(req: ApprovalRequest) -> str:
    if req.decision is None:
        return "pending"
    return f"{req.decision} (with {req.via})" if req.via else req.decision


def _warn(message: str) -> None:
    """A warning on stderr: plain text (source ids come from file names, which may hold
    '[' or control characters; neither is interpreted)."""
    err_console.print(safe_text(f"warning: {message}"), markup=False, highlight=False)


@approvals_app.command("list")
def list_cmd(
    ctx: typer.Context,
    all_: bool = typer.Option(False, "--all", help="Also show decided requests."),
    as_json: bool = _JSON,
) -> None:
    """List pending approval requests (oldest first)."""
    store = Approvals(home_of(ctx))
    reqs = sorted(store.requests().values(), key=lambda r: (r.created_at, r.id)) if all_ else store.pending()
    if as_json:
        emit_json({"requests": [_row(r) for r in reqs]})
        return
    if not reqs:
        console.print("no pending approval requests" if not all_ else "no approval requests", highlight=False)
        return
    table = Table(box=None, header_style="bold")
    # the id is what the owner types: never wrapped or cut, whatever the width
    table.add_column("id", no_wrap=True, min_width=16)
    for name in ("status", "peer", "query", "sources", "created"):
        table.add_column(name, overflow="fold")
    for r in reqs:
        who = r.peer_name or f"(anonymous) {r.peer_key[:12]}…"
        # every cell is sanitized by the untrusted console (control, C1, bidi → U+FFFD;
        # no markup): the query is the peer's text, source ids come from file names
        table.add_row(r.id, _status(r), who, r.query[:60], "\n".join(r.sources), r.created_at)
    console.print(table)


def _decide(ctx: typer.Context, rid: str, approve: bool, remember: bool, as_json: bool) -> None:
    from node.policy.approvals import decide_as_owner

    done = decide_as_owner(home_of(ctx), rid, approve, remember=remember)
    req, settled, closed = done.request, done.settled, done.closed
    if closed:
        _warn(f"{len(closed)} source(s) are no longer 'ask' in policy.toml and stay closed: "
              + ", ".join(closed[:5]))
    if as_json:
        emit_json(_row(req) | {"settled": sorted(settled)})
    else:
        verb = "approved" if approve else "denied"
        scope = "for every query of this peer (remembered)" if remember else "for this query"
        console.print(f"{verb} {req.id} {scope}: {len(req.sources)} source(s)", highlight=False, markup=False)
        if settled:
            console.print(f"also {verb} {len(settled)} other pending request(s) of this peer for the same "
                          f"source(s): {', '.join(sorted(settled))}", highlight=False, markup=False)


@approvals_app.command("approve")
def approve_cmd(
    ctx: typer.Context,
    rid: str = typer.Argument(..., metavar="ID", help="The request id (16 hex, from `kith approvals list`), or a unique prefix of it (4 or more)."),
    remember: bool = typer.Option(False, "--remember", help="Promote these sources for this peer for any query."),
    as_json: bool = _JSON,
) -> None:
    """Approve request ID: the same peer asking the same query gets the evidence."""
    _decide(ctx, rid, True, remember, as_json)


@approvals_app.command("deny")
def deny_cmd(
    ctx: typer.Context,
    rid: str = typer.Argument(..., metavar="ID", help="The request id (16 hex), or a unique prefix of it (4 or more)."),
    remember: bool = typer.Option(False, "--remember", help="Refuse these sources to this peer for any query."),
    as_json: bool = _JSON,
) -> None:
    """Deny request ID: the sources stay withheld (no new request for the same query)."""
    _decide(ctx, rid, False, remember, as_json)

"""``kith sent``: the outbound log — every question this node's doors sent to peers (or
held), on whose behalf, and what came back; ``kith sent approve ID`` releases a held one
(specs/agents.md §5)."""

from __future__ import annotations

import re
import time
from typing import Optional

import typer

from node.cli.common import emit_json, home_of, list_options_only, untrusted_console as console
from node.common.errors import UsageError

sent_app = typer.Typer(
    help=("The outbound log: every question sent to peers through the local API, kith mcp or "
          "another door, the agent it was sent for (or owner), the peers, the text, what the "
          "outbound gate held and decided, and what came back. `kith sent approve ID` lets a "
          "held question through once."),
    invoke_without_command=True,
)

_SINCE_RE = re.compile(r"^(\d{1,6})([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def _since(value: Optional[str]) -> Optional[str]:
    if value is None:
        return None
    m = _SINCE_RE.fullmatch(value.strip())
    if m:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - int(m.group(1)) * _UNIT_S[m.group(2)]))
    if re.fullmatch(r"\d{4}-\d{2}-\d{2}(T\d{2}:\d{2}:\d{2}Z)?", value.strip()):
        from datetime import datetime

        try:  # a real day and time, not only its shape
            datetime.strptime(value.strip(), "%Y-%m-%dT%H:%M:%SZ" if "T" in value else "%Y-%m-%d")
        except ValueError:
            raise UsageError("usage", f"--since {value[:40]!r} is not a real date/time") from None
        return value.strip()
    raise UsageError("usage", f"--since {value[:40]!r} is not a duration (30m, 12h, 7d) or a date/time")


@sent_app.callback()
def sent_cmd(
    ctx: typer.Context,
    agent: Optional[str] = typer.Option(None, "--agent", metavar="NAME", help="Only what agent NAME sent ('owner': at a terminal)."),
    peer: Optional[str] = typer.Option(None, "--peer", metavar="NAME", help="Only questions to peer NAME."),
    since: Optional[str] = typer.Option(None, "--since", metavar="WHEN", help="Only since a duration ago (30m, 12h, 7d) or a date/time."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON on stdout."),
) -> None:
    """List the outbound log, oldest first."""
    if ctx.invoked_subcommand is not None:
        list_options_only(ctx)
        return
    from node.policy.outbound import read_log

    rows = read_log(home_of(ctx), agent=agent, peer=peer, since=_since(since))
    if as_json:
        emit_json({"sent": rows})
        return
    if not rows:
        console.print("nothing was sent", highlight=False)
        return
    for r in rows:
        held = ", ".join(sorted({h["kind"] + (f" ({h['source']})" if h.get("source") else "") for h in r["holds"]}))
        came = r.get("result") or {}
        back = f"answered {came['answered']}" if "answered" in came else (f"{came.get('results', 0)} results" if came else "-")
        console.print(f"{r['at']}  {r['id']}  {r['decision']:<18} {r['agent']} -> {', '.join(p or '?' for p in r['peers'])}"
                      f"  {back}", highlight=False, markup=False)
        console.print(f"    {r['text'][:200]!r}" + (f"  held: {held}" if held else ""), highlight=False, markup=False)


@sent_app.command("approve")
def approve_cmd(ctx: typer.Context, qid: str = typer.Argument(..., metavar="ID", help="The id `outbound-needs-confirmation` named."),
                as_json: bool = typer.Option(False, "--json", help="Print JSON on stdout.")) -> None:
    """Let held question ID through once: the same agent's identical retry within 15 minutes is sent."""
    from node.policy.outbound import approve

    entry = approve(home_of(ctx), qid)
    if as_json:
        emit_json({"approved": qid, "agent": entry["agent"], "peers": entry["peers"], "holds": entry["holds"]})
    else:
        console.print(f"approved {qid}: the identical retry of {entry['agent']} to "
                      f"{', '.join(p or '?' for p in entry['peers'])} is sent once", highlight=False, markup=False)

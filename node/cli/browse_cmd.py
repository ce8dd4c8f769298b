"""``kith browse`` and ``kith feedback``: find live invitations, rate a session
(DESIGN §12; ``specs/community-api.md``). Registered in :data:`node.cli.app.COMMANDS`."""

from __future__ import annotations

from typing import Any, Optional

import typer

from node.cli.common import untrusted_console as console, emit_json, home_of, server_option
from node.cli.community_cmd import run_client, server_url_of


def browse_cmd(
    ctx: typer.Context,
    protocol: Optional[str] = typer.Option(None, "--protocol", metavar="P", help="A protocol name or a 64-hex protocol_id."),
    tag: Optional[str] = typer.Option(None, "--tag", metavar="T", help="Only invitations with this tag."),
    host: Optional[str] = typer.Option(None, "--host", metavar="KEY", help="Only this host's invitations (64-hex key)."),
    limit: int = typer.Option(20, "--limit", min=1, max=100, help="At most this many (1-100)."),
    cursor: Optional[str] = typer.Option(None, "--cursor", help="Continue from a previous page's next_cursor."),
    server: Optional[str] = server_option(),
    json_out: bool = typer.Option(False, "--json", help='Print {"invitations": [...], "next_cursor": ...} as one JSON document.'),
) -> None:
    """List live invitations on the community server, newest first (join one with
    `kith join POST_ID --server URL`)."""
    page = run_client(server, None, lambda c: c.browse(protocol=protocol, tag=tag, host=host,
                                                         limit=limit, cursor=cursor))
    if json_out:
        emit_json(page)
        return
    posts = page["invitations"]
    if not posts:
        console.print("no live invitations match", highlight=False)
    for post in posts:
        inv = post["invitation"]
        who = post["host_display_name"] or inv["host_public_key"][:16] + "…"
        cap = f"{post['sessions']}/{post['max_sessions']}" if post["max_sessions"] else str(post["sessions"])
        online = post.get("online")
        alive = ("online" if online else "offline" if online is False else "liveness unknown")
        if online and post.get("lease_expires_at"):
            alive = f"online (lease to {post['lease_expires_at']})"
        console.print(f"{post['post_id']}  {inv['protocol']['name']} "
                      f"{inv['protocol']['version']}  by {who}  sessions {cap}  "
                      f"expires {post['expires_at']}  {alive}", highlight=False)
        line = " ".join(f"#{t}" for t in inv.get("tags") or [])
        if inv.get("message"):
            line = f"{inv['message']}  {line}".strip()
        if line:
            console.print(f"    {line}", highlight=False)
    if page["next_cursor"]:
        console.print(f"more: --cursor {page['next_cursor']}", highlight=False)


def feedback_cmd(
    ctx: typer.Context,
    session_id: str = typer.Argument(..., metavar="SESSION_ID", help="The session's 64-hex id (printed by join and host)."),
    rating: int = typer.Option(..., "--rating", min=1, max=5, help="1 (bad) to 5 (great)."),
    comment: Optional[str] = typer.Option(None, "--comment", help="At most 1000 characters."),
    server: Optional[str] = server_option(),
    json_out: bool = typer.Option(False, "--json", help="Print the session's ratings as JSON."),
) -> None:
    """Rate a session you took part in (once; signed with your key)."""

    async def call(client: Any) -> Any:
        return await client.submit_feedback(session_id, rating, comment)

    result = run_client(server_url_of(server), home_of(ctx), call, signed=True)  # no-server first
    if json_out:
        emit_json(result)
    else:
        console.print(f"rated session {session_id[:16]}… {rating}/5 "
                      f"({len(result['feedback'])} rating(s) recorded)", highlight=False)

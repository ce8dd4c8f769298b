"""``kith community``: run the community server (DESIGN §12; ``specs/community-api.md``)."""

from __future__ import annotations

import logging
import sys

import typer

from node.cli.common import emit_json, err_console, home_of
from node.community.server import (
    DEFAULT_PORT,
    base_url_of,
    bind_socket,
    create_app,
    is_loopback,
    serve_forever,
)
from node.community.store import default_db_path
from node.errors import UsageError

community_app = typer.Typer(
    name="community",
    help=(
        "The community server: helps peers find each other (invitations, session proofs). "
        "It never sees a query or an answer."
    ),
    no_args_is_help=True,
)


@community_app.command("serve")
def serve(
    ctx: typer.Context,
    host: str = typer.Option(
        "127.0.0.1", "--host", metavar="ADDR",
        help="Address to listen on. Loopback only unless --public is given.",
    ),
    port: int = typer.Option(
        DEFAULT_PORT, "--port", min=0, max=65535, help="TCP port (0 picks a free one).",
    ),
    public: bool = typer.Option(
        False, "--public",
        help=(
            "Allow a non-loopback --host (e.g. 0.0.0.0). The server speaks plain HTTP: put "
            "it behind a TLS reverse proxy before exposing it beyond this machine."
        ),
    ),
    json_out: bool = typer.Option(
        False, "--json", help='Print {"url": ...} on stdout once listening (stdout: JSON only).',
    ),
    access_log: bool = typer.Option(False, "--access-log", help="Log each request on stderr."),
) -> None:
    """Serve the community REST API (/api/v1) from this home's database until Ctrl-C/SIGTERM.

    Database: <home>/community/community.sqlite3 (SQLite, WAL). The URL goes to stderr.
    """
    if not is_loopback(host) and not public:
        raise UsageError("server-not-public",
                         f"refusing to listen on non-loopback address {host} without --public",
                         hint="pass --public to serve beyond this machine (behind TLS)")
    if access_log:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    db_path = default_db_path(home_of(ctx))
    app = create_app(db_path)
    sock = bind_socket(host, port)
    url = base_url_of(sock)
    try:
        err_console.print(f"kith community server listening on {url} (Ctrl-C to stop)",
                          highlight=False)
        if json_out:
            emit_json({"url": url})
        serve_forever(app, sock, access_log=access_log)
    finally:
        sock.close()
    err_console.print("kith community server stopped", highlight=False)

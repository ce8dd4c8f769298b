"""``kith community``: run the community server and talk to one (DESIGN §12;
``specs/community-api.md``).

``serve`` runs the server (SQLite in the home by default, ``--database-url`` for
PostgreSQL; several ``serve`` processes may share one PostgreSQL database), ``migrate``
brings a database's schema forward, ``backup`` copies a SQLite database online. The other sub-commands are clients: ``register`` / ``identity`` (profiles),
``publish-protocol`` / ``fetch-protocol`` (specs by content), ``status`` / ``renew`` /
``withdraw`` (a Host's posts), ``session`` / ``close`` (session status). ``kith browse``
and ``kith feedback`` live in :mod:`node.cli.browse_cmd`.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, TypeVar

import anyio
import typer

from node.cli.common import (emit_json, err_console, home_if_any, home_of, identity_home_of, new_home_of,
                             host_option, port_option, server_option)
from node.cli.common import untrusted_console as console
from node.common.errors import CommunityError, ConfigError, UsageError
from node.community.defaults import DEFAULT_LEASE_TTL_S, DEFAULT_POOL_SIZE, DEFAULT_PORT

if TYPE_CHECKING:
    from node.community.store import CommunityStore
# node.community.store (and sqlite3) is imported by the commands that open a store, never
# for `kith --help` (issue 19: --help never imports the community server side).

community_app = typer.Typer(
    name="community",
    help=(
        "The community server: helps peers find each other (identities, protocol specs, "
        "invitations, session proofs, feedback). It never sees a query or an answer."
    ),
    no_args_is_help=True,
)

T = TypeVar("T")

def server_url_of(server: str | None) -> str:
    """The server URL to use, or ConfigError ``no-server`` (DESIGN §5)."""
    if not server:
        raise ConfigError("no-server", "this command needs a community server: pass "
                                       "--server URL (or set KITH_SERVER)")
    return server


def run_client(server: str | None, home: Path | None,
               call: Callable[[Any], Awaitable[T]], *, signed: bool = False) -> T:
    """Open a :class:`CommunityClient` (signing with the home's identity when ``signed``),
    run ``call(client)`` and return its result."""
    from node.community.client import CommunityClient

    url = server_url_of(server)
    identity = None
    if signed:
        from node.trust.identity import load_identity

        assert home is not None
        identity = load_identity(home)

    async def main() -> T:
        async with CommunityClient(url, identity) as client:
            return await call(client)

    return anyio.run(main, backend="asyncio")


# ----------------------------------------------------------------------------- serve
DATABASE_HELP = ("postgresql://user:pass@host:5432/db (needs the postgres extra: scripts/setup --postgres) or "
                 "sqlite:///ABS/PATH. Default: SQLite in <home>/community/.")
#: First and largest pause between attempts to reach a database that is down, in seconds.
RETRY_FIRST_S, RETRY_MAX_S = 0.5, 8.0


def _database_of(ctx: typer.Context, database_url: str | None, *, create: bool = False) -> Path | str:
    """``--database-url`` when given (the home is then not touched), else the SQLite file
    in the home: created with it by ``serve`` (``create``), which ``migrate``/``backup``
    require to exist (``home-not-initialized`` otherwise, issue 20)."""
    if database_url:
        return database_url
    from node.community.store import default_db_path

    return default_db_path(new_home_of(ctx) if create else home_of(ctx, server=True))


def open_store_retrying(database: Path | str, *, wait_s: float, migrate: bool = False,
                        pool_size: int = DEFAULT_POOL_SIZE, existing: bool = False) -> CommunityStore:
    """Open the store; a PostgreSQL database that cannot be reached is retried with
    exponential backoff (0.5 s doubling to 8 s) for up to ``wait_s`` seconds, one line on
    stderr per attempt (never the URL's password), then refused. ``existing``: a SQLite
    file that is not there is refused, not created (:func:`node.community.store.open_store`).

    Raises:
        CommunityError: ``database-unavailable`` after ``wait_s``; any other refusal of
            :func:`node.community.store.open_store` at once.
    """
    from node.community.store import open_store

    deadline = time.monotonic() + wait_s
    delay = RETRY_FIRST_S
    while True:
        remaining = deadline - time.monotonic()
        try:
            return open_store(database, migrate=migrate, pool_size=pool_size,
                              connect_timeout_s=max(1.0, min(5.0, remaining)), existing=existing)
        except CommunityError as exc:
            retry = isinstance(database, str) and not database.startswith("sqlite:")
            if exc.code != "database-unavailable" or not retry or remaining <= delay:
                raise
            err_console.print(f"{exc.message}; retrying in {delay:g} s", highlight=False,
                              markup=False, soft_wrap=True)
            time.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_S)


@community_app.command("serve")
def serve(
    ctx: typer.Context,
    host: str = host_option("Address to listen on. Loopback only unless --public is given."),
    port: int = port_option(DEFAULT_PORT),
    public: bool = typer.Option(
        False, "--public",
        help=(
            "Allow a non-loopback --host (e.g. 0.0.0.0). The server speaks plain HTTP: put "
            "it behind a TLS reverse proxy before exposing it beyond this machine."
        ),
    ),
    database_url: Optional[str] = typer.Option(
        None, "--database-url", metavar="URL", envvar="KITH_COMMUNITY_DATABASE_URL",
        help=DATABASE_HELP,
    ),
    pool_size: int = typer.Option(
        DEFAULT_POOL_SIZE, "--pool-size", min=1, max=1000,
        help="PostgreSQL connections this process keeps at most (N instances: N x this).",
    ),
    database_wait: float = typer.Option(
        30.0, "--database-wait", min=0, metavar="SECONDS",
        help="How long to keep retrying a PostgreSQL database that is down at start.",
    ),
    lease_ttl: float = typer.Option(
        DEFAULT_LEASE_TTL_S, "--lease-ttl", min=3, max=24 * 3600, metavar="SECONDS",
        help="A post leaves browse this long after its host's last lease refresh (hosts refresh every third of it).",
    ),
    key_rate: float = typer.Option(5.0, "--key-rate", min=0, help="Signed requests per second per key (0: no limit)."),
    key_burst: int = typer.Option(30, "--key-burst", min=1, help="Burst of signed requests per key."),
    address_rate: float = typer.Option(50.0, "--address-rate", min=0, help="Requests per second per client address (0: no limit)."),
    address_burst: int = typer.Option(200, "--address-burst", min=1, help="Burst of requests per client address."),
    json_out: bool = typer.Option(
        False, "--json", help='Print {"url": ..., "database": ...} on stdout once listening (stdout: JSON only).',
    ),
    access_log: bool = typer.Option(False, "--access-log", help="Log each request on stderr."),
    trust_proxy: list[str] = typer.Option([], "--trust-proxy", metavar="CIDR", help="A reverse proxy (IP or CIDR network, repeatable) whose X-Forwarded-For header names the client for the per-address limit. Without it the header is ignored."),
    mailbox: bool = typer.Option(False, "--mailbox", help="Keep sealed questions and answers for nodes that are never up together (opaque sealed records only: keys, times, a size bucket, ciphertext; specs/sealed.md). Off by default."),
    mailbox_per_sender: int = typer.Option(200, "--mailbox-per-sender", min=1, metavar="N", help="With --mailbox: sealed records one sender may have waiting."),
    mailbox_per_recipient: int = typer.Option(2000, "--mailbox-per-recipient", min=1, metavar="N", help="With --mailbox: sealed records that may wait for one recipient."),
    mailbox_max_records: int = typer.Option(100_000, "--mailbox-max-records", min=1, metavar="N", help="With --mailbox: sealed records kept in total."),
    mailbox_max_mb: int = typer.Option(512, "--mailbox-max-mb", min=1, metavar="MIB", help="With --mailbox: the sum of the kept records' size buckets, in MiB."),
) -> None:
    """Serve the community REST API (/api/v1) until Ctrl-C/SIGTERM.

    Database: <home>/community/community.sqlite3 (SQLite, WAL) unless --database-url. The
    URL goes to stderr.
    """
    from node.common.http import base_url_of, bind_socket, is_loopback, parse_trust_proxy, serve_forever
    from node.community.ratelimit import RateLimit, RateLimits
    from node.community.server import create_app

    if not is_loopback(host) and not public:
        raise CommunityError("server-not-public",
                             f"refusing to listen on non-loopback address {host} without --public",
                             exit_code=2, hint="pass --public to serve beyond this machine (behind TLS)")
    if not mailbox:  # a bound of a mailbox that is off would look set up and do nothing
        for name, flag in (("mailbox_per_sender", "--mailbox-per-sender"),
                           ("mailbox_per_recipient", "--mailbox-per-recipient"),
                           ("mailbox_max_records", "--mailbox-max-records"), ("mailbox_max_mb", "--mailbox-max-mb")):
            source = ctx.get_parameter_source(name)  # the CLI library's enum: compared by name
            if source is not None and source.name != "DEFAULT":
                raise UsageError("usage", f"{flag} bounds the mailbox, which is off: add --mailbox")
    proxies = parse_trust_proxy(trust_proxy)
    if access_log:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    database = _database_of(ctx, database_url, create=True)
    limits = RateLimits(per_key=RateLimit(key_rate, key_burst),
                        per_address=RateLimit(address_rate, address_burst))
    store = open_store_retrying(database, wait_s=database_wait, pool_size=pool_size)
    from node.community.store import SqliteStore

    try:
        if isinstance(store, SqliteStore):
            store.lock_single_writer()  # a second serve on this file is refused clearly
        from node.community.store import MailboxLimits

        box = MailboxLimits(per_sender=mailbox_per_sender, per_recipient=mailbox_per_recipient,
                            max_records=mailbox_max_records, max_bytes=mailbox_max_mb << 20) if mailbox else None
        app = create_app(store, rate_limits=limits, lease_ttl_s=lease_ttl, mailbox=box)
        sock = bind_socket(host, port)
        url = base_url_of(sock)
        try:
            err_console.print(f"kith community server listening on {url} ({store.describe()}"
                              f"{'; mailbox on' if mailbox else ''}; Ctrl-C to stop)",
                              highlight=False, markup=False, soft_wrap=True)
            if json_out:
                emit_json({"url": url, "database": store.dialect})
            serve_forever(app, sock, access_log=access_log, trust_proxy=proxies)
        finally:
            sock.close()
    finally:
        store.close()
    err_console.print("kith community server stopped", highlight=False)


@community_app.command("migrate")
def migrate_cmd(
    ctx: typer.Context,
    database_url: Optional[str] = typer.Option(
        None, "--database-url", metavar="URL", envvar="KITH_COMMUNITY_DATABASE_URL",
        help=DATABASE_HELP,
    ),
    json_out: bool = typer.Option(False, "--json", help='Print {"applied": [...], "schema_version": N}.'),
) -> None:
    """Bring the community database's schema forward (ordered migrations, in one
    transaction). Stop the servers and back the database up first; `serve` refuses an
    older schema with this command. A SQLite file that is not there is refused, never
    created."""
    store = open_store_retrying(_database_of(ctx, database_url), wait_s=0, migrate=True, existing=True)
    try:
        applied, version = list(getattr(store, "applied", [])), store.schema_version()
    finally:
        store.close()
    if json_out:
        emit_json({"applied": applied, "schema_version": version})
    elif applied:
        console.print(f"migrated {store.describe()} to schema version {version} "
                      f"(applied {', '.join(map(str, applied))})", highlight=False)
    else:
        console.print(f"{store.describe()} is at schema version {version}; nothing to do",
                      highlight=False)


@community_app.command("backup")
def backup_cmd(
    ctx: typer.Context,
    path: Path = typer.Argument(..., metavar="PATH", help="The new backup file (must not exist)."),
    database_url: Optional[str] = typer.Option(
        None, "--database-url", metavar="URL", envvar="KITH_COMMUNITY_DATABASE_URL",
        help="sqlite:///ABS/PATH (default: SQLite in <home>/community/).",
    ),
    json_out: bool = typer.Option(False, "--json", help='Print {"backup": PATH, "bytes": N}.'),
) -> None:
    """Copy a SQLite community database with SQLite's online backup API (safe while the
    server runs). For PostgreSQL use pg_dump."""
    database = _database_of(ctx, database_url)
    if isinstance(database, str) and not database.startswith("sqlite:"):
        raise UsageError("usage", "kith community backup copies a SQLite database; back up "
                                  "PostgreSQL with pg_dump")
    from node.community.store import SqliteStore, open_store

    store = open_store(database, existing=True)
    try:
        assert isinstance(store, SqliteStore)
        size = store.backup(path)
    finally:
        store.close()
    if json_out:
        emit_json({"backup": str(path), "bytes": size})
    else:
        console.print(f"backed up {store.describe()} to {path} ({size} bytes)", highlight=False)


# ----------------------------------------------------------------------------- identities
@community_app.command("register")
def register_cmd(
    ctx: typer.Context,
    name: str = typer.Option(..., "--name", help="Display name shown with your invitations (1-64 characters)."),
    about: str = typer.Option("", "--about", help="A short profile text (at most 500 characters)."),
    server: Optional[str] = server_option(),
    json_out: bool = typer.Option(False, "--json", help="Print the stored identity as JSON."),
) -> None:
    """Register this node's key with a profile (the signed request proves you hold the key);
    run again to change the profile."""
    record = run_client(server, identity_home_of(ctx), lambda c: c.register_identity(name, about),
                        signed=True)
    if json_out:
        emit_json(record)
    else:
        console.print(f"registered {record['public_key'][:16]}… as {record['display_name']}",
                      highlight=False)


@community_app.command("identity")
def identity_cmd(
    ctx: typer.Context,
    public_key: str = typer.Argument(..., metavar="PUBLIC_KEY", help="64-hex public key."),
    server: Optional[str] = server_option(),
    json_out: bool = typer.Option(False, "--json", help="Print the identity as JSON."),
) -> None:
    """Show a registered identity: profile and the ratings it received."""
    record = run_client(server, None, lambda c: c.get_identity(public_key))
    if json_out:
        emit_json(record)
        return
    ratings = record["ratings"]
    avg = f"{ratings['average']:.2f}" if ratings["average"] is not None else "-"
    console.print(f"{record['display_name']}  {record['public_key']}", highlight=False)
    if record["about"]:
        console.print(f"  {record['about']}", highlight=False)
    console.print(f"  ratings: {ratings['count']} (average {avg}); since {record['created_at']}",
                  highlight=False)


# ----------------------------------------------------------------------------- protocols
def _spec_of(target: str, home: Path | None) -> dict[str, Any]:
    from node.protocol.spec import load_spec, resolve_protocol_dir

    return load_spec(resolve_protocol_dir(target, home)).raw


@community_app.command("publish-protocol")
def publish_protocol_cmd(
    ctx: typer.Context,
    target: str = typer.Argument(..., metavar="DIR|NAME", help="A protocol folder or an installed protocol name."),
    server: Optional[str] = server_option(),
    json_out: bool = typer.Option(False, "--json", help="Print the published record as JSON."),
) -> None:
    """Publish a protocol's spec.json by content; anyone can fetch it by protocol_id."""
    spec = _spec_of(target, home_if_any(ctx))
    record = run_client(server, identity_home_of(ctx), lambda c: c.publish_protocol(spec), signed=True)
    if json_out:
        emit_json({k: v for k, v in record.items() if k != "spec"})
    else:
        console.print(f"published {record['name']} {record['version']}  {record['protocol_id']}",
                      highlight=False)


@community_app.command("fetch-protocol")
def fetch_protocol_cmd(
    ctx: typer.Context,
    protocol_id: str = typer.Argument(..., metavar="PROTOCOL_ID", help="64-hex protocol_id."),
    out: Optional[Path] = typer.Option(None, "--out", metavar="DIR", help="Write DIR/spec.json (the folder is created)."),
    server: Optional[str] = server_option(),
    json_out: bool = typer.Option(False, "--json", help="Print the record (with the spec) as JSON."),
) -> None:
    """Fetch a published spec by protocol_id; its hash is checked before it is shown or written."""
    from node.common.home import atomic_write

    record = run_client(server, None, lambda c: c.get_protocol(protocol_id))
    if out is not None:
        if (out / "spec.json").exists():
            raise UsageError("usage", f"{out / 'spec.json'} exists; choose another --out folder")
        out.mkdir(parents=True, exist_ok=True)
        atomic_write(out / "spec.json",
                     (json.dumps(record["spec"], indent=2, ensure_ascii=False) + "\n").encode(),
                     mode=0o644)
    if json_out:
        emit_json(record)
    else:
        console.print(f"{record['name']} {record['version']}  {record['protocol_id']}"
                      + (f"  → {out / 'spec.json'}" if out is not None else ""), highlight=False)


# ----------------------------------------------------------------------------- posts
def _print_post(post: dict[str, Any]) -> None:
    cap = post["max_sessions"] if post["max_sessions"] is not None else "∞"
    lease = post.get("lease_expires_at")
    console.print(f"{post['post_id']}  {post['state']}  sessions {post['sessions']}/{cap}  "
                  f"expires {post['expires_at']}"
                  + (f"  withdrawn {post['withdrawn_at']}" if post["withdrawn_at"] else "")
                  + (f"  lease to {lease}" if lease else "  no lease"),
                  highlight=False)


@community_app.command("status")
def status_cmd(
    ctx: typer.Context,
    post_id: str = typer.Argument(..., metavar="POST_ID"),
    server: Optional[str] = server_option(),
    json_out: bool = typer.Option(False, "--json", help="Print the post as JSON."),
) -> None:
    """Show a post's state (live, expired, withdrawn, consumed) and its session count."""
    post = run_client(server, None, lambda c: c.invitation_status(post_id))
    emit_json(post) if json_out else _print_post(post)


@community_app.command("renew")
def renew_cmd(
    ctx: typer.Context,
    post_id: str = typer.Argument(..., metavar="POST_ID"),
    ttl: int = typer.Option(24 * 3600, "--ttl", min=60, max=30 * 24 * 3600, help="New lifetime from now, in seconds."),
    server: Optional[str] = server_option(),
    json_out: bool = typer.Option(False, "--json", help="Print the renewed invitation as JSON."),
) -> None:
    """Extend your post's expiry (re-signs the transport binding; the host key only)."""
    from node.trust.invitation import parse_invitation

    async def call(client: Any) -> Any:
        post = await client.invitation_status(post_id)
        return await client.renew_invitation(parse_invitation(post["invitation"]), ttl_s=ttl)

    inv = run_client(server, identity_home_of(ctx), call, signed=True)
    if json_out:
        emit_json(inv.to_dict())
    else:
        console.print(f"{inv.post_id} now expires {inv.expires_at}", highlight=False)


@community_app.command("withdraw")
def withdraw_cmd(
    ctx: typer.Context,
    post_id: str = typer.Argument(..., metavar="POST_ID"),
    server: Optional[str] = server_option(),
    json_out: bool = typer.Option(False, "--json", help="Print the post as JSON."),
) -> None:
    """Withdraw your post: it leaves browse and can no longer be joined (recorded sessions
    stay valid for feedback)."""
    post = run_client(server, identity_home_of(ctx), lambda c: c.withdraw_invitation(post_id), signed=True)
    emit_json(post) if json_out else _print_post(post)


# ----------------------------------------------------------------------------- sessions
def _print_session(record: dict[str, Any]) -> None:
    console.print(f"session {record['session_id']}  {record['state']}"
                  + (f" ({record['close_reason']}, {record['closed_at']})" if record["closed_at"] else ""),
                  highlight=False)
    console.print(f"  post {record['post_id']}  started {record['created_at']}", highlight=False)
    console.print(f"  host  {record['host_public_key']}\n  guest {record['guest_public_key']}",
                  highlight=False)


@community_app.command("session")
def session_cmd(
    ctx: typer.Context,
    session_id: str = typer.Argument(..., metavar="SESSION_ID"),
    server: Optional[str] = server_option(),
    json_out: bool = typer.Option(False, "--json", help="Print the session record as JSON."),
) -> None:
    """Show a recorded session: participants, start, open or closed (and why)."""
    record = run_client(server, None, lambda c: c.get_session(session_id))
    emit_json(record) if json_out else _print_session(record)


@community_app.command("close")
def close_cmd(
    ctx: typer.Context,
    session_id: str = typer.Argument(..., metavar="SESSION_ID"),
    reason: str = typer.Option("closed", "--reason", help="A short code: a-z 0-9 - (e.g. completed)."),
    server: Optional[str] = server_option(),
    json_out: bool = typer.Option(False, "--json", help="Print the session record as JSON."),
) -> None:
    """Mark a session you took part in as closed (host and guest do it at the end anyway)."""
    record = run_client(server, identity_home_of(ctx), lambda c: c.close_session(session_id, reason),
                        signed=True)
    emit_json(record) if json_out else _print_session(record)

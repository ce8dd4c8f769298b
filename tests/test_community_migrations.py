"""Schema versions and migrations of the community database, on SQLite and on a real
PostgreSQL (the throwaway cluster of ``test_community_backends``): a database made by the
previous schema (version 2) is refused by ``serve`` with the command to run, ``kith
community migrate`` brings it forward keeping its rows, and a newer schema is refused with
the version it needs."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path

import httpx
import pytest

from node.community import store as store_mod
from node.community.server import run_server_in_thread
from node.community.store import SCHEMA_VERSION, open_store
from node.common.errors import CommunityError

from support.cli import kith_argv as kith
from support.community import NO_LIMITS, fresh_pg_database as _fresh_pg_database, invitation, pg_server  # noqa: F401
from support.homes import new_identity


@pytest.fixture(params=["sqlite", "postgresql"])
def target(request, tmp_path: Path) -> str:
    """A database URL (both kinds, so the CLI and the library take the same argument)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/community.sqlite3"
    return _fresh_pg_database(request.getfixturevalue("pg_server"))


def _execute_all(url: str, statements: list[tuple[str, tuple]]) -> None:
    if url.startswith("sqlite:"):
        with sqlite3.connect(url[len("sqlite://"):]) as conn:
            for sql, params in statements:
                conn.execute(sql, params)
        return
    import psycopg

    with psycopg.connect(url) as conn:
        for sql, params in statements:
            conn.execute(sql.replace("?", "%s"), params)


def make_v2_database(url: str) -> dict:
    """A database exactly as schema version 2 made it, with an identity and a live post."""
    types = store_mod._SQLITE_TYPES if url.startswith("sqlite:") else store_mod._PG_TYPES
    script = store_mod._SCHEMA_TEMPLATE.format(**types)
    host = new_identity()
    inv = invitation(host)
    statements = [(s, ()) for s in script.split(";") if s.strip()]
    statements += [
        ("INSERT INTO meta (key, value) VALUES ('schema_version', '2')", ()),
        ("INSERT INTO identities VALUES (?, ?, ?, ?, ?)", (host.public_key, "Old Host", "", 1.0, 1.0)),
        ("INSERT INTO invitations (post_id, host_public_key, protocol_id, protocol_name, document, "
         "expires_unix, created_unix) VALUES (?, ?, ?, ?, ?, ?, ?)",
         (inv.post_id, host.public_key, inv.protocol.protocol_id, inv.protocol.name,
          json.dumps(inv.to_dict()), 4e9, 1.0)),
    ]
    _execute_all(url, statements)
    return {"host": host, "post_id": inv.post_id}


def test_an_old_schema_is_refused_then_migrated_keeping_its_rows(target: str,
                                                                  tmp_path: Path) -> None:
    old = make_v2_database(target)
    with pytest.raises(CommunityError) as err:
        open_store(target)
    assert err.value.code == "database-schema-old"
    assert "version 2" in err.value.message and "kith community migrate" in err.value.message
    # serve says the same and exits, without a traceback
    r = subprocess.run(kith(tmp_path / "h", "community", "serve", "--port", "0", "--json",
                            "--database-url", target), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert json.loads(r.stdout)["error"]["code"] == "database-schema-old"
    # kith community migrate brings it forward; a second run has nothing to do
    r = subprocess.run(kith(tmp_path / "h", "community", "migrate", "--json",
                            "--database-url", target), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"applied": [3, 4, 5, 6, 7, 8], "schema_version": SCHEMA_VERSION}
    r = subprocess.run(kith(tmp_path / "h", "community", "migrate", "--json",
                            "--database-url", target), capture_output=True, text=True,
                       timeout=60)
    assert json.loads(r.stdout) == {"applied": [], "schema_version": SCHEMA_VERSION}
    with run_server_in_thread(target, rate_limits=NO_LIMITS) as url, \
            httpx.Client(base_url=url, timeout=20) as http:
        # the old post is still listed; its liveness is unknown (published before leases)
        listed = http.get("/api/v1/invitations").json()["invitations"]
        assert [(p["post_id"], p["online"], p["host_display_name"]) for p in listed] == \
            [(old["post_id"], None, "Old Host")]
        # the old display name got its look-alike skeletons: a copy is refused
        from node.community.requests import signed_headers

        body = json.dumps({"display_name": "0ld H\u200bost"}).encode()
        copy = http.post("/api/v1/identities", content=body, headers=signed_headers(
            new_identity(), "POST", "/api/v1/identities", body))
        assert copy.status_code == 409 and copy.json()["error"]["code"] == "display-name-taken"


def test_a_newer_schema_is_refused_with_the_version_it_needs(target: str) -> None:
    open_store(target).close()  # current schema
    _execute_all(target, [("INSERT INTO schema_migrations (version, name, applied_unix) "
                           "VALUES (?, ?, ?)", (SCHEMA_VERSION + 1, "from the future", 2.0))])
    for migrate in (False, True):
        with pytest.raises(CommunityError) as err:
            open_store(target, migrate=migrate)
        assert err.value.code == "database-schema-newer"
        assert f"version {SCHEMA_VERSION + 1}" in err.value.message
        assert f"this server's {SCHEMA_VERSION}" in err.value.message


def test_another_applications_database_is_refused_and_left_as_it_was(target: str, tmp_path: Path) -> None:
    """A database with tables but no Kith schema version (another application's) is not
    taken for an empty one: ``serve`` and ``migrate`` refuse it ``database-foreign`` with a
    hint, and create nothing in it (they made the whole community schema beside its
    tables)."""
    _execute_all(target, [("CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT)", ()),
                          ("INSERT INTO orders (id, item) VALUES (?, ?)", (1, "valve"))])
    for migrate in (False, True):
        with pytest.raises(CommunityError) as err:
            open_store(target, migrate=migrate)
        assert err.value.code == "database-foreign" and err.value.hint
    r = subprocess.run(kith(tmp_path / "h", "community", "migrate", "--database-url", target),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "error [database-foreign]" in r.stderr and "hint:" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    if target.startswith("sqlite:"):
        with sqlite3.connect(target[len("sqlite://"):]) as conn:
            tables = [row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    else:
        import psycopg

        with psycopg.connect(target) as conn:
            tables = [row[0] for row in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()")]
    assert tables == ["orders"]


def test_an_empty_database_starts_at_the_current_version(target: str) -> None:
    store = open_store(target)
    try:
        assert store.schema_version() == SCHEMA_VERSION and store.applied == [2, 3, 4, 5, 6, 7, 8]
    finally:
        store.close()
    again = open_store(target)
    try:
        assert again.applied == []
    finally:
        again.close()


def test_a_v7_mailbox_is_keyed_by_sender_and_id_after_migrating(target: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Version 8 keys the mailbox by (sender, record id): a record kept by a version-7
    database is still handed out and acked after `kith community migrate`, and another
    sender's record under its id is then a record of its own."""
    with monkeypatch.context() as m:  # a database exactly as version 7 made it
        m.setattr(store_mod, "SCHEMA_VERSION", 7)
        m.setattr(store_mod, "MIGRATIONS", store_mod.MIGRATIONS[:-1])
        open_store(target).close()
    sender, other, host = new_identity(), new_identity(), new_identity()
    rid = "ab" * 16
    _execute_all(target, [
        ("INSERT INTO mailbox (record_id, sender_key, bucket, sealed_box, created_unix, expires_unix, stored_unix) "
         "VALUES (?, ?, ?, ?, ?, ?, ?)", (rid, sender.public_key, 1024, b"\0" * 1064, 1.0, 4e9, 1.0)),
        ("INSERT INTO mailbox_recipients (recipient_key, record_id, wrapped_key, stored_unix) VALUES (?, ?, ?, ?)",
         (host.public_key, rid, b"\1" * 80, 1.0)),
    ])
    store = open_store(target, migrate=True)
    try:
        assert store.applied == [8] and store.schema_version() == SCHEMA_VERSION
        limits = store_mod.MailboxLimits()
        assert store.put_sealed(record_id=rid, sender=other.public_key, recipients={host.public_key: b"\2" * 80},
                                bucket=1024, box=b"\3" * 1064, created_unix=2.0, expires_unix=4e9, limits=limits,
                                now=3.0) == "new"
        records, _ = store.take_sealed(host.public_key, limit=10, max_bytes=1 << 20, now=3.0)
        assert [(r["sender"], r["id"], r["recipients"]) for r in records] == [
            (sender.public_key, rid, {host.public_key: b"\1" * 80}), (other.public_key, rid, {host.public_key: b"\2" * 80})]
        assert store.ack_sealed(host.public_key, [(other.public_key, rid)]) == 1  # only that sender's
        records, _ = store.take_sealed(host.public_key, limit=10, max_bytes=1 << 20, now=3.0)
        assert [r["sender"] for r in records] == [sender.public_key]
        assert store.mailbox_totals() == store.mailbox_usage() == {"records": 1, "bytes": 1024}
    finally:
        store.close()

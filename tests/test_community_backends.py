"""The community server on both stores: SQLite (default) and PostgreSQL (``--database-url``).

The PostgreSQL half starts a throwaway cluster with the real ``initdb``/``pg_ctl`` on a
unix socket in a temporary folder (as the ``postgres`` user when the tests run as root) and
skips with a reason when the binaries or psycopg are absent. The same scenario — the whole
lifecycle of a post, racing proofs against ``max_sessions``, replayed nonces, feedback —
must behave identically on both (DESIGN §12).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from node.community.requests import signed_headers
from node.community.server import run_server_in_thread
from node.community.store import MAILBOX_TABLES, TABLES, PostgresStore, open_store
from node.common.errors import CommunityError
from node.trust.identity import Identity

from support.community import (  # noqa: F401 (pg_server: a fixture)
    NO_LIMITS,
    assert_no_content_columns,
    error_of,
    free_port as _free_port,
    fresh_pg_database as _fresh_pg_database,
    invitation,
    pg_server,
    session_proof,
)
from support.homes import new_identity


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request, tmp_path: Path) -> str | Path:
    if request.param == "sqlite":
        return tmp_path / "community.sqlite3"
    return _fresh_pg_database(request.getfixturevalue("pg_server"))


@pytest.fixture
def base_url(database) -> Iterator[str]:
    with run_server_in_thread(database, rate_limits=NO_LIMITS) as url:
        yield url


def post(http: httpx.Client, path: str, doc: dict | None, signer: Identity) -> httpx.Response:
    body = b"" if doc is None else json.dumps(doc).encode()
    return http.post(path, content=body, headers=signed_headers(signer, "POST", path, body))


# --- the scenario, on both stores -------------------------------------------------------------------
def test_lifecycle_of_a_post_on_each_store(base_url: str) -> None:
    host, guest, other = new_identity(), new_identity(), new_identity()
    with httpx.Client(base_url=base_url, timeout=20) as http:
        assert post(http, "/api/v1/identities", {"display_name": "Host H"}, host).status_code == 201
        published = post(http, "/api/v1/invitations",
                         invitation(host, max_sessions=2, tags=["Docs"]).to_dict(), host)
        assert published.status_code == 201, published.text
        post_id = published.json()["post_id"]
        listed = http.get("/api/v1/invitations", params={"tag": "docs"}).json()["invitations"]
        assert [(p["post_id"], p["host_display_name"]) for p in listed] == [(post_id, "Host H")]
        proofs = [session_proof(host, g, post_id) for g in (guest, other)]
        assert post(http, "/api/v1/sessions", proofs[0], guest).status_code == 201
        again = post(http, "/api/v1/sessions", proofs[0], host)
        assert again.status_code == 409 and error_of(again) == "session-duplicate"
        assert post(http, "/api/v1/sessions", proofs[1], other).status_code == 201
        third = post(http, "/api/v1/sessions", session_proof(host, new_identity(), post_id), host)
        assert third.status_code == 409 and error_of(third) == "invitation-consumed"
        assert http.get("/api/v1/invitations", params={"tag": "docs"}).json()["invitations"] == []
        sid = proofs[0]["session_id"]
        closed = post(http, f"/api/v1/sessions/{sid}/close", {"reason": "completed"}, guest)
        assert closed.status_code == 200 and closed.json()["state"] == "closed"
        assert post(http, f"/api/v1/sessions/{sid}/feedback", {"rating": 5}, guest).status_code == 201
        dup = post(http, f"/api/v1/sessions/{sid}/feedback", {"rating": 1}, guest)
        assert dup.status_code == 409 and error_of(dup) == "feedback-duplicate"
        assert http.get(f"/api/v1/identities/{host.public_key}").json()["ratings"] == \
            {"count": 1, "average": 5.0}
        withdrawn = post(http, f"/api/v1/invitations/{post_id}/withdraw", None, host)
        assert withdrawn.json()["state"] == "withdrawn" and withdrawn.json()["sessions"] == 2
        # a replayed signed request is refused on this store too
        body = json.dumps({"display_name": "again"}).encode()
        headers = signed_headers(host, "POST", "/api/v1/identities", body)
        assert http.post("/api/v1/identities", content=body, headers=headers).status_code == 200
        replay = http.post("/api/v1/identities", content=body, headers=headers)
        assert replay.status_code == 409 and error_of(replay) == "request-replayed"


def test_racing_proofs_on_each_store(base_url: str) -> None:
    host = new_identity()
    with httpx.Client(base_url=base_url, timeout=20) as http:
        post_id = post(http, "/api/v1/invitations", invitation(host, max_sessions=2).to_dict(),
                       host).json()["post_id"]

    async def race() -> list[int]:
        async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:
            async def one() -> int:
                g = new_identity()
                body = json.dumps(session_proof(host, g, post_id)).encode()
                return (await client.post("/api/v1/sessions", content=body, headers=signed_headers(
                    g, "POST", "/api/v1/sessions", body))).status_code
            return await asyncio.gather(*(one() for _ in range(10)))

    assert sorted(asyncio.run(race())) == [201] * 2 + [409] * 8


#: The mailbox's columns and what each may hold (specs/sealed.md §3): keys (text), numbers
#: and times, and exactly two binary columns — the ciphertext and the wrapped content keys.
MAILBOX_COLUMNS = {
    "mailbox": {"record_id": "key", "sender_key": "key", "owed_to": "key", "bucket": "number", "sealed_box": "sealed",
                "created_unix": "number", "expires_unix": "number", "stored_unix": "number"},
    "mailbox_recipients": {"recipient_key": "key", "sender_key": "key", "record_id": "key", "wrapped_key": "sealed",
                           "stored_unix": "number"},
}
_KINDS = {"key": {"text"}, "number": {"integer", "bigint", "real", "double precision"},
          "sealed": {"blob", "bytea"}}


def test_schema_has_no_place_for_content_on_each_store(database) -> None:
    """The server never sees plaintext: no column sounds like content, and the mailbox's
    columns can hold only sealed bytes (binary) and metadata (keys, numbers, times)."""
    store = open_store(database)
    try:
        columns = store.columns()
        types = {t: store.column_types(t) for t in MAILBOX_TABLES}
    finally:
        store.close()
    assert set(columns) == set(TABLES)
    assert_no_content_columns({c for cols in columns.values() for c in cols})
    for table, expected in MAILBOX_COLUMNS.items():
        assert set(types[table]) == set(expected), table
        for column, kind in expected.items():
            assert types[table][column] in _KINDS[kind], (table, column, types[table][column])
    # nowhere else in the schema is there a binary column
    assert set(MAILBOX_TABLES) == set(MAILBOX_COLUMNS)


def test_reopening_keeps_the_data(database) -> None:
    host = new_identity()
    with run_server_in_thread(database, rate_limits=NO_LIMITS) as url, \
            httpx.Client(base_url=url, timeout=20) as http:
        post_id = post(http, "/api/v1/invitations", invitation(host).to_dict(),
                       host).json()["post_id"]
    with run_server_in_thread(database, rate_limits=NO_LIMITS) as url, \
            httpx.Client(base_url=url, timeout=20) as http:
        assert http.get(f"/api/v1/invitations/{post_id}").status_code == 200


# --- database URLs ---------------------------------------------------------------------------------
@pytest.mark.parametrize("url", ["mysql://x/y", "sqlite://relative.db", "sqlite:///", "nonsense"])
def test_a_bad_database_url_is_a_usage_error(url: str) -> None:
    with pytest.raises(CommunityError) as err:
        open_store(url)
    assert err.value.code == "database-url-invalid"


def test_sqlite_url_form(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path}/x.sqlite3")
    store.close()
    assert (tmp_path / "x.sqlite3").is_file()


def test_unreachable_postgres_is_a_clear_error_without_the_password() -> None:
    pytest.importorskip("psycopg_pool")
    port = _free_port()  # nothing listens there
    with pytest.raises(CommunityError) as err:
        PostgresStore(f"postgresql://kith:s3cret@127.0.0.1:{port}/db", connect_timeout_s=0.5)
    assert err.value.code == "database-unavailable"
    assert "s3cret" not in err.value.message and "kith@127.0.0.1" in err.value.message


def test_sqlite_file_that_is_not_a_database(tmp_path: Path) -> None:
    bad = tmp_path / "junk.sqlite3"
    bad.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(CommunityError) as err:
        open_store(bad)
    assert err.value.code == "database-unavailable" and str(tmp_path) not in err.value.message


def test_first_cut_sqlite_database_is_migrated(tmp_path: Path) -> None:
    """A schema-1 database (first cut: no seq, no close columns) keeps its rows."""
    import sqlite3

    db = tmp_path / "old.sqlite3"
    host, guest = new_identity(), new_identity()
    inv = invitation(host)
    proof = session_proof(host, guest, inv.post_id)
    with sqlite3.connect(db) as conn:
        conn.executescript("""
            CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
            INSERT INTO meta VALUES ('schema_version', '1');
            CREATE TABLE invitations (post_id TEXT PRIMARY KEY, host_public_key TEXT NOT NULL,
                protocol_id TEXT NOT NULL, document TEXT NOT NULL, expires_unix REAL NOT NULL,
                created_unix REAL NOT NULL);
            CREATE INDEX invitations_host ON invitations (host_public_key);
            CREATE TABLE sessions (session_id TEXT PRIMARY KEY, post_id TEXT NOT NULL,
                protocol_id TEXT NOT NULL, host_public_key TEXT NOT NULL,
                guest_public_key TEXT NOT NULL, guest_nonce TEXT NOT NULL,
                host_nonce TEXT NOT NULL, host_signature TEXT NOT NULL,
                guest_signature TEXT NOT NULL, created_at TEXT NOT NULL);
            CREATE TABLE request_nonces (nonce TEXT PRIMARY KEY, public_key TEXT NOT NULL,
                timestamp INTEGER NOT NULL, seen_unix REAL NOT NULL);
        """)
        conn.execute("INSERT INTO invitations VALUES (?, ?, ?, ?, ?, ?)",
                     (inv.post_id, host.public_key, inv.protocol.protocol_id,
                      json.dumps(inv.to_dict()), 4e9, 1.0))
        cols = ("session_id", "post_id", "protocol_id", "host_public_key", "guest_public_key",
                "guest_nonce", "host_nonce", "host_signature", "guest_signature")
        conn.execute(f"INSERT INTO sessions ({', '.join(cols)}, created_at) VALUES "
                     f"({', '.join('?' for _ in cols)}, '2030-01-01T00:00:00Z')",
                     tuple(proof[c] for c in cols))
    with pytest.raises(CommunityError) as err:  # serving an old schema is refused...
        open_store(db)
    assert err.value.code == "database-schema-old" and "kith community migrate" in err.value.message
    store = open_store(db, migrate=True)  # ...`kith community migrate` brings it forward
    assert store.applied == [2, 3, 4, 5, 6, 7, 8] and store.schema_version() == 8
    row = store.get_invitation(inv.post_id)
    assert row is not None and row.sessions_count == 1 and row.document["post_id"] == inv.post_id
    assert store.get_session(proof["session_id"])["closed_unix"] is None
    assert store.close_session(proof["session_id"], closed_by=guest.public_key, reason="x", now=5.0)


def test_postgres_without_psycopg_names_the_extra(tmp_path: Path) -> None:
    code = ("import sys; sys.modules['psycopg'] = None; sys.modules['psycopg_pool'] = None\n"
            "from node.community.store import open_store\n"
            "from node.common.errors import CommunityError\n"
            "try:\n    open_store('postgresql://u@localhost/db')\n"
            "except CommunityError as e:\n    print(e.code, e.hint)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.strip() == ("database-driver-missing from the kith checkout: scripts/setup --postgres, "
                                  "or pip install '.[postgres]'")

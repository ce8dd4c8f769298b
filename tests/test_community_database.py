"""The community database misbehaving, as an operator would see it (issue 14): a database
that is down at start (retried with backoff, then a clear error, no traceback), one that
goes away mid-run (503 with a code, served again once it is back), a malformed or
password-bearing URL (never echoed), the capped pool, statement timeouts, and the online
SQLite backup. Real processes, a real throwaway PostgreSQL cluster of its own (it is
stopped and started here), real SQLite."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from node.community.server import run_server_in_thread
from node.community.store import SCHEMA_VERSION, PostgresStore, SqliteStore
from node.common.errors import CommunityError

from support.cli import kith_argv as kith, next_line, readline
from support.community import (
    NO_LIMITS,
    PgCluster,
    error_of,
    free_port as _free_port,
    fresh_pg_database as _fresh_pg_database,
    invitation,
    post,
)
from support.homes import new_identity
from support.waits import wait_for

PASSWORD = "s3cret-pw"


@pytest.fixture(scope="module")
def cluster() -> Iterator[PgCluster]:
    """A cluster of this module's own: tests here stop and start it."""
    c = PgCluster()
    try:
        c.start()
        yield c
    finally:
        c.remove()


def test_a_database_gone_mid_run_answers_503_and_recovers(cluster: PgCluster) -> None:
    store = PostgresStore(_fresh_pg_database(cluster.url), pool_timeout_s=2.0)
    host = new_identity()
    with run_server_in_thread(store, rate_limits=NO_LIMITS) as base:
        post_id = post(base, "/api/v1/invitations", invitation(host).to_dict(),
                       host).json()["post_id"]
        cluster.stop()
        try:
            down = httpx.get(f"{base}/api/v1/invitations", timeout=30)
            assert down.status_code == 503 and error_of(down) == "database-unavailable"
            assert down.headers["retry-after"] == "2"
            signed = post(base, "/api/v1/identities", {"display_name": "Down"}, host)
            assert signed.status_code == 503 and error_of(signed) == "database-unavailable"
            assert httpx.get(f"{base}/api/v1/health").status_code == 200  # the process lives
        finally:
            cluster.start()
        wait_for("the server serving again", lambda: httpx.get(
            f"{base}/api/v1/invitations", timeout=30).status_code == 200, timeout_s=60)
        assert [p["post_id"] for p in httpx.get(f"{base}/api/v1/invitations").json()[
            "invitations"]] == [post_id]
    store.close()


def test_serve_waits_for_a_database_that_is_down_at_start(cluster: PgCluster,
                                                          tmp_path: Path) -> None:
    url = _fresh_pg_database(cluster.url)
    cluster.stop()
    proc = subprocess.Popen(kith(tmp_path, "community", "serve", "--port", "0", "--json",
                                 "--database-url", url, "--database-wait", "120"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = next_line(proc.stderr, 60)
        assert line and "retrying in" in line and "Traceback" not in line, line
        cluster.start()
        ready = json.loads(readline(proc, 60))  # it comes up once the database is back
        assert ready["database"] == "postgresql"
        assert httpx.get(f"{ready['url']}/api/v1/invitations", timeout=30).status_code == 200
    finally:
        if not cluster.running:
            cluster.start()
        proc.terminate()
        proc.communicate(timeout=30)
    assert proc.returncode == 0


def test_serve_gives_up_on_an_unreachable_database_without_the_password(
        tmp_path: Path) -> None:
    pytest.importorskip("psycopg_pool")
    url = f"postgresql://kith:{PASSWORD}@127.0.0.1:{_free_port()}/db"  # nothing listens there
    r = subprocess.run(kith(tmp_path, "community", "serve", "--port", "0", "--json",
                            "--database-url", url, "--database-wait", "2"),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert json.loads(r.stdout)["error"]["code"] == "database-unavailable"
    assert "retrying in" in r.stderr and "Traceback" not in r.stderr
    assert PASSWORD not in r.stdout + r.stderr
    assert "kith@127.0.0.1" in r.stdout


@pytest.mark.parametrize("url", [
    f"postgresql://kith:{PASSWORD}@127.0.0.1:notaport/db",
    f"postgresql://kith:{PASSWORD}@[::1/db",
    f"postgresql://kith:{PASSWORD}@localhost/db?bogus=1",
])
def test_a_malformed_database_url_is_refused_without_echoing_it(tmp_path: Path,
                                                                url: str) -> None:
    pytest.importorskip("psycopg_pool")
    r = subprocess.run(kith(tmp_path, "community", "serve", "--port", "0", "--json",
                            "--database-url", url, "--database-wait", "1"),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert json.loads(r.stdout)["error"]["code"] == "database-url-invalid"
    assert PASSWORD not in r.stdout + r.stderr and "Traceback" not in r.stderr
    r = subprocess.run(kith(tmp_path, "community", "migrate", "--json", "--database-url", url),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and PASSWORD not in r.stdout + r.stderr


def test_the_pool_never_opens_more_than_its_size(cluster: PgCluster) -> None:
    import psycopg

    url = _fresh_pg_database(cluster.url)
    dbname = url.split("/")[3].split("?")[0]
    store = PostgresStore(url, pool_size=2)
    try:
        with run_server_in_thread(store, rate_limits=NO_LIMITS) as base, \
                ThreadPoolExecutor(16) as pool:
            codes = list(pool.map(lambda _: httpx.get(f"{base}/api/v1/invitations",
                                                      timeout=30).status_code, range(64)))
            assert codes == [200] * 64
            with psycopg.connect(cluster.url) as admin:
                (count,) = admin.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s",
                                         (dbname,)).fetchone()
            assert 1 <= count <= 2
    finally:
        store.close()


def test_a_statement_over_the_timeout_is_cancelled_with_a_code(cluster: PgCluster,
                                                              tmp_path: Path) -> None:
    stores = [PostgresStore(_fresh_pg_database(cluster.url), statement_timeout_s=0.2),
              SqliteStore(tmp_path / "t.sqlite3", statement_timeout_s=0.2)]
    slow = {"postgresql": "SELECT pg_sleep(3)",  # kept: a statement past the 0.2 s timeout is the subject
            "sqlite": "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) "
                      "SELECT count(*) FROM n"}
    try:
        for store in stores:
            with pytest.raises(CommunityError) as err:
                with store._read() as conn:
                    conn.execute(slow[store.dialect]).fetchone()
            assert (err.value.code, err.value.status) == ("database-timeout", 503)
            assert store.schema_version() == SCHEMA_VERSION  # the store goes on serving
    finally:
        for store in stores:
            store.close()


def test_backup_copies_a_live_sqlite_database(tmp_path: Path) -> None:
    home = tmp_path / "home"
    db = home / "community" / "community.sqlite3"
    host = new_identity()
    with run_server_in_thread(db, rate_limits=NO_LIMITS) as base:
        post_id = post(base, "/api/v1/invitations", invitation(host).to_dict(),
                       host).json()["post_id"]
        target = tmp_path / "backup.sqlite3"
        r = subprocess.run(kith(home, "community", "backup", str(target), "--json"),
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout) == {"backup": str(target), "bytes": target.stat().st_size}
        # the copy is a whole database: a server on it lists the post
        with run_server_in_thread(target, rate_limits=NO_LIMITS) as copy:
            listed = httpx.get(f"{copy}/api/v1/invitations").json()["invitations"]
            assert [p["post_id"] for p in listed] == [post_id]
        with sqlite3.connect(target) as conn:
            assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        # an existing file is never overwritten; PostgreSQL is pg_dump's job
        r = subprocess.run(kith(home, "community", "backup", str(target), "--json"),
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and json.loads(r.stdout)["error"]["code"] == "usage"
        r = subprocess.run(kith(home, "community", "backup", str(tmp_path / "pg.dump"),
                                "--json", "--database-url", "postgresql://u@localhost/db"),
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "pg_dump" in json.loads(r.stdout)["error"]["message"]
        assert not (tmp_path / "pg.dump").exists()


def test_sqlite_keeps_one_connection_per_thread_and_never_writes_to_a_removed_file(tmp_path: Path) -> None:
    """The SQLite store keeps each thread's connection (a connection per operation made
    every signed request pay a WAL checkpoint: scripts/bench_sealed), yet another thread sees
    what one committed, a write that failed leaves nothing and the next one works, close()
    lets the store be used again, and a database file removed under it is refused
    database-unavailable (as before) instead of written to through a kept handle."""
    import os
    import threading

    from node.common.errors import CommunityError
    from node.community.store import open_store

    db = tmp_path / "c.sqlite3"
    store = open_store(db)
    try:
        assert store.remember_nonce("n1", "ab" * 32, 1, now=2, window_s=300)
        assert not store.remember_nonce("n1", "ab" * 32, 1, now=2, window_s=300)  # a replay, same connection
        counts: list[int] = []
        worker = threading.Thread(target=lambda: counts.append(store.nonce_count()))
        worker.start()
        worker.join(30)
        assert counts == [1]  # another thread's connection sees the committed write
        with pytest.raises(RuntimeError), store._write() as conn:  # a write that fails half-way
            conn.execute("INSERT INTO request_nonces (nonce, public_key, timestamp, seen_unix) "
                         "VALUES ('n2', 'k', 1, 2)")
            raise RuntimeError("boom")
        assert store.nonce_count() == 1  # rolled back; the kept connection still works
        store.close()
        assert store.remember_nonce("n3", "ab" * 32, 1, now=2, window_s=300)  # usable after close
        assert store.nonce_count() == 2
        for suffix in ("", "-wal", "-shm"):  # the database removed under the running store
            if os.path.exists(str(db) + suffix):
                os.remove(str(db) + suffix)
        with pytest.raises(CommunityError) as gone:
            store.remember_nonce("n4", "ab" * 32, 1, now=2, window_s=300)
        assert gone.value.code == "database-unavailable"
    finally:
        store.close()


@pytest.mark.parametrize("cmd", ["migrate", "backup"])
def test_migrate_and_backup_of_a_database_that_does_not_exist_are_refused_and_make_none(
        tmp_path: Path, cmd: str) -> None:
    """A typo in --database-url, or --home naming a node's home (not a server's), names a
    SQLite file that is not there: migrate and backup refuse it (database-unavailable,
    naming the file) instead of creating an empty database at the typo and saying it was
    migrated (or backed up) while the real one stays as it was."""
    node_home = tmp_path / "node"
    assert subprocess.run(kith(node_home, "init"), capture_output=True, timeout=120).returncode == 0
    typo = tmp_path / "typo" / "comunity.sqlite3"
    extra = [str(tmp_path / "backup.sqlite3")] if cmd == "backup" else []
    for home, url in ((node_home, None), (tmp_path / "server", f"sqlite:///{typo}")):
        args = ["community", cmd, *extra, "--json", *(["--database-url", url] if url else [])]
        r = subprocess.run(kith(home, *args), capture_output=True, text=True, timeout=120)
        assert r.returncode == 1, (args, r.returncode, r.stdout, r.stderr)
        assert "Traceback" not in r.stderr
        error = json.loads(r.stdout)["error"]
        assert error["code"] == "database-unavailable", error
        assert "comunity.sqlite3" in error["message"] if url else "community.sqlite3" in error["message"]
    assert not (node_home / "community").exists()
    assert not typo.exists() and not typo.parent.exists()
    assert not (tmp_path / "backup.sqlite3").exists()

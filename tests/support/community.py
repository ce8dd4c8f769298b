"""Community-server test support: unlimited rate limits, invitations and session proofs
signed with real keys, request helpers, a server with a sealed mailbox in this process
(:func:`mailbox_server`, :func:`record_ids`), and a throwaway PostgreSQL cluster
(:class:`PgCluster`, the session fixture :func:`pg_server`, :func:`fresh_pg_database`)."""

from __future__ import annotations

import glob
import json
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from node.community.ratelimit import RateLimit, RateLimits
from node.community.requests import signed_headers
from node.trust.identity import Identity
from node.trust.invitation import Invitation, create_invitation
from node.trust.signing import new_nonce, role_message, session_id_of, session_payload

#: rate limits that never refuse (tests that are not about rate limiting)
NO_LIMITS = RateLimits(per_key=RateLimit(0, 1), per_address=RateLimit(0, 1))
#: the protocol id the community tests' invitations name
PROTOCOL_ID = "ab" * 32


def invitation(host: Identity, **kw) -> Invitation:
    """An invitation signed by ``host`` for a fake ticket (``kw``: create_invitation options)."""
    return create_invitation(host, protocol_name="knowledge-query", protocol_version="1",
                             protocol_id=PROTOCOL_ID, ticket="endpointfaketicket", **kw)


@contextmanager
def mailbox_server(db: Path | str) -> Iterator[tuple[Any, str]]:
    """A community server with ``--mailbox`` (default :class:`MailboxLimits`, no rate limits)
    over the store ``db`` names — a SQLite file (its folder made) or a PostgreSQL URL —
    run in a thread of this process.

    Yields:
        (the store, to look into the held records; the server's URL). The store is closed
        after the server stopped.
    """
    from node.community.server import run_server_in_thread
    from node.community.store import MailboxLimits, open_store

    if isinstance(db, Path):
        db.parent.mkdir(parents=True, exist_ok=True)
    store = open_store(db)
    try:
        with run_server_in_thread(store, rate_limits=NO_LIMITS, mailbox=MailboxLimits()) as url:
            yield store, url
    finally:
        store.close()


def record_ids(store: Any) -> list[str]:
    """The ids of the sealed records ``store``'s mailbox holds now."""
    with store._read() as conn:
        return [r[0] for r in conn.execute("SELECT record_id FROM mailbox").fetchall()]


def error_of(response: httpx.Response) -> str:
    """The stable error code of a community-server refusal, checking the error body's shape."""
    data = response.json()
    assert set(data) == {"error"} and set(data["error"]) == {"code", "message"}
    assert "\n" not in data["error"]["message"]
    return data["error"]["code"]


def session_proof(host: Identity, guest: Identity, post_id: str,
                  protocol_id: str = PROTOCOL_ID) -> dict[str, str]:
    """A session proof for ``post_id`` signed by both sides (what a host submits)."""
    fields = dict(post_id=post_id, protocol_id=protocol_id, host_public_key=host.public_key,
                  guest_public_key=guest.public_key, guest_nonce=new_nonce(),
                  host_nonce=new_nonce())
    payload = session_payload(**fields)
    return dict(fields, session_id=session_id_of(payload),
                host_signature=host.sign(role_message("host", payload)),
                guest_signature=guest.sign(role_message("guest", payload)))


CONTENT_WORDS = ("query", "answer", "result", "corpus", "chunk", "snippet", "content", "text",
                 "preview", "citation", "envelope", "source")


def assert_no_content_columns(columns: set[str]) -> None:
    """Fail when a column name of the community schema sounds like content (it keeps none)."""
    bad = sorted(c for c in columns for w in CONTENT_WORDS if w in c.lower())
    assert not bad, f"the community schema has content-like columns: {bad}"


def post(base: str, path: str, doc: dict | None, signer: Identity) -> httpx.Response:
    """A signed POST of ``doc`` (JSON; empty body when None) to ``base + path``."""
    body = b"" if doc is None else json.dumps(doc).encode()
    return httpx.post(base + path, content=body,
                      headers=signed_headers(signer, "POST", path, body), timeout=20)


# --- a throwaway PostgreSQL cluster ---------------------------------------------------------------
def _pg_bindir() -> Path | None:
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    found = shutil.which("pg_ctl")
    if found:
        candidates.insert(0, str(Path(found).resolve().parent))
    for d in candidates:
        if all((Path(d) / b).exists() for b in ("initdb", "pg_ctl", "postgres")):
            return Path(d)
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgCluster:
    """A throwaway PostgreSQL cluster on a unix socket in a temporary folder, run with the
    real ``initdb``/``pg_ctl`` (as the ``postgres`` user when the tests run as root).
    :meth:`stop` and :meth:`start` let a test take the database away and bring it back.

    Raises:
        pytest.skip.Exception: when psycopg, the binaries or an unprivileged account are
            missing, or initdb/pg_ctl fail here (with the reason).
    """

    def __init__(self) -> None:
        try:
            import psycopg  # noqa: F401
            import psycopg_pool  # noqa: F401
        except ImportError:
            pytest.skip("psycopg 3 is not installed (pip install 'kith-node[postgres]')")
        bindir = _pg_bindir()
        if bindir is None:
            pytest.skip("PostgreSQL server binaries (initdb, pg_ctl, postgres) are not "
                        "installed (Debian: apt-get install --no-install-recommends postgresql)")
        self.bindir = bindir
        self.prefix: list[str] = []
        self.root = Path(tempfile.mkdtemp(prefix="kith-pg-"))
        if os.geteuid() == 0:  # postgres refuses to run as root: use an unprivileged account
            try:
                account = pwd.getpwnam("postgres")
            except KeyError:
                self.remove()
                pytest.skip("running as root and there is no 'postgres' account to run PostgreSQL")
            runuser = shutil.which("runuser") or shutil.which("setpriv")
            if runuser is None:
                self.remove()
                pytest.skip("running as root without runuser/setpriv to drop privileges")
            self.prefix = ([runuser, "-u", "postgres", "--"] if runuser.endswith("runuser") else
                           [runuser, f"--reuid={account.pw_uid}", f"--regid={account.pw_gid}",
                            "--clear-groups", "--"])
            os.chown(self.root, account.pw_uid, account.pw_gid)
        self.root.chmod(0o700)
        self.data, self.port = self.root / "data", free_port()
        self.running = False
        r = self._run(str(bindir / "initdb"), "-D", str(self.data), "-U", "kith", "-A", "trust",
                      "-E", "UTF8", "--no-sync")
        if r.returncode != 0:
            self.remove()
            pytest.skip(f"initdb failed here: {r.stderr.strip().splitlines()[-1:]}")
        self.url = f"postgresql:///postgres?host={self.root}&port={self.port}&user=kith"

    def _run(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*self.prefix, *args], capture_output=True, text=True,
                              timeout=120, cwd=self.root)

    def start(self) -> None:
        r = self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l",
                      str(self.root / "log"), "-w", "-t", "60", "-o",
                      f"-c listen_addresses='' -k {self.root} -p {self.port} -c fsync=off "
                      "-c full_page_writes=off -c max_connections=60", "start")
        if r.returncode != 0:
            pytest.skip(f"pg_ctl start failed here: {r.stderr.strip().splitlines()[-1:]}")
        self.running = True

    def stop(self) -> None:
        if self.running:
            self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate",
                      "-w", "stop")
            self.running = False

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """A base libpq URL (``postgresql:///postgres?host=SOCKDIR&port=N&user=kith``)."""
    cluster = PgCluster()
    try:
        cluster.start()
        yield cluster.url
    finally:
        cluster.remove()


def fresh_pg_database(base: str) -> str:
    """A new empty database on the cluster at ``base`` (a libpq URL); returns its URL."""
    import psycopg

    name = "kith_" + os.urandom(6).hex()
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return base.replace("postgresql:///postgres?", f"postgresql:///{name}?")

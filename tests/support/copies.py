"""A copy-granting host home and an in-memory link to its copy server, shared by the
copy tests (specs/copies.md): the real :class:`node.answer.copies.CopyServer` over a real
corpus, policy and key, asked without a transport; and for the tests over iroh, that host
served in process to bea's pool (:func:`alice_for_bea`) with bea's home runner
(:func:`runner_in`, :func:`events_of`)."""

from __future__ import annotations

import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable

import anyio

from node.answer.copies import CopyServer
from node.corpus.store import Corpus
from node.policy.gate import EgressGate
from node.policy.store import Policy
from node.runtime.clock import rfc3339
from node.trust.identity import load_or_init_identity

from support.homes import node_home

#: The host's documents, by path under its ``kb`` root.
DOCS = {
    "sqlite.md": "# SQLite\n\nPRAGMA journal_mode=WAL lets readers continue while one writer appends.\n",
    "deploy.md": "# Deploy\n\nThe staging server is rebuilt nightly; mail ops@example.com when it fails.\n",
    "ask.md": "# Ask\n\nThe quarterly numbers are shared on request only.\n",
    "notes/salary.md": "# Salary\n\nThe salary bands are private.\n",
}


def copy_host(tmp_path: Path) -> tuple[Path, Path]:
    """A host home: ``kb`` (:data:`DOCS`) indexed; /kb/** public, /kb/ask.md ask,
    /kb/notes/** private; bea granted a copy of /kb/**; e-mail scrubbed for bea.

    Returns:
        (host home, kb folder).
    """
    kb = tmp_path / "kb"
    (kb / "notes").mkdir(parents=True)
    for name, text in DOCS.items():
        (kb / name).write_text(text)
    home = node_home(tmp_path, "host")
    with Corpus(home) as c:
        c.add_root(kb)
        c.sync()
    policy = Policy.load(home)
    policy.set("/kb/**", "public")
    policy.set("/kb/ask.md", "ask")
    policy.set("/kb/notes/**", "private")
    policy.set_copy("/kb/**", "bea")
    policy.set_scrub("bea", ["email"])
    policy.save()
    return home, kb


def copy_server(home: Path) -> tuple[CopyServer, Corpus, str]:
    """The host's copy server as ``kith host`` builds it.

    Returns:
        (server, its read-only corpus — close it, the host's public key hex).
    """
    ident = load_or_init_identity(home)
    corpus = Corpus(home, readonly=True)
    gate = EgressGate(corpus.roots(), Policy.load(home), home)
    return CopyServer(corpus, gate, home, ident.secret, lambda: rfc3339(time.time())), corpus, ident.public_key


def copy_asker(server: CopyServer, peer: str = "bea", tamper: Callable[[dict, dict], dict] | None = None,
               calls: list[dict] | None = None) -> Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]:
    """An ``ask`` for :func:`node.guest.copies.sync.sync_copy` answered by ``server`` as
    ``peer``: ``copy_list`` → ``copy_manifest``, ``copy_get`` → ``copy_docs``.

    Args:
        tamper: ``(request, reply) -> reply`` a hostile host's change, or None.
        calls: a list each request is appended to, or None.
    """
    async def ask(request: dict[str, Any]) -> dict[str, Any]:
        if calls is not None:
            calls.append(request)
        if request["action"] == "copy_list":
            reply = {"action": "copy_manifest", **server.manifest(peer)}
        else:
            reply = {"action": "copy_docs", **server.documents(peer, request["sources"])}
        return tamper(request, reply) if tamper is not None else reply
    return ask


def kb_host_and_bea(tmp_path: Path, grant: str | None = "/kb/**") -> tuple[Path, Path]:
    """Two real homes for the copy tests that run `kith` processes: the host (the fixture
    corpus copied to ``kb``, indexed, ``/kb/**`` public: :func:`support.hosts.prepare_host`)
    with bea pinned as ``bea``, and bea's home — and with ``grant``, the host grants bea a
    copy of it (``kith policy copy GRANT --for bea``).

    Returns:
        (host home, bea's home).
    """
    import shutil

    from node.trust.identity import load_identity
    from node.trust.peers import PeerRegistry
    from support.cli import kith
    from support.homes import FIXTURE
    from support.hosts import prepare_host

    corpus = tmp_path / "kb"
    shutil.copytree(FIXTURE, corpus)
    host = prepare_host(tmp_path, corpus)
    bea = node_home(tmp_path, "bea")
    PeerRegistry.load(host).add("bea", load_identity(bea).public_key)
    if grant is not None:
        assert kith(host, "policy", "copy", grant, "--for", "bea").returncode == 0
    return host, bea


def first_copy(home: Path, tmp_path: Path, peer: str = "alice") -> tuple[Path, str]:
    """A guest home (``guest`` under ``tmp_path``) that synced the copy ``home`` grants bea
    once, kept as the copy of ``peer``, through :func:`copy_server` and :func:`copy_asker`.

    Returns:
        (guest home, the host's public key hex).
    """
    import anyio

    from node.guest.copies.sync import sync_copy

    guest = node_home(tmp_path, "guest")
    server, corpus, key = copy_server(home)
    with corpus:
        anyio.run(lambda: sync_copy(guest, peer, copy_asker(server), key))
    return guest, key


@asynccontextmanager
async def alice_for_bea(host: Path, bea: Path, tmp_path: Path, **opts: Any) -> AsyncIterator[tuple[Any, Any]]:
    """``host`` served in this event loop (:class:`support.hosts.InProcessHost` with the
    ``STEADY`` heartbeat and ``opts``, up within 60 s), pinned in bea's home as ``alice``,
    and bea's :class:`node.guest.pool.SessionPool` open on it; the pool is closed and the
    host stopped at exit.

    Yields:
        (the InProcessHost, bea's pool).
    """
    from node.guest.pool import SessionPool
    from node.trust.identity import load_identity
    from support.homes import pin_host
    from support.hosts import STEADY, InProcessHost

    h = InProcessHost(host, tmp_path, **{"heartbeat": STEADY, **opts})
    async with anyio.create_task_group() as tg:
        tg.start_soon(h.run)
        with anyio.fail_after(60):
            await h.ready.wait()
        pin_host(bea, "alice", h.invite)
        async with SessionPool(bea, load_identity(bea), local=True) as pool:
            yield h, pool
        h.stop.set()


def runner_in(tg: Any, runner: Any) -> anyio.CancelScope:
    """Start ``runner.run()`` (a :class:`node.guest.runner.Runner`, the home runner that
    syncs the copies) in the task group ``tg``; returns the scope whose ``cancel()`` stops
    that runner alone (a process that stops: its lock is released)."""
    scope = anyio.CancelScope()

    async def run() -> None:
        with scope:
            await runner.run()

    tg.start_soon(run)
    return scope


async def events_of(events: list[dict[str, Any]], kind: str, more_than: int = 0, timeout: float = 120.0) -> int:
    """Wait (polling, ``timeout`` s at most) until ``events`` holds more than ``more_than``
    events of ``kind`` (``copy-synced``, …); returns how many it holds."""
    def count() -> int:
        return sum(e["event"] == kind for e in events)

    with anyio.fail_after(timeout):
        while count() <= more_than:
            await anyio.sleep(0.05)
    return count()

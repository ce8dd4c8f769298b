"""Session engines back to back in memory (h11's ConnectionPair habit).

:class:`EnginePair` and :class:`UiPair`: no driver, no hooks, no event loop — bytes one
engine queues are fed to the other, so tests read like the protocol. :func:`run_pair`:
both engines run by the real driver over a memory pipe, with hooks.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import anyio

from node.engine import ui as UI
from node.engine.session import Event, GuestConfig, HostConfig, ProofVerified, SessionEngine, SessionReady, State
from node.protocol.spec import ProtocolSpec
from node.runtime.driver import run_session
from node.runtime.hooks import HookContext, PeerInfo
from node.transport.memory import memory_pipe
from node.trust.identity import Identity

POST_ID = "post-0001"


class EnginePair:
    """A guest engine and a host engine that exchange bytes on :meth:`pump`."""

    def __init__(self, spec: ProtocolSpec, host: Identity, guest: Identity, *, post_id: str = POST_ID,
                 claimed_guest_key: str | None = None, host_remote_id: str | None = None,
                 guest_expects_host: str | None = None, seen: set[str] | None = None,
                 guest_chain: list[dict[str, Any]] | None = None,
                 guest_revocation: dict[str, Any] | None = None) -> None:
        self.spec = spec
        self.seen = seen if seen is not None else set()

        def unseen(nonce: str) -> bool:
            ok = nonce not in self.seen
            self.seen.add(nonce)
            return ok

        self.host = SessionEngine("host", spec, public_key=host.public_key, sign=host.sign,
                                  host=HostConfig(remote_id=host_remote_id or guest.public_key,
                                                  post_protocol={POST_ID: spec.protocol_id}.get,
                                                  nonce_unseen=unseen))
        self.guest = SessionEngine("guest", spec, public_key=claimed_guest_key or guest.public_key, sign=guest.sign,
                                   guest=GuestConfig(remote_id=host.public_key, post_id=post_id,
                                                     host_public_key=guest_expects_host or host.public_key,
                                                     binding_chain=guest_chain,
                                                     revocation_list=guest_revocation))
        self.host_events: list[Event] = []
        self.guest_events: list[Event] = []

    def pump(self) -> None:
        """Move bytes both ways until neither side has anything queued."""
        for _ in range(100):
            g = self.guest.data_to_send()
            h = self.host.data_to_send()
            if not g and not h:
                return
            if g:
                self.host_events += self.host.receive_data(g)
            if h:
                self.guest_events += self.guest.receive_data(h)
        raise AssertionError("pump did not settle")

    def handshake(self) -> None:
        """Run the whole handshake (guest confirms right after the proof verifies)."""
        self.guest.initiate()
        self.pump()
        if self.guest.state.value == "await-confirm":
            self.guest_events += self.guest.confirm_ready()
            self.pump()

    def of(self, events: list[Event], kind: type) -> list[Any]:
        return [e for e in events if isinstance(e, kind)]


#: the UI bundle the UI tests send
UI_FILES = {"index.html": b"<!doctype html><p>hi</p>", "app.js": b"console.log(1)\n" * 1000,
         "img/logo.svg": b"<svg/>", "empty.txt": b""}


class UiPair:
    """Host and guest engines wired back to back with the UI branch's options (``bundle``:
    the host's :class:`node.engine.ui.Bundle` or None; ``caps``, ``want``: what the guest offers
    and asks); :meth:`run` does the handshake, ``tamper`` rewriting what the host sends."""

    def __init__(self, spec, host_id, guest_id, *, bundle=None, caps=(UI.CAPABILITY,), want=True):
        seen: set[str] = set()

        def unseen(n):
            ok = n not in seen
            seen.add(n)
            return ok

        self.host = SessionEngine("host", spec, public_key=host_id.public_key, sign=host_id.sign,
                                  host=HostConfig(remote_id=guest_id.public_key,
                                                  post_protocol={POST_ID: spec.protocol_id}.get,
                                                  nonce_unseen=unseen, ui_bundle=bundle))
        self.guest = SessionEngine("guest", spec, public_key=guest_id.public_key, sign=guest_id.sign,
                                   guest=GuestConfig(remote_id=host_id.public_key, post_id=POST_ID,
                                                     host_public_key=host_id.public_key,
                                                     capabilities=list(caps), want_ui=want))
        self.he: list = []
        self.ge: list = []
        self.wire_h2g = bytearray()

    def pump(self, tamper=None):
        for _ in range(200):
            g, h = self.guest.data_to_send(), self.host.data_to_send()
            if not g and not h:
                return
            if g:
                self.he += self.host.receive_data(g)
            if h:
                if tamper is not None:
                    h = tamper(h)
                self.wire_h2g += h
                self.ge += self.guest.receive_data(h)
            if self.guest.state is State.AWAIT_CONFIRM and any(isinstance(e, ProofVerified) for e in self.ge) \
                    and not any(isinstance(e, SessionReady) for e in self.ge):
                self.ge += self.guest.confirm_ready()
        raise AssertionError("did not settle")

    def run(self, tamper=None):
        self.guest.initiate()
        self.pump(tamper)
        return self

    def of(self, events, kind):
        return [e for e in events if isinstance(e, kind)]

    def h2g_actions(self):
        return [json.loads(line)["action"] for line in bytes(self.wire_h2g).splitlines()]


def frame(obj) -> bytes:
    """``obj`` as one protocol line (JSON and a newline)."""
    return (json.dumps(obj) + "\n").encode()


def ui_manifest(files, **over):
    """A ``_ui_artifact_begin`` frame naming ``files`` ({path: bytes}); ``over`` replaces fields."""
    entries = [{"path": p, "size": len(b), "sha256": hashlib.sha256(b).hexdigest()} for p, b in files.items()]
    d = {"action": "_ui_artifact_begin", "files": entries, "total_bytes": sum(len(b) for b in files.values())}
    d.update(over)
    return d


def hostile(echo, host_id, guest_id, frames: list[bytes]):
    """A host that answers the UI request with ``frames`` instead of its real bundle."""
    pair = UiPair(echo, host_id, guest_id, bundle=UI.Bundle.from_files(UI_FILES))

    def tamper(data: bytes) -> bytes:
        lines = data.splitlines(keepends=True)
        if any(b'"_ui_artifact_begin"' in ln for ln in lines):
            return b"".join(frames)
        return data

    return pair.run(tamper)


#: a one-file UI bundle a hostile manifest can name
GOOD = {"index.html": b"<p>ok</p>"}


def engines(spec, host_id, guest_id, *, clock=None):
    """A host and a guest :class:`SessionEngine` for ``spec`` that expect each other (POST_ID).

    ``clock``: a :class:`node.runtime.clock.ManualClock` both engines read (pass the same
    one to :func:`node.runtime.driver.run_session` so its ticker sleeps on it and the test
    drives timeouts and heartbeats by advancing it); None: the real monotonic clock."""
    timed = {} if clock is None else {"clock": clock.monotonic}
    seen: set[str] = set()

    def unseen(n: str) -> bool:
        ok = n not in seen
        seen.add(n)
        return ok

    host = SessionEngine("host", spec, public_key=host_id.public_key, sign=host_id.sign,
                         host=HostConfig(remote_id=guest_id.public_key, post_protocol={POST_ID: spec.protocol_id}.get,
                                         nonce_unseen=unseen), **timed)
    guest = SessionEngine("guest", spec, public_key=guest_id.public_key, sign=guest_id.sign,
                          guest=GuestConfig(remote_id=host_id.public_key, post_id=POST_ID,
                                            host_public_key=host_id.public_key), **timed)
    return host, guest


def ctx_factory(role, options=None, ended=None):
    """A ``make_context`` for :func:`node.runtime.driver.run_session` giving ``options``."""
    def make(ev):
        ctx = HookContext(role=role, session_id=ev.session_id, peer=PeerInfo(ev.peer_public_key),
                          options=dict(options or {}))
        return ctx
    return make


async def run_pair(spec, host_id, guest_id, host_hooks, guest_hooks, guest_options=None, **kw):
    """Both sides run by the real driver over a memory pipe (30 s bound); returns
    ``{"host": outcome, "guest": outcome}`` (``kw``: run_session options)."""
    h_eng, g_eng = engines(spec, host_id, guest_id)
    g_stream, h_stream = memory_pipe(guest_id.public_key, host_id.public_key)
    out = {}

    async def host():
        out["host"] = await run_session(h_stream, h_eng, host_hooks, make_context=ctx_factory("host"), **kw)

    async def guest():
        out["guest"] = await run_session(g_stream, g_eng, guest_hooks,
                                         make_context=ctx_factory("guest", guest_options), **kw)

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(host)
            tg.start_soon(guest)
    return out

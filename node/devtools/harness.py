"""``kith protocol test DIR``: run both roles of a protocol in one process over memory
pipes — the real host (:class:`node.host.host.Host`: session table, posts, audit,
egress gate, answer service) and a guest on the real engine, with every validation and
termination rule — in a throwaway home (DESIGN §7).

Fixtures (all optional) live in ``DIR/test/``:

- ``script.json``: ``{"guest_options": {...}, "host_options": {...}, "expect": [...]}``.
  ``guest_options``/``host_options`` become ``ctx.options`` of each role's hooks. Each item
  of ``expect`` describes the n-th business message the guest receives:
  ``equals`` (dotted path → value that must match exactly) and ``any_equals`` (dotted path
  → value that must appear among the values the path reaches; lists are traversed).
  The number of received messages must equal the number of expectations.
- ``corpus/``: indexed as the host's source root (prefix ``/corpus``).
- ``policy.toml``: the host's policy.

The test passes when every expectation holds and both roles end with ``completed``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from contextlib import asynccontextmanager
from typing import AsyncIterator

from node.common.errors import SpecError
from node.engine.session import GuestConfig, SessionEngine, SessionReady
from node.protocol.spec import load_spec
from node.runtime.driver import SessionOutcome, run_session
from node.runtime.hooks import HookContext, Hooks, PeerInfo, load_hooks
from node.host.host import Host, HostOptions
from node.transport.memory import MemoryListener
from node.trust.identity import Identity, init_identity, load_identity

TEST_TIMEOUT_S = 60.0


@dataclass
class Check:
    """One line of the report."""

    name: str
    passed: bool
    detail: str = ""


@dataclass
class ProtocolTestReport:
    """What ``kith protocol test`` found. ``passed`` is True when every check passed."""

    protocol: str
    protocol_id: str
    checks: list[Check] = field(default_factory=list)
    received: list[dict[str, Any]] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.passed for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {"protocol": self.protocol, "protocol_id": self.protocol_id, "passed": self.passed,
                "checks": [c.__dict__ for c in self.checks]}


def _values(obj: Any, path: str) -> list[Any]:
    """All values reached by a dotted path; lists on the way are traversed."""
    current = [obj]
    for part in path.split("."):
        nxt: list[Any] = []
        for item in current:
            items = item if isinstance(item, list) else [item]
            for it in items:
                if isinstance(it, dict) and part in it:
                    nxt.append(it[part])
        current = nxt
    flat: list[Any] = []
    for v in current:
        flat.extend(v if isinstance(v, list) else [v])
    return flat


def _check_expectation(i: int, exp: dict[str, Any], msg: dict[str, Any] | None) -> Check:
    name = f"message {i + 1}"
    if msg is None:
        return Check(name, False, "not received")
    for path, want in (exp.get("equals") or {}).items():
        got = _values(msg, path)
        if got != [want]:
            return Check(name, False, f"{path}: expected {want!r}, got {got[0] if len(got) == 1 else got!r}")
    for path, want in (exp.get("any_equals") or {}).items():
        got = _values(msg, path)
        if want not in got:
            return Check(name, False, f"{path}: {want!r} not among {got[:10]!r}")
    return Check(name, True, ", ".join(f"{k}={v!r}" for k, v in (exp.get("equals") or {}).items()))


def _load_script(pdir: Path) -> dict[str, Any]:
    path = pdir / "test" / "script.json"
    if not path.is_file():
        return {}
    try:
        script = json.loads(path.read_text("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise SpecError("spec-invalid", "test/script.json is not valid JSON") from None
    if not isinstance(script, dict):
        raise SpecError("spec-invalid", "test/script.json must be a JSON object")
    return script


def _prepare_host_home(pdir: Path, home: Path) -> None:
    """Index ``test/corpus`` and install ``test/policy.toml`` into the throwaway home
    (the host opens them as ``kith host`` would)."""
    corpus_dir = pdir / "test" / "corpus"
    policy = pdir / "test" / "policy.toml"
    if policy.is_file():
        shutil.copyfile(policy, home / "policy.toml")
        os.chmod(home / "policy.toml", 0o600)
    if not corpus_dir.is_dir():
        return
    from node.corpus.store import Corpus

    work = home / "fixture" / "corpus"
    shutil.copytree(corpus_dir, work)
    with Corpus(home) as corpus:
        corpus.add_root(work)
        corpus.sync()


async def run_protocol_test(pdir: Path) -> ProtocolTestReport:
    """Run the protocol's scripted session; never raises for a failing protocol (the
    report says what failed), only for an unloadable one.

    Raises:
        SpecError: ``protocol-not-found``, ``spec-invalid`` or ``hooks-invalid``.
    """
    pdir = Path(pdir)
    spec = load_spec(pdir)
    report = ProtocolTestReport(spec.name, spec.protocol_id)
    report.checks.append(Check("spec.json loads and passes the meta-schema", True, f"protocol_id {spec.protocol_id[:16]}…"))
    guest_hooks = load_hooks(pdir)  # the Host loads its own copy, as `kith host` does
    report.checks.append(Check("hooks.py loads", True))
    script = _load_script(pdir)
    guest_id = Identity(os.urandom(32))

    with tempfile.TemporaryDirectory(prefix="kith-protocol-test-") as tmp:
        home = Path(tmp)
        init_identity(home)
        _prepare_host_home(pdir, home)
        received: list[dict[str, Any]] = report.received
        original = guest_hooks.on_message

        def tap(ctx: HookContext, message: dict[str, Any]) -> Any:
            received.append(message)
            return original(ctx, message) if original else None

        guest_hooks = Hooks(on_start=guest_hooks.on_start, on_message=tap, on_end=guest_hooks.on_end,
                            module=guest_hooks.module)
        outcomes: dict[str, SessionOutcome] = {}
        events: list[dict[str, Any]] = []
        invitation: dict[str, Any] = {}
        ready = anyio.Event()
        stop = anyio.Event()
        listeners: list[MemoryListener] = []

        @asynccontextmanager
        async def bind(secret: bytes, _alpn: bytes) -> AsyncIterator[MemoryListener]:
            listener = MemoryListener(Identity(secret).public_key)
            listeners.append(listener)
            try:
                yield listener
            finally:
                await listener.aclose()

        def published(inv: dict[str, Any]) -> None:
            invitation.update(inv)
            ready.set()

        host = Host(home, HostOptions(protocol_dir=pdir, hook_options=dict(script.get("host_options") or {}),
                                      control=False, shutdown_grace_s=2.0),
                    load_identity(home), on_invitation=published, on_event=events.append,
                    warn=lambda _msg: None, stop=stop, bind=bind)

        async def guest() -> None:
            await ready.wait()
            host_key = invitation["host_public_key"]
            stream = await listeners[0].connect(guest_id.public_key)
            engine = SessionEngine("guest", spec, public_key=guest_id.public_key, sign=guest_id.sign,
                                   guest=GuestConfig(remote_id=host_key, post_id=invitation["post_id"],
                                                     host_public_key=host_key))
            options = dict(script.get("guest_options") or {})

            def make(ev: SessionReady) -> HookContext:
                return HookContext(role="guest", session_id=ev.session_id, peer=PeerInfo(ev.peer_public_key),
                                   options=dict(options))

            outcomes["guest"] = await run_session(stream, engine, guest_hooks, make_context=make)
            # the host's own account of the session: its session-ended event
            with anyio.move_on_after(5):
                while not any(e.get("event") == "session-ended" for e in events):
                    await anyio.sleep(0.01)
            stop.set()

        with anyio.move_on_after(TEST_TIMEOUT_S) as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(host.run)
                tg.start_soon(guest)
        if scope.cancelled_caught:
            report.checks.append(Check("session finishes", False, f"still running after {TEST_TIMEOUT_S:.0f} s"))
            return report
        ended = [e for e in events if e.get("event") == "session-ended"]
        if ended:
            outcomes["host"] = SessionOutcome(session_id=ended[0].get("session_id"), reason=ended[0].get("reason", ""),
                                              code=ended[0].get("code"), refused=list(ended[0].get("refused", [])))
        refused = [e for e in events if e.get("event") == "session-refused"]
        if refused and "host" not in outcomes:
            outcomes["host"] = SessionOutcome(session_id=None, reason="rejected", code=refused[0].get("code"))

    for role in ("host", "guest"):
        out = outcomes.get(role)
        ok = out is not None and out.ok
        detail = "completed" if ok else (f"{out.reason} ({out.code}: {out.message})" if out else "did not run")
        report.checks.append(Check(f"{role} ends cleanly", ok, detail))
        if out is not None and out.refused:
            report.checks.append(Check(f"{role} received only valid messages", False, ", ".join(out.refused)))
    expect = script.get("expect")
    if isinstance(expect, list):
        for i, exp in enumerate(expect):
            report.checks.append(_check_expectation(i, exp if isinstance(exp, dict) else {},
                                                    received[i] if i < len(received) else None))
        if len(received) != len(expect):
            report.checks.append(Check("message count", False, f"expected {len(expect)}, received {len(received)}"))
    return report

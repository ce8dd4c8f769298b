"""The hooks API a protocol's ``hooks.py`` is written against (DESIGN §7), and its loader.

A ``hooks.py`` exposes plain functions, sync or async; sync ones run in a worker thread
under the protocol's ``hook_timeout_s``:

- ``on_start(ctx)`` — the session is ready;
- ``on_message(ctx, message)`` — a validated business message from the peer;
- ``on_end(ctx, reason)`` — the session ended (``completed``, ``peer-disconnected``, …).

Each returns ``None``, a message dict, a list of message dicts, or a :class:`HookResult`.

A sync hook may say, per call, whether its work is small: a function attribute
``inline`` — ``hook.inline = predicate`` with ``predicate(ctx, *args) -> bool``, called
on the event loop, cheap, never blocking. True: the hook runs on the event loop, without
the worker-thread hop (``hook_timeout_s`` cannot interrupt it there, so only for bounded
work), even while other hook calls run in threads; False: it runs in a
small pool of hook threads
(:data:`node.runtime.driver.HOOK_THREADS` per event loop); None: no word on this call. A
hook without ``inline`` — every hook written before it — runs in a worker thread exactly
as before. The
``knowledge-query`` hooks use it for warm, bounded searches.
Hooks never see system frames and never touch the raw index: on the Host,
``ctx.knowledge`` is a peer-scoped handle whose results already passed the egress gate.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from node.common.errors import HookError, SpecError

if TYPE_CHECKING:
    from node.answer.service import Knowledge

HOOK_NAMES = ("on_start", "on_message", "on_end")


@dataclass(frozen=True)
class PeerInfo:
    """Who is on the other side.

    Attributes:
        public_key: 64 lowercase hex (QUIC-authenticated).
        name: the local registry name, or None for an anonymous peer.
        profile: the profile the peer shared in the handshake (untrusted display data).
        person: on the Host, the person key the guest's verified binding chain names
            (64 hex), or None (an old guest: device-key-only identity; specs/peers.md §9).
        device_name: the device name in that binding (signed by the person, still only a
            label), or None.
    """

    public_key: str
    name: str | None = None
    profile: dict[str, Any] = field(default_factory=dict)
    person: str | None = None
    device_name: str | None = None


@dataclass
class HookContext:
    """What a hook gets.

    Attributes:
        role: ``"host"`` or ``"guest"``.
        session_id: 64 hex.
        peer: :class:`PeerInfo`.
        options: role-specific options (e.g. the guest's scripted queries, callbacks).
        state: a per-session dict the hooks may use freely.
        logger: a ``logging.Logger`` for this session.
        knowledge: on the Host, the peer-scoped knowledge handle
            (:class:`node.answer.service.Knowledge`: ``search(request)``); None on the Guest.
    """

    role: str
    session_id: str
    peer: PeerInfo
    options: dict[str, Any] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)
    logger: logging.Logger = field(default_factory=lambda: logging.getLogger("kith.hooks"))
    knowledge: Knowledge | None = None


@dataclass
class HookResult:
    """A hook's answer: messages to send, whether this side is done, or an abort code.

    Attributes:
        messages: business messages to send, in order.
        completed: True when this side has nothing more to do (the driver ends the session
            cleanly if the protocol's terminal message was not among ``messages``).
        abort: a stable error code to abort the session with, or None.
    """

    messages: list[dict[str, Any]] = field(default_factory=list)
    completed: bool = False
    abort: str | None = None


def normalize_result(value: Any) -> HookResult:
    """Turn a hook's return value into a :class:`HookResult`.

    Raises:
        HookError: ``hook-output-invalid`` for anything but None, a dict, a list of dicts
            or a HookResult.
    """
    if value is None:
        return HookResult()
    if isinstance(value, HookResult):
        return value
    if isinstance(value, dict):
        return HookResult([value])
    if isinstance(value, (list, tuple)) and all(isinstance(m, dict) for m in value):
        return HookResult(list(value))
    raise HookError("hook-output-invalid", "a hook must return None, a message, a list of messages or a HookResult")


@dataclass(frozen=True)
class Hooks:
    """The loaded hook functions of one protocol (missing ones are None)."""

    on_start: Any = None
    on_message: Any = None
    on_end: Any = None
    module: ModuleType | None = None


_counter = 0


def load_hooks(protocol_dir: Path) -> Hooks:
    """Import ``<protocol_dir>/hooks.py`` by path (the datasette plugin habit).

    Raises:
        SpecError: ``hooks-invalid`` if the file is missing, fails to import, or defines a
            hook name that is not callable.
    """
    global _counter
    path = Path(protocol_dir) / "hooks.py"
    if not path.is_file():
        raise SpecError("hooks-invalid", f"no hooks.py in protocol folder {Path(protocol_dir).name!r}")
    _counter += 1
    modname = f"kith_protocol_hooks_{Path(protocol_dir).name.replace('-', '_')}_{_counter}"
    spec = importlib.util.spec_from_file_location(modname, path)
    if spec is None or spec.loader is None:  # pragma: no cover
        raise SpecError("hooks-invalid", "hooks.py cannot be loaded")
    module = importlib.util.module_from_spec(spec)
    sys.modules[modname] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(modname, None)
        raise SpecError("hooks-invalid", f"{Path(protocol_dir).name}/hooks.py failed to import ({type(exc).__name__})") from None
    found = {}
    for name in HOOK_NAMES:
        fn = getattr(module, name, None)
        if fn is not None and not callable(fn):
            raise SpecError("hooks-invalid", f"{name} in hooks.py is not callable")
        found[name] = fn
    return Hooks(module=module, **found)

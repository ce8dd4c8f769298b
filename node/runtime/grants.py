"""Grants and presence: the one place that decides whether a peer holds a grant, and what a
peer without one is told (specs/transport.md §4, DESIGN §15).

``presence = open`` (the default, today's behaviour): every guest with a live invitation
may handshake, and refusals keep their distinct codes. ``presence = granted``: a peer that
holds no grant — not pinned, removed, blocked (and whatever later rules add: expired
grants, revoked devices) — gets exactly the refusal of an unknown post
(:data:`UNIFORM_REFUSAL`, its default message), before any slot, nonce or post use is
taken, so it never receives a heartbeat and learns nothing about the host beyond what the
transport itself reveals (a QUIC handshake with the endpoint id in the ticket).

Extend :func:`has_grant` for new kinds of grants, and :data:`NO_GRANT_CODES` for new
codes that mean "no grant" (they collapse under ``granted``): nothing else decides it.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from node.common.errors import UsageError

#: ``presence`` values (``kith host --presence``, ``[host] presence`` in config.toml).
PRESENCE_VALUES = ("open", "granted")
#: What a peer without a grant is told under ``presence = granted``.
UNIFORM_REFUSAL = "handshake-unknown-post"
#: Refusal codes that mean "this peer holds no grant": under ``granted`` each becomes
#: :data:`UNIFORM_REFUSAL` (:func:`refusal_code`).
NO_GRANT_CODES = frozenset({"handshake-peer-blocked", "handshake-not-admitted", "peer-key-changed"})


def has_grant(registry: Any, key: str) -> bool:
    """Does peer ``key`` hold a grant on this host now? The one "has a grant?" decision.

    A grant is a pinned, unblocked registry entry (``kith peers add``; ``remove`` and
    ``block`` take it away). Expiring grants and device revocations extend this function.

    Args:
        registry: the host's :class:`node.trust.peers.PeerRegistry` as read for this
            connection. key: the QUIC-authenticated peer key (64 hex).
    """
    if not key or registry.is_blocked(key):
        return False
    return registry.by_key(key) is not None


def refusal_code(presence: str, code: str, *, granted: bool) -> str:
    """The code a peer is sent for a refusal ``code``: under ``granted`` presence, a peer
    without a grant, or any code of :data:`NO_GRANT_CODES`, gets :data:`UNIFORM_REFUSAL`;
    otherwise ``code`` itself (``open`` keeps every distinct code)."""
    if presence == "granted" and (not granted or code in NO_GRANT_CODES):
        return UNIFORM_REFUSAL
    return code


def presence_from(value: str | None, home: Path | None) -> str:
    """The host's presence setting: ``value`` (``--presence``) or ``[host] presence`` of
    ``<home>/config.toml``, default ``open``.

    Raises:
        UsageError: ``presence-invalid`` (exit 2) for any other value.
    """
    if value is None and home is not None:
        try:
            data = tomllib.loads((Path(home) / "config.toml").read_text(encoding="utf-8"))
        except FileNotFoundError:
            data = {}
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise UsageError("presence-invalid", f"config.toml cannot be read ({type(exc).__name__})") from None
        table = data.get("host", {})
        value = table.get("presence") if isinstance(table, dict) else None
    value = "open" if value is None else value
    if value not in PRESENCE_VALUES:
        raise UsageError("presence-invalid", f"presence {str(value)[:40]!r}: one of open, granted")
    return value


__all__ = ["NO_GRANT_CODES", "PRESENCE_VALUES", "UNIFORM_REFUSAL", "has_grant", "presence_from", "refusal_code"]

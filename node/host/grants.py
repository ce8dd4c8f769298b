"""Grants: the one place that decides whether a peer holds a grant, what a peer without one
is told (presence, specs/transport.md §4, DESIGN §15), and how grants that end are enforced
(specs/peers.md §12).

**Presence.** ``presence = open`` (the default): every guest with a live invitation may
handshake, and refusals keep their distinct codes. ``presence = granted``: a peer that holds
no grant — not pinned, removed, blocked, its pin ended (``until`` passed), its device revoked
by its person — gets exactly the refusal of an unknown post (:data:`UNIFORM_REFUSAL`, its
default message), before any slot, nonce or post use is taken, so it never receives a
heartbeat and learns nothing about the host beyond what the transport itself reveals (a QUIC
handshake with the endpoint id in the ticket). A device of a person pin holds the pin's grant
once the host has seen it present a valid chain (``seenDevices``, specs/peers.md §10); a
person's device the host has never seen is, under ``granted``, a stranger until it connects
once under ``open`` presence or is pinned by its own key. Extend :func:`has_grant` for new
kinds of grants and :data:`NO_GRANT_CODES` for new codes that mean "no grant".

**Grants that end**, enforced like revocation: while the host runs, every grant with an
``until`` — a pin (``peers.json``), an override or a group membership (``policy.toml``) — is
watched on the host's clock; when one ends, the live sessions it covered end with
``session-grant-expired`` and a ``grant-expired`` event is emitted (and audited). Decisions
made after that already ignore it (:func:`node.trust.peers.pins_in_force`,
:meth:`node.policy.store.Policy.match`), so a guest reconnecting gets what remains. The
watcher waits on :class:`node.runtime.clock.Clock` ``sleep`` and reads ``time``, so tests end a
grant by advancing a :class:`node.runtime.clock.ManualClock`. Grants already ended when the
host starts are not reported (no session can hold them).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable

from node.common.errors import KithError, UsageError
from node.common.grants import ended
from node.common.host_events import GrantExpired

log = logging.getLogger("kith.grants")

#: How often the host looks for grants that ended (s, on its clock).
GRANT_POLL_S = 1.0


def grants_with_ends(home: Path) -> list[dict[str, Any]]:
    """Every grant of this home that has an end: ``{"kind": "pin" | "override" | "group",
    "peer_name", "until", "names": [registry names it covers], "glob"? , "group"?}``.
    An override for ``@group`` covers that group's members. Unreadable files give none of
    their grants (the host keeps serving by the last good ones)."""
    from node.policy.store import GROUP_PREFIX, Policy
    from node.trust.peers import PeerRegistry

    out: list[dict[str, Any]] = []
    try:
        registry = PeerRegistry.load(home)
        out += [{"kind": "pin", "peer_name": r.name, "until": r.until, "names": [r.name]}
                for r in registry.peers.values() if r.until is not None]
    except KithError:
        pass
    try:
        policy = Policy.load(home)
    except KithError:
        return out
    for g in policy.groups.values():
        out += [{"kind": "group", "group": g.name, "peer_name": m, "until": u, "names": [m]}
                for m, u in g.members.items() if u is not None]
    for r in policy.overrides:
        if r.until is None or r.peer is None:
            continue
        group = policy.groups.get(r.peer[len(GROUP_PREFIX):]) if r.peer.startswith(GROUP_PREFIX) else None
        names = sorted(group.members) if group is not None else [] if r.peer.startswith(GROUP_PREFIX) else [r.peer]
        out.append({"kind": "override", "peer_name": r.peer, "glob": r.glob, "tier": r.tier, "until": r.until,
                    "names": names})
    return out


def _ident(g: dict[str, Any]) -> tuple[Any, ...]:
    return (g["kind"], g["peer_name"], g.get("group"), g.get("glob"), g["until"])


class GrantWatcher:
    """Ends the sessions of grants that end (:meth:`run` on the host's task group).

    Args:
        home: the node home.
        sessions: the host's :class:`node.host.sessions.SessionTable`.
        clock: the host's clock.
        on_event: gets ``grant-expired`` {``kind``, ``peer_name``, ``group``?, ``glob``?,
            ``until``, ``code`` (``session-grant-expired``), ``sessions_ended``}.
        interval_s: how often to look (s, on ``clock``).
    """

    def __init__(self, home: Path, sessions: Any, clock: Any, *, on_event: Callable[[dict[str, Any]], None],
                 interval_s: float = GRANT_POLL_S) -> None:
        self.home = Path(home)
        self.sessions = sessions
        self.clock = clock
        self.on_event = on_event
        self.interval_s = interval_s
        self._stamps: tuple[Any, ...] | None = None
        self._grants: list[dict[str, Any]] = []
        now = clock.time()
        self._reported = {_ident(g) for g in self._current() if ended(g["until"], now)}

    def _current(self) -> list[dict[str, Any]]:
        """:func:`grants_with_ends`, read again only when ``peers.json`` or ``policy.toml``
        changed (one ``os.stat`` each per look)."""
        from node.policy.store import POLICY_FILE, file_stamp
        from node.trust.peers import PEERS_FILE

        stamps = (file_stamp(self.home / PEERS_FILE), file_stamp(self.home / POLICY_FILE))
        if stamps != self._stamps:
            self._stamps, self._grants = stamps, grants_with_ends(self.home)
        return self._grants

    async def run(self) -> None:
        """Look every :attr:`interval_s` until cancelled; never raises for a bad file."""
        while True:
            await self.clock.sleep(self.interval_s)
            try:
                self.poll()
            except KithError as exc:
                log.warning("grant check failed: %s", exc.code)

    def poll(self) -> list[dict[str, Any]]:
        """One look. Returns the ``grant-expired`` events emitted."""
        now = self.clock.time()
        out = []
        for g in self._current():
            ident = _ident(g)
            if ident in self._reported or not ended(g["until"], now):
                continue
            self._reported.add(ident)
            n = sum(self.sessions.end_named(name, "session-grant-expired", "a grant of this peer ended")
                    for name in g["names"])
            ev = GrantExpired(**{k: v for k, v in g.items() if k != "names"}, sessions_ended=n).to_dict()
            self.on_event(ev)
            out.append(ev)
        return out


#: ``presence`` values (``kith host --presence``, ``[host] presence`` in config.toml).
PRESENCE_VALUES = ("open", "granted")
#: What a peer without a grant is told under ``presence = granted``.
UNIFORM_REFUSAL = "handshake-unknown-post"
#: Refusal codes that mean "this peer holds no grant": under ``granted`` each becomes
#: :data:`UNIFORM_REFUSAL` (:func:`refusal_code`).
NO_GRANT_CODES = frozenset({"handshake-peer-blocked", "handshake-not-admitted", "peer-key-changed",
                            "handshake-device-revoked", "handshake-person-not-pinned"})


def has_grant(registry: Any, key: str, revocations: Any = None) -> bool:
    """Does peer ``key`` hold a grant on this host now? The one "has a grant?" decision.

    A grant is a pinned, unblocked registry entry (``kith peers add``; ``remove``, ``block``
    and a passed ``until`` take it away — the host passes the registry of the pins in force,
    :func:`node.trust.peers.pins_in_force`), or a device a person pin (``--devices``) has seen
    present a valid binding chain, unless the revocation list this host keeps of such a
    person names the device (a list speaks only for its own person's devices).

    Args:
        registry: the host's :class:`node.trust.peers.PeerRegistry` as read for this
            connection. key: the QUIC-authenticated peer key (64 hex).
        revocations: the host's :class:`node.trust.revocation_list.RevocationStore`, or None.
    """
    if not key or registry.is_blocked(key):
        return False
    from node.trust.peers import persons_of_device

    if revocations is not None and revocations.revokes(key, persons_of_device(registry, key)) is not None:
        return False
    if registry.by_key(key) is not None:
        return True
    return any(rec.devices and key in rec.seen_devices and not registry.is_blocked(rec.public_key)
               for rec in registry.peers.values())


def unseen_person_pins(registry: Any) -> list[str]:
    """Names of the person pins (``--devices``) of which this host has seen no device yet,
    unblocked: under ``presence = granted`` every device of such a person gets the
    unknown-post refusal (:func:`has_grant`) until one connects under ``open`` presence or
    is pinned by its own key. ``kith host --presence granted`` warns about each at start."""
    return sorted(rec.name for rec in registry.peers.values()
                  if rec.devices and not rec.seen_devices and not registry.is_blocked(rec.public_key))


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

    The file is checked even when ``value`` overrides it (a bad value there is refused,
    like ``[transport]``'s, specs/transport.md §1).

    Raises:
        UsageError: ``presence-invalid`` (exit 2) for any other value, and for a
            ``config.toml`` that cannot be read or names a key nobody reads (``presense``).
    """
    from node.common.home import config_table

    configured = config_table(home, "host", "presence-invalid").get("presence")
    for given in (configured, value):
        if given is not None and given not in PRESENCE_VALUES:
            raise UsageError("presence-invalid", f"presence {str(given)[:40]!r}: one of open, granted")
    return value or configured or "open"


#: The most of the audit log (bytes, from its end) :func:`sharing_report` reads: a status
#: view reads what is recent, never the whole log (up to 32 MiB; ``kith audit`` reads all).
SHARING_AUDIT_BYTES = 2 << 20


def sharing_report(home: Path) -> dict[str, Any]:
    """What this node shares beyond answers (issue 42 item 6): ``{"scrubs": [{"for",
    "kinds", "glob"}], "copyGrants": [{"glob", "for", "until", "maxBytes", "ended"}],
    "copiesSent": [{"peer", "peer_name", "documents", "lastSentAt"}], "copiesSentFrom":
    {"bytes", "whole"}, "code"}`` — ``copiesSent``: per peer, the distinct documents the
    audit log's last :data:`SHARING_AUDIT_BYTES` say a copy sent it (``copy-sent``
    records; what the peer may hold unless it deleted them), newest first;
    ``copiesSentFrom``: how many bytes of the log that was, and whether it was the whole
    log (else older sends are only in ``kith audit``); ``code`` when policy.toml does not
    load (the lists are then empty)."""
    from node.common.grants import ended
    from node.policy.store import Policy
    from node.trust.audit_log import audit_size, read_audit_tail

    out: dict[str, Any] = {"scrubs": [], "copyGrants": [], "copiesSent": [], "code": None}
    try:
        policy = Policy.load(home)
    except KithError as exc:
        out["code"] = exc.code
    else:
        out["scrubs"] = [{"for": s.recipient, "kinds": list(s.kinds), "glob": s.glob} for s in policy.scrub_rules]
        out["copyGrants"] = [{"glob": c.glob, "for": c.recipient, "until": c.until, "maxBytes": c.max_bytes,
                              "ended": c.until is not None and ended(c.until)} for c in policy.copy_grants]
    sent: dict[str, dict[str, Any]] = {}
    size = audit_size(home)
    out["copiesSentFrom"] = {"bytes": min(size, SHARING_AUDIT_BYTES), "whole": size <= SHARING_AUDIT_BYTES}
    for rec in read_audit_tail(home, SHARING_AUDIT_BYTES):  # newest first
        if rec.get("event") != "copy-sent" or not isinstance(rec.get("peer"), str):
            continue
        row = sent.setdefault(rec["peer"], {"peer": rec["peer"], "peer_name": rec.get("peer_name"), "sources": set(),
                                            "lastSentAt": rec.get("ts")})
        row["peer_name"] = row["peer_name"] or rec.get("peer_name")
        row["sources"].update(s for s in rec.get("sources") or [] if isinstance(s, str))
    out["copiesSent"] = sorted(({"peer": r["peer"], "peer_name": r["peer_name"], "documents": len(r["sources"]),
                                 "lastSentAt": r["lastSentAt"]} for r in sent.values()),
                               key=lambda r: str(r["lastSentAt"]), reverse=True)
    return out


__all__ = ["sharing_report", "SHARING_AUDIT_BYTES", "GRANT_POLL_S", "GrantWatcher", "NO_GRANT_CODES",
           "PRESENCE_VALUES", "UNIFORM_REFUSAL", "grants_with_ends", "has_grant", "presence_from", "refusal_code",
           "unseen_person_pins"]

"""The host's events: one typed table (specs/host-events.md, specs/host-events.schema.json).

A running host reports what happens — sessions started, ended and refused, revocations,
posts republished, policy reloads, index updates — as *host events*: the objects
``kith host --json`` prints one per line, ``serve_host``'s ``on_event`` receives, the audit
log records and the post keeper reads. Each kind is one :class:`HostEvent` subclass below,
tagged by its ``event`` field; an emitter builds one and sends ``ev.to_dict()`` (a plain
dict, the wire and callback shape), so every consumer keeps reading dicts.

Adding an event is a one-place edit: add a subclass here (docstring = what it means, one
typed field per key), list it in :data:`HOST_EVENT_TYPES`, and regenerate the schema with
``scripts/host_events_schema``; tests/test_host_events.py fails until the committed schema
matches the table, and every event a test host emits is validated against that schema
(tests/conftest.py, ``KITH_STRICT_EVENTS``).

Sits in node/common so the corpus watcher and the community post keeper (which sit below
the runtime) build their events from the same table.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Dict, List, Literal, Union

import msgspec

log = logging.getLogger(__name__)

#: environment variable that makes :func:`checked` raise on an event the table does not
#: describe (tests set it; a production host logs the mismatch and sends the event on)
STRICT_ENV = "KITH_STRICT_EVENTS"


class EventPath(msgspec.Struct, kw_only=True, rename="camel", forbid_unknown_fields=True):
    """The transport path a session runs over, as events carry it (the ``to_dict()`` of
    :class:`node.transport.paths.PathInfo`)."""

    kind: str
    """``direct``, ``relayed`` or ``unknown``."""
    relay_url: str | None = None
    """The relay's URL of a relayed path, else null."""
    remote: str | None = None
    """The peer's socket address of a direct path (shown to the owner only), else null."""

    @classmethod
    def of(cls, path: Any) -> "EventPath":
        """From a :class:`node.transport.paths.PathInfo` (its ``to_dict()``) or that dict."""
        return msgspec.convert(path if isinstance(path, dict) else path.to_dict(), cls)


class IndexChange(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One document an index batch touched."""

    source: str
    op: str
    """``added``, ``updated`` or ``removed``."""


class HostEvent(msgspec.Struct, kw_only=True, tag_field="event", forbid_unknown_fields=True):
    """Base of every host event; ``event`` (the tag) names its kind."""

    def to_dict(self) -> dict[str, Any]:
        """The event as the plain dict emitters send: ``{"event": KIND, **fields}``."""
        return msgspec.to_builtins(self)


# ----------------------------------------------------------------------------- sessions
class SessionStarted(HostEvent, tag="session-started", kw_only=True):
    """A guest's session became ready (the handshake verified both proofs)."""

    session_id: str
    peer: str
    """The guest's device key (64 hex)."""
    peer_name: str | None
    """Its pinned name (a person pin's name for a device holding its grants), or null."""
    post_id: str
    pairing_code: str
    """The five pairing words host and guest both see (node/trust/pairing.py)."""
    person: str | None
    """The person key of the guest's verified binding chain, or null."""
    device_name: str | None
    via_person: bool
    """True when the device holds a person pin's grants (specs/peers.md §10)."""
    path: EventPath


class SessionEnded(HostEvent, tag="session-ended", kw_only=True):
    """A connection ended — a ready session, or one refused in the handshake
    (``session_id`` null: no session existed; the audit records it as ``handshake-refused``)."""

    session_id: str | None
    peer: str
    reason: str
    """The engine's close reason (``completed``, ``rejected``, ``aborted``, ``error``, ...)."""
    code: str | None
    """The error code that ended it (specs/error-codes.md), or null for a clean end."""
    ended_at: float
    """Unix time (s) on the host's clock."""
    ui_bytes_sent: int = 0
    """Bytes of the shared UI bundle sent in this session (``--share-ui``)."""
    refused: list[str] = []
    """Codes of guest messages the engine refused before the hooks (at most 32)."""


class SessionRefused(HostEvent, tag="session-refused", kw_only=True):
    """A connection was refused before or during the handshake (``_session_reject``)."""

    peer: str
    """The connecting key, or "" when the transport cannot name it."""
    code: str
    reason: str | None = None
    """Why, for the owner only: ``evicted`` (the host was full), ``no-grant`` (--presence granted)."""


class SessionEvicted(HostEvent, tag="session-evicted", kw_only=True):
    """An idle anonymous session was ended to make room for a newcomer, or a quiet session
    of a key that opened one more than ``max_sessions_per_peer`` (specs/session.md)."""

    peer: str
    code: Literal["session-evicted"] = "session-evicted"
    idle_s: float


class SessionPathChanged(HostEvent, tag="session-path-changed", kw_only=True):
    """iroh moved a ready session to another path (specs/transport.md §3)."""

    session_id: str
    peer: str
    path: EventPath
    previous: EventPath


# ----------------------------------------------------------------------------- trust
class PeerRevoked(HostEvent, tag="peer-revoked", kw_only=True):
    """A pin was removed or a key blocked in peers.json; its sessions ended."""

    peer: str
    peer_name: str | None
    cause: Literal["removed", "blocked"]
    code: str
    sessions_ended: int
    approvals_cancelled: list[str]
    """Ids of the peer's pending approval requests, denied."""


class DeviceRevoked(HostEvent, tag="device-revoked", kw_only=True):
    """A person's signed revocation list revoked devices; their sessions ended."""

    person: str
    peer_name: str | None
    """The person pin's name, or null."""
    devices: list[str]
    seq: int
    """The list's sequence number."""
    via: str
    """How the list came: ``handshake``, ``server``, ``import``."""
    code: Literal["session-device-revoked"] = "session-device-revoked"
    sessions_ended: int


class PersonRotated(HostEvent, tag="person-rotated", kw_only=True):
    """A pinned person's key rotated and the host followed (specs/peers.md §11)."""

    old_person: str
    person: str
    via: str
    """The key that signed the rotation: ``person`` or ``recovery``."""
    peer: str
    device_name: str | None


class PersonDeviceNew(HostEvent, tag="person-device-new", kw_only=True):
    """A device of a person pin joined for the first time (specs/peers.md §10)."""

    peer_name: str
    person: str
    device: str
    device_name: str


class GrantExpired(HostEvent, tag="grant-expired", kw_only=True):
    """A grant with an ``until`` ended; the sessions it admitted ended."""

    kind: Literal["pin", "group", "override"]
    peer_name: str
    until: str
    group: str | None = None
    """The group, for a membership."""
    glob: str | None = None
    """The override's glob."""
    tier: str | None = None
    """The override's tier."""
    code: Literal["session-grant-expired"] = "session-grant-expired"
    sessions_ended: int


class ConfigInvalid(HostEvent, tag="config-invalid", kw_only=True):
    """A file the host re-reads is not valid; it keeps what it last read."""

    file: str
    """The file's name in the home (``peers.json``, ``revocations.json``)."""


class PolicyReloaded(HostEvent, tag="policy-reloaded", kw_only=True):
    """policy.toml changed: in force (``ok``), or not valid and the last good policy stays."""

    ok: bool
    rules: int | None = None
    """Rules in force, when ``ok``."""
    code: str | None = None
    """Why it is not valid (specs/error-codes.md), when not ``ok``."""


# ----------------------------------------------------------------------------- posts
class Republished(HostEvent, tag="republished", kw_only=True):
    """The host published a new post in place of one consumed, expired or lost."""

    post_id: str
    previous_post_id: str
    reason: str
    expires_at: str


class PostEnded(HostEvent, tag="post-ended", kw_only=True):
    """The community server says a post ended (``republish``: a new one follows)."""

    post_id: str
    reason: str
    republish: bool


class PostRenewed(HostEvent, tag="post-renewed", kw_only=True):
    """The post was renewed elsewhere; the host follows its new expiry."""

    post_id: str
    expires_at: str


class PostRetired(HostEvent, tag="post-retired", kw_only=True):
    """A post collected too many failed handshakes and is no longer honoured."""

    post_id: str
    reason: str


class PostRestored(HostEvent, tag="post-restored", kw_only=True):
    """A restarted host honours a post of its earlier run again (specs/invitation.md)."""

    post_id: str
    uses: int
    """Sessions it admitted so far."""
    max_sessions: int | None
    expires_at: str
    current: bool
    """True when it is the invitation this run publishes."""


class PostExpired(HostEvent, tag="post-expired", kw_only=True):
    """A post passed its ``expires_at`` on the host's clock."""

    post_id: str
    expires_at: str


# ----------------------------------------------------------------------------- corpus
class IndexUpdated(HostEvent, tag="index-updated", kw_only=True):
    """``kith host --watch`` re-indexed a batch of changed files."""

    indexed: int
    updated: int
    removed: int
    failed: int
    empty: int
    chunks: int
    changes: list[IndexChange]
    """The documents touched (at most 50)."""


# ----------------------------------------------------------------------------- sealed questions
class SealedTaken(HostEvent, tag="sealed-taken", kw_only=True):
    """A take from a holder (``--mailbox``, ``--holder``, ``--hold-mail``; specs/sealed.md
    §10) answered or dropped sealed questions: the answers are left there for the askers."""

    holder: str
    """The holder: its base URL, or ``iroh:<ticket>`` for a device holding mail over iroh
    (specs/sealed.md §7b)."""
    answered: int
    """Questions answered, their sealed answers left with the holder."""
    dropped: dict[str, int]
    """Refusal code → questions dropped with it (``sealed-*``, a handshake code)."""


#: the table: every host event kind (add a new one here and regenerate the schema)
HOST_EVENT_TYPES: tuple[type[HostEvent], ...] = (
    SessionStarted, SessionEnded, SessionRefused, SessionEvicted, SessionPathChanged,
    PeerRevoked, DeviceRevoked, PersonRotated, PersonDeviceNew, GrantExpired, ConfigInvalid, PolicyReloaded,
    Republished, PostEnded, PostRenewed, PostRetired, PostRestored, PostExpired,
    IndexUpdated, SealedTaken,
)

AnyHostEvent = Union[HOST_EVENT_TYPES]  # type: ignore[valid-type]


# ----------------------------------------------------------------------------- commands
class CommandEvent(msgspec.Struct, kw_only=True, tag_field="event", forbid_unknown_fields=True):
    """Base of the JSON lines other commands print with ``--json`` while they run (the same
    ``event`` field; ``kith index watch``'s reports are specs/corpus.md's sync report)."""

    def to_dict(self) -> dict[str, Any]:
        """The line's object: ``{"event": KIND, **fields}``."""
        return msgspec.to_builtins(self)


class HostPairingCode(CommandEvent, tag="host-pairing-code", kw_only=True):
    """``kith join --json`` to an unknown host, before trusting it."""

    host_public_key: str
    pairing_code: str


class DeviceCode(CommandEvent, tag="device-code", kw_only=True):
    """``kith device add --json``: the one-time code for ``kith device join``."""

    code: str


class DeviceBound(CommandEvent, tag="device-bound", kw_only=True):
    """``kith device add --json``: the new device's binding was signed."""

    name: str
    key: str
    seq: int


class PairingWords(CommandEvent, tag="pairing-words", kw_only=True):
    """``kith device join --json``: the words to compare with the offering device's."""

    words: str


class DeviceJoined(CommandEvent, tag="device-joined", kw_only=True):
    """``kith device join --json``: this home is bound to the person."""

    public_key: str
    person_key: str
    device_name: str
    seq: int


class DeviceRevokedHere(CommandEvent, tag="device-revoked", kw_only=True):
    """``kith device revoke --json``: the person key signed a new revocation list (a host's
    ``device-revoked`` event is another kind: what a host did with such a list)."""

    name: str
    """The device as named on the command line (name or key prefix)."""
    newly_revoked: List[str]  # typing's names: the field `list` shadows the builtin here
    list: Dict[str, Any]
    """The signed list (specs/peers.md §10)."""
    out: str | None
    published: bool


class OutboxRunnerStarted(CommandEvent, tag="outbox-runner-started", kw_only=True):
    """``kith outbox run --json``: this process holds the home's runner lock and delivers."""


class OutboxAnswered(CommandEvent, tag="outbox-answered", kw_only=True):
    """The home runner (node/guest/runner.py): a kept question's peer answered it
    (specs/outbox.md §5)."""

    id: str
    """The question's id in the outbox."""
    peer: str
    """The peer's pinned name."""
    status: str | None
    """The answer's ``status`` (``ok``, ``no-results``, ...)."""


class OutboxLeft(CommandEvent, tag="outbox-left", kw_only=True):
    """The home runner (node/guest/sealed_outbox.py): a kept question, its host unreachable,
    was left sealed with a holder its cards name (specs/sealed.md §10)."""

    id: str
    """The question's id in the outbox."""
    peer: str
    """The peer's pinned name."""
    holder: str
    """The holder's base URL."""


class OutboxPending(CommandEvent, tag="outbox-pending", kw_only=True):
    """The home runner: the peer's host keeps the question for its owner's approval."""

    id: str
    peer: str
    approval_id: str | None


class OutboxFailed(CommandEvent, tag="outbox-failed", kw_only=True):
    """The home runner: a kept question cannot be delivered (its row is closed)."""

    id: str
    peer: str
    code: str
    """Why (specs/error-codes.md): ``peer-not-found``, ``outbox-peer-changed``, ..."""


class OutboxExpired(CommandEvent, tag="outbox-expired", kw_only=True):
    """The home runner: kept questions passed their expiry unanswered."""

    rows: int
    """Deliveries closed as ``expired``."""


class CopySynced(CommandEvent, tag="copy-synced", kw_only=True):
    """The home runner (node/guest/copies/task.py): a peer's copy was re-synced (specs/copies.md)."""

    peer: str
    """The peer's pinned name."""
    fetched: int
    """Documents fetched in this sync."""
    removed: int
    """Documents removed from the copy in this sync."""


class CopyEnded(CommandEvent, tag="copy-ended", kw_only=True):
    """The home runner: a copy this node may no longer hold was deleted (specs/copies.md §5)."""

    peer: str
    fetched: int
    removed: int
    """Documents deleted."""
    via: str = "sync"
    """How it was learnt: ``sync`` (the host's manifest said ``copy-not-granted``),
    ``handshake`` (a session's ``_session_proof`` said the grant ended), ``expired`` (the
    grant's end passed; the host was not asked), ``device-revoked`` (a revocation list this
    home took names the host's device key)."""


class CopyFailed(CommandEvent, tag="copy-failed", kw_only=True):
    """The home runner: a copy's sync failed (the peer is away or refused); it is tried again later."""

    peer: str
    code: str
    """Why (specs/error-codes.md)."""


#: the commands' table (add a new kind here, as for host events)
COMMAND_EVENT_TYPES: tuple[type[CommandEvent], ...] = (
    HostPairingCode, DeviceCode, DeviceBound, PairingWords, DeviceJoined, DeviceRevokedHere,
    OutboxRunnerStarted, OutboxAnswered, OutboxLeft, OutboxPending, OutboxFailed, OutboxExpired,
    CopySynced, CopyEnded, CopyFailed,
)
AnyCommandEvent = Union[COMMAND_EVENT_TYPES]  # type: ignore[valid-type]

#: kind name -> its class
BY_KIND: dict[str, type[HostEvent]] = {t.__struct_config__.tag: t for t in HOST_EVENT_TYPES}


def schema() -> dict[str, Any]:
    """The JSON Schema (Draft 2020-12) of one host event, generated from the table: the
    content of specs/host-events.schema.json (``scripts/host_events_schema`` writes it)."""
    body = msgspec.json.schema(AnyHostEvent)
    (commands,), defs = msgspec.json.schema_components([AnyCommandEvent], ref_template="#/$defs/{name}")
    body["$defs"] = {**body["$defs"], **defs, "CommandEvent": commands}
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": "https://kith.invalid/specs/host-events.schema.json",
            "title": "Kith host event",
            "description": "One event of a running host (`kith host --json` line, serve_host's on_event, "
                           "the audit's input); $defs.CommandEvent is one JSON line of the other "
                           "commands' --json output. Generated from node/common/host_events.py by "
                           "scripts/host_events_schema; see specs/host-events.md.",
            **body}


def checked(ev: dict[str, Any], *, command: bool = False) -> dict[str, Any]:
    """``ev`` unchanged after checking it against the table (kind known, every field of
    its type, none missing or extra) — the host events', or with ``command`` the
    commands'. A mismatch is logged, or with ``KITH_STRICT_EVENTS`` set (tests) raised as
    :class:`msgspec.ValidationError` — an event the table does not describe is a bug of
    its emitter, never of a peer. The dict is checked as it is, not serialised: an event
    becomes JSON once, where it is printed (``kith host --json``, ``emit_json``)."""
    try:
        msgspec.convert(ev, AnyCommandEvent if command else AnyHostEvent)
    except (msgspec.ValidationError, TypeError) as exc:
        if os.environ.get(STRICT_ENV):
            raise msgspec.ValidationError(f"host event not in the table: {exc}") from exc
        log.error("host event not in the table (%s): %s", exc, ev.get("event") if isinstance(ev, dict) else ev)
    return ev


__all__ = ["HostEvent", "HOST_EVENT_TYPES", "BY_KIND", "AnyHostEvent", "CommandEvent", "COMMAND_EVENT_TYPES",
           "AnyCommandEvent", "EventPath", "IndexChange", "schema", "checked",
           *[t.__name__ for t in HOST_EVENT_TYPES], *[t.__name__ for t in COMMAND_EVENT_TYPES]]

"""Device cards on the asking side (specs/peers.md §13): a guest takes the cards it is sent
(handshake, community server), keeps those of the persons it pinned with ``--devices``, and
says which devices of such a person may be dialled.

The pure rules (shape, signatures) are :mod:`node.trust.card`; the hosting device's own card
is :mod:`node.host.card`. This module adds what needs the home: the pin a card belongs to,
revocation lists, and the marks of which device answered (the race over a person's devices
is the asker's, node/guest/asker.py).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from node.common.errors import KithError
from node.runtime.clock import unix_of
from node.trust.card import CardStore, DeviceCard, check_card

if TYPE_CHECKING:
    from node.trust.peers import PeerRecord

log = logging.getLogger("kith.cards")

#: The statuses of a complete answer (the first one of any device wins; node/guest/fanout.py).
COMPLETE = ("ok", "no-verified-results")


def _now() -> str:
    from node.trust.person import now_rfc3339

    return now_rfc3339()


def _mark_now() -> str:
    """Now as RFC 3339 UTC with milliseconds, for a card's ``lastSeen`` / ``lastFailed``: a
    device that answered and then failed within one second must read as failed
    (``CardEntry.online`` compares the two stamps)."""
    from datetime import datetime, timezone

    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _pin_for(registry: Any, card: DeviceCard) -> "PeerRecord | None":
    """The person pin (``--devices``) whose key the card's chain descends from, or None."""
    from node.trust.peers import person_pin

    for key in card.lineage():
        rec = person_pin(registry, key)
        if rec is not None:
            return rec
    return None


def _device_pin_for(registry: Any, card: DeviceCard, via: str, device: str | None) -> "PeerRecord | None":
    """The device pin (a pin of the card's own device key, not ``--devices``) a card sent in
    that device's own handshake belongs to, or None. Kept under the device's key so the
    holders its format-2 card names are known for that pin (specs/sealed.md §10)."""
    if via != "handshake" or device != card.device:
        return None
    rec = registry.by_key(card.device)
    return rec if rec is not None and not rec.devices else None


def accept_card(home: Path, doc: object, *, via: str, device: str | None = None,
                registry: Any = None) -> tuple[str, DeviceCard, str]:
    """Check a card (:func:`node.trust.card.check_card`) and keep it for the person pin it
    belongs to; the device joins the pin's ``seenDevices`` (its chain verified here). A card
    a device pinned by its own key sends in its handshake is kept under that pin too (so
    ``--later`` knows the holders it names; nothing else reads a device pin's card to dial).

    Args:
        via: ``handshake`` or ``server``. device: the key the card must be of (a card in a
            handshake: the host's QUIC-authenticated key), or None.
        registry: the registry as ``peers.json`` says now (the process's view,
            :attr:`node.guest.owner.Guest.peers`), read and never changed here; a device
            new to its pin is written to the file as read again then. None: read here.

    Returns:
        ``(pin name, card, "new" | "same")``.

    Raises:
        KithError: ``card-malformed``, ``card-forged``, ``card-wrong-device`` (as
            :func:`check_card`); ``card-wrong-person`` (no person pin here is its person's);
            ``card-device-revoked`` (a revocation list kept here names the device);
            ``card-stale`` (a newer card of the device is kept). Nothing is kept then.
    """
    from node.trust.peers import PeerRegistry, note_device
    from node.trust.revocation_list import RevocationStore

    card = check_card(doc, device=device)
    shared = registry is not None  # the process's view: never changed in place
    registry = PeerRegistry.load(home) if registry is None else registry
    rec = _pin_for(registry, card)
    device_pin = _device_pin_for(registry, card, via, device) if rec is None else None
    if rec is None and device_pin is None:
        raise KithError("card-wrong-person", "the card's device is bound by a person not pinned here with --devices")
    if device_pin is not None:
        rec = device_pin
    if registry.is_blocked(card.device):
        raise KithError("card-device-revoked", "the card's device is blocked here")
    if RevocationStore.load(home).revokes(card.device, [rec.public_key, *card.lineage()]):
        raise KithError("card-device-revoked", f"device {card.device_name!r} was revoked by its person")
    store = CardStore.load(home)
    outcome = store.offer(rec.public_key, card, via=via, now=_now())
    if via == "handshake":  # it just completed a handshake with this guest: it is up
        store.mark(rec.public_key, card.device, ok=True, now=_mark_now())
    seen = rec.seen_devices.get(card.device)
    if device_pin is None and (seen is None or seen["name"] != card.device_name):
        if shared:  # a write: on the file as it is now
            registry = PeerRegistry.load(home)
            rec = registry.by_name(rec.name) or rec
        note_device(registry, rec, card.device, card.device_name)
    return rec.name, card, outcome


#: Refusals that say the host sent something hostile or broken (logged as a warning); the
#: others (a device of a person not pinned here, a revoked device, an older card) are normal.
HOSTILE_CODES = ("card-malformed", "card-forged", "card-wrong-device")


def take_card(home: Path, doc: object, *, via: str, device: str | None = None, registry: Any = None) -> str | None:
    """:func:`accept_card`, a refusal logged and swallowed (a bad card from a host never
    ends a session; it is simply never kept nor dialled). Returns the refusal code or None."""
    try:
        accept_card(home, doc, via=via, device=device, registry=registry)
    except KithError as exc:
        (log.warning if exc.code in HOSTILE_CODES else log.info)(
            "the host's device card was refused and will not be dialled (%s): %s", exc.code, exc.message)
        return exc.code
    return None


async def fetch_cards(home: Path, rec: "PeerRecord", *, notify: Any = None, peers: Any = None) -> list[str]:
    """Ask the pin's community server for its person's revocation list and cards: the list
    first (kept when it verifies and is newer, specs/peers.md §10), so a revoked device's
    card is refused; then each card that passes (:func:`accept_card`, ``via="server"``).
    Returns the refusal codes of the cards that did not (a server that is down or keeps
    none gives ``[]``). ``peers``: the process's view of ``peers.json``
    (:attr:`node.guest.owner.Guest.peers`) the cards are checked against, or None: the
    file read for each card."""
    from node.community.client import CommunityClient

    if not rec.server:
        return []
    try:
        async with CommunityClient(rec.server) as client:
            revocation = await client.get_revocation(rec.public_key)
            docs = await client.get_cards(rec.public_key)
    except KithError:
        return []
    _keep_revocation(home, rec, revocation, notify)
    codes = []
    for doc in docs:
        try:
            accept_card(home, doc, via="server", registry=None if peers is None else peers.now())
        except KithError as exc:
            codes.append(exc.code)
    return codes


def _keep_revocation(home: Path, rec: "PeerRecord", revocation: dict[str, Any] | None,
                     notify: Any = None) -> None:
    """Keep the server's revocation list of the person pin ``rec`` when it verifies and is
    newer (specs/peers.md §10); a forged or foreign one is logged and dropped. The copies
    held from the devices it newly revokes end, told to ``notify``
    (:data:`node.guest.copies.lifecycle.Notify`; stderr without one)."""
    from node.trust.revocation_list import RevocationStore, check_list

    if revocation is None:
        return
    try:
        offered = RevocationStore.load(home).offer(check_list(revocation, person=rec.public_key), via="server",
                                                   now=_now())
    except KithError as exc:  # a forged or foreign list from the server: not kept
        log.info("revocation list from the server refused (%s)", exc.code)
        return
    from node.guest.copies.lifecycle import end_copies

    for key in offered.newly_revoked:  # copies held from a revoked device go (specs/copies.md §5)
        end_copies(home, host_key=key, via="device-revoked", notify=notify)


#: Seconds between two reads of a person's revocation list from its pin's server by one
#: process asking that person (the same cadence as ``kith host --server``'s check).
REVOCATION_EVERY_S = 60.0
#: Seconds one such read may take before the answer is returned without it.
REVOCATION_WAIT_S = 5.0


async def refresh_revocation(home: Path, rec: "PeerRecord", *, notify: Any = None,
                             last_read: dict[str, float] | None = None) -> None:
    """Read the person pin's revocation list from its server (``GET
    /api/v1/revocations/{person_key}``) and keep it when it verifies and is newer, at most
    once every :data:`REVOCATION_EVERY_S` per ``last_read`` (person key → when; the session
    pool's :attr:`~node.guest.pool.SessionPool.revocation_reads`: once per process; None:
    read now), within :data:`REVOCATION_WAIT_S`.
    Run beside the ask of that person (:meth:`node.guest.asker.Asker.ask`), so a
    device revoked and published while a guest still answers from its card is dropped by
    that very ask. A server that is down or slow changes nothing."""
    from node.community.client import CommunityClient

    if not rec.server:
        return
    if last_read is not None:
        now = time.monotonic()
        if now - last_read.get(rec.public_key, -REVOCATION_EVERY_S) < REVOCATION_EVERY_S:
            return
        last_read[rec.public_key] = now
    import anyio

    with anyio.move_on_after(REVOCATION_WAIT_S):
        try:
            async with CommunityClient(rec.server) as client:
                revocation = await client.get_revocation(rec.public_key)
        except KithError:
            return
        _keep_revocation(home, rec, revocation, notify)


def is_revoked(home: Path, rec: "PeerRecord", device: str) -> bool:
    """True when a revocation list kept here for the person pin ``rec`` names ``device``."""
    from node.trust.revocation_list import RevocationStore

    return RevocationStore.load(home).revokes(device, [rec.public_key])


def device_targets(home: Path, rec: "PeerRecord", *, registry: Any = None) -> list[tuple[dict[str, str], Any]]:
    """Every device of the person pin ``rec`` this home can dial now: ``({"key", "name"},
    Target)`` from each kept card whose device is neither revoked nor blocked here (``kith
    peers block KEY``) and whose invitation verifies (expiry, protocol, binding;
    :func:`node.guest.targets.pinned_target`), plus the pin's saved invitation when no card
    is of its device (and it is not blocked). Most recently answering first. ``registry``:
    the registry as ``peers.json`` says now (the process's view), or None: read here."""
    from node.common.errors import InvitationError
    from node.guest.targets import pinned_target, protocol_cache
    from node.trust.invitation import parse_invitation
    from node.trust.peers import PeerRegistry
    from node.trust.revocation_list import RevocationStore

    protocols = protocol_cache()  # every device of a person names the same protocol: load it once
    store = CardStore.load(home)
    revocations = RevocationStore.load(home)
    registry = PeerRegistry.load(home) if registry is None else registry
    out: list[tuple[dict[str, str], Any]] = []
    entries = sorted(store.devices_of(rec.public_key).items(),
                     key=lambda kv: (unix_of(kv[1].last_seen or ""), kv[1].received_at), reverse=True)
    for key, entry in entries:
        if registry.is_blocked(key) or revocations.revokes(key, [rec.public_key, entry.card.get("person_key", "")]):
            continue  # revoked or blocked after the card was kept: ignored
        try:
            target = pinned_target(parse_invitation(entry.card["invitation"]), rec, home, protocols=protocols)
        except (InvitationError, KithError):
            continue
        out.append(({"key": key, "name": str(entry.card.get("device_name", ""))}, target))
    if rec.invitation is not None:
        try:
            saved = pinned_target(parse_invitation(rec.invitation), rec, home, protocols=protocols)
        except KithError:
            saved = None
        key = saved.invitation.host_public_key if saved is not None else ""
        if (saved is not None and not registry.is_blocked(key) and not revocations.revokes(key, [rec.public_key])
                and all(t.invitation.host_public_key != key for _, t in out)):
            name = rec.seen_devices.get(key, {}).get("name", "")
            out.append(({"key": key, "name": name}, saved))
    return out


def mark_answered(store: CardStore, rec: "PeerRecord", device: str) -> None:
    """Record in ``store`` (the process's view of the kept cards) that ``device`` of the
    person pin ``rec`` answered now (written at most once a minute while it keeps
    answering, :meth:`node.trust.card.CardStore.mark`)."""
    store.mark(rec.public_key, device, ok=True, now=_mark_now())


__all__ = ["accept_card", "device_targets", "fetch_cards", "is_revoked", "mark_answered", "refresh_revocation",
           "take_card"]

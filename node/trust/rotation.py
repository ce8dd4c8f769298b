"""Person-key rotation (specs/peers.md §11): making a successor person key, and a host
following the rotations it sees.

**Rotating** (``kith person rotate``, :func:`rotate_person`): a new person key is made; the
old person key signs a *successor* link naming it (``kith-person-successor-v1``), or —
when the device holding the person key is lost — the recovery key derived from the 24
recovery words signs a *recovery* link (``kith-person-recovery-rotation-v1``, carrying the
old person key's statement that vouched for that recovery key). The new key re-binds
every device of the person (new device links, next ``seq``) and vouches for the recovery
key. The rotation link is appended to ``person.json``'s ``successors``; every binding chain
sent from then on carries the newest three, so a host that was offline during a rotation
still converges on the next handshake. Other devices of the person take the new record with
``kith person import FILE`` (:func:`adopt_person`).

**Following** (:class:`RotationLedger`, ``<home>/rotations.json`` on a host): the first time
a host sees a rotation link in a verified chain it records ``old → successor``; the old key
is then *retired* at that host:

- a chain whose device link is signed by a retired key → ``handshake-person-key-retired``
  (that device was not re-bound after the rotation);
- a second, different rotation from a retired key → ``handshake-rotation-revoked-key`` —
  except that a rotation signed by the recovery key replaces one signed by the person key
  (the recovery words are the stronger authority: a thief who held the person key and
  rotated first is overruled), after which the thief's successor is retired too.

:meth:`RotationLedger.lineage` gives every person key a chain descends from (the chain's own
and, beyond it, the ledger's), so a pin on an old person key keeps naming the person.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from node.common.errors import ConfigError, HandshakeError, KithError
from node.common.home import atomic_write, read_json_state, read_regular
from node.trust.binding import VIA_PERSON, VIA_RECOVERY, PersonIdentity, device_link, recovery_link, successor_link
from node.trust.person import (
    PERSON_KEY_FILE,
    device_keys_named,
    person_lock,
    PersonRecord,
    load_person,
    load_person_secret,
    now_rfc3339,
    person_from_json,
    recovery_secret_of,
    recovery_seed,
    recovery_words,
    save_person,
)
from node.trust.signing import person_recovery_payload, public_key_of, sign

ROTATIONS_FILE = "rotations.json"
#: ``person.key`` written before ``person.json`` in a rotation, renamed over it after.
PENDING_KEY_FILE = PERSON_KEY_FILE + ".new"
#: The most followed rotations a host keeps (the oldest seen is dropped beyond).
MAX_LEDGER_ENTRIES = 4096
#: A key retired because a recovery rotation overruled its own rotation.
VIA_SUPERSEDED = "superseded"
LEDGER_VERSION = 1


@dataclass(frozen=True)
class RotationResult:
    """What :func:`rotate_person` did.

    Attributes:
        old_key / new_key: the person key before and after (64 hex).
        via: ``"person"`` or ``"recovery"`` (what signed the rotation link).
        link: the rotation link (wire shape).
        devices: names of the devices re-bound by the new key.
        dropped: names of devices left out (``--without``).
        recovery_words: the *new* 24 recovery words after a recovery rotation (the old ones
            were typed in: they are replaced), else None.
    """

    old_key: str
    new_key: str
    via: str
    link: dict[str, Any]
    devices: tuple[str, ...]
    dropped: tuple[str, ...]
    recovery_words: str | None = None


def _next_seq(rec: PersonRecord) -> int:
    return max((d["seq"] for d in (*rec.devices, *rec.successors)), default=-1) + 1


def finish_pending_key(home: Path) -> None:
    """Complete a rotation a crash interrupted: a ``person.key.new`` whose public key is the
    one ``person.json`` names replaces ``person.key``; one that is not (the crash came
    before ``person.json`` was written) is removed."""
    pending = Path(home) / PENDING_KEY_FILE
    if not pending.exists():
        return
    rec = load_person(home)
    try:
        seed = bytes.fromhex(read_regular(pending).decode("ascii").strip())
        matches = rec is not None and len(seed) == 32 and public_key_of(seed) == rec.person_key
    except (OSError, ValueError, UnicodeDecodeError):
        matches = False
    if matches:
        os.replace(pending, Path(home) / PERSON_KEY_FILE)
    else:
        pending.unlink(missing_ok=True)


def rotate_person(home: Path, *, words: str | None = None, without: tuple[str, ...] = ()) -> RotationResult:
    """Replace this home's person key by a new one (``kith person rotate``).

    Args:
        words: the 24 recovery words; given, the recovery key signs the rotation (for a
            home that does not hold the person key — its device was lost) and new recovery
            words are made. None: the person key on this device signs it.
        without: devices not to re-bind (a lost or stolen one), each by name or, when
            names collide, by key or 8+ hex prefix. A device a
            revocation list of this person (any earlier key's) names is never re-bound, and
            the new key signs that list again (next ``seq``) so it keeps travelling.

    Returns:
        :class:`RotationResult`.

    Raises:
        ConfigError: ``home-not-initialized`` (no person), ``device-no-person-key`` (no
            words and this device does not hold the person key), ``config-invalid``
            (words that are not a 24-word phrase), ``person-recovery-wrong`` (words of
            another recovery secret), ``device-not-found`` (a ``without`` name that is
            not a device of the person), ``person-last-device`` (``without`` would leave
            no device, or would drop this one).
    """
    home = Path(home)
    with person_lock(home):
        return _rotate_person(home, words, without)


def check_rotation(home: Path, *, words: str | None = None, without: tuple[str, ...] = ()) -> None:
    """Refuse now what :func:`rotate_person` with the same arguments would refuse, writing
    nothing (a rotation a crash interrupted is finished, as every read of the record does):
    ``kith person rotate`` runs it before it asks the owner to confirm, so a rotation that
    would be refused is refused before the question, never after a ``y``. It reads without
    the person lock (it is never held across the owner's answer); :func:`rotate_person`
    checks again under it.

    Args:
        home: the node home. words: the 24 recovery words, or None (the person key signs).
        without: the devices not to re-bind (by name, or key / 8+ hex prefix).

    Raises:
        ConfigError: the codes :func:`rotate_person` lists (``device-not-found``,
            ``person-last-device``, ``device-no-person-key``, ``config-invalid``,
            ``person-recovery-wrong``, ``home-not-initialized``).
    """
    _plan(Path(home), words, without)


@dataclass(frozen=True)
class _Plan:
    """What a rotation checked and will sign with (:func:`_plan`)."""

    rec: PersonRecord
    newest: dict[str, Any]  # device key -> its newest binding link (None: none)
    keep: list[dict[str, Any]]  # the links of the devices the new key re-binds
    store: Any  # the home's RevocationStore
    own_lists: list[dict[str, Any]]  # this person's revocation lists (any of its keys)
    revoked: list[str]  # the device keys they revoke
    old_secret: bytes | None  # the person key's seed (None: the recovery seed signs)
    seed: bytes | None  # the recovery key's seed (words given)


def _plan(home: Path, words: str | None, without: tuple[str, ...]) -> _Plan:
    """Every check of a rotation (the refusals :func:`rotate_person` documents), nothing
    written but a crashed rotation finished (:func:`finish_pending_key`)."""
    finish_pending_key(home)
    rec = load_person(home)
    if rec is None:
        raise ConfigError("home-not-initialized", "This home has no person key yet.")
    newest = {d["device_key"]: rec.binding_for(d["device_key"]) for d in rec.devices}
    dropped_keys: set[str] = set()
    for name in without:  # a name, or a key / 8+ hex prefix when names collide
        keys = device_keys_named(rec, name)
        if not keys:
            raise ConfigError("device-not-found", f"this person has no device named {name[:64]!r}")
        dropped_keys.update(keys)
    from node.trust.identity import load_identity

    me = load_identity(home).public_key
    from node.trust.revocation_list import RevocationStore

    store = RevocationStore.load(home)
    own_lists = [doc for doc in map(store.list_for, rec.all_keys()) if doc is not None]
    revoked = list(dict.fromkeys(k for doc in own_lists for k in doc["revoked"]))
    # a revoked device is never re-bound: the new key must not vouch for a stolen device
    keep = [link for link in newest.values()
            if link and link["device_key"] not in dropped_keys and link["device_key"] not in revoked]
    if not keep or all(link["device_key"] != me for link in keep):
        raise ConfigError("person-last-device", "a rotation must keep this device bound",
                          hint="a device that shares this device's name is named by its key (8+ hex characters, "
                               "`kith device list`)" if me in dropped_keys else None)
    old_secret = seed = None
    if words is None:
        old_secret = load_person_secret(home)
        if old_secret is None:
            raise ConfigError("device-no-person-key", "This device does not hold the person key.",
                              hint="on the device that holds it, run `kith person rotate`; if it is lost, "
                                   "rotate here with `kith person rotate --recovery`")
    else:
        seed = recovery_seed(recovery_secret_of(words))
        if public_key_of(seed) != rec.recovery_key:
            raise ConfigError("person-recovery-wrong")
    return _Plan(rec, newest, keep, store, own_lists, revoked, old_secret, seed)


def _rotate_person(home: Path, words: str | None, without: tuple[str, ...]) -> RotationResult:
    from node.trust.revocation_list import check_list, make_list

    plan = _plan(home, words, without)
    rec, newest, keep, own_lists, revoked = plan.rec, plan.newest, plan.keep, plan.own_lists, plan.revoked
    created = now_rfc3339()
    new_secret = os.urandom(32)
    new_key = public_key_of(new_secret)
    seq = _next_seq(rec)
    fresh_words = None
    recovery_key = rec.recovery_key
    if plan.seed is None:
        link = successor_link(plan.old_secret, new_key, created, seq)
        via = VIA_PERSON
    else:
        link = recovery_link(plan.seed, rec.person_key, rec.created, rec.recovery_signature, new_key, created, seq)
        via = VIA_RECOVERY
        fresh = os.urandom(32)
        recovery_key, fresh_words = public_key_of(recovery_seed(fresh)), recovery_words(fresh)
    devices = [device_link(new_secret, d["device_key"], d["device_name"], created, seq + 1 + i)
               for i, d in enumerate(sorted(keep, key=lambda d: d["seq"]))]
    new = PersonRecord(person_key=new_key, recovery_key=recovery_key, created=created,
                       recovery_signature=sign(new_secret, person_recovery_payload(
                           person_key=new_key, recovery_key=recovery_key, created=created)),
                       successors=[*rec.successors, link], devices=devices)
    person_from_json(new.as_json(), where="the rotated person record")  # never write what would not load
    atomic_write(home / PENDING_KEY_FILE, new_secret.hex().encode("ascii") + b"\n", mode=0o600)
    save_person(home, new)
    os.replace(home / PENDING_KEY_FILE, home / PERSON_KEY_FILE)
    if revoked:  # the revocation keeps travelling: the new key signs the same list, next seq
        doc = make_list(new_secret, revoked, max(d["seq"] for d in own_lists) + 1, created)
        plan.store.offer(check_list(doc), via="own", now=created)
    return RotationResult(rec.person_key, new_key, via, link, tuple(d["device_name"] for d in devices),
                          tuple(sorted(link["device_name"] for link in newest.values()
                                       if link and link["device_key"] not in {d["device_key"] for d in devices})),
                          fresh_words)


def adopt_person(home: Path, raw: object) -> PersonRecord:
    """Take a rotated ``person.json`` from the device that rotated (``kith person import``).

    It must verify (:func:`node.trust.person.person_from_json`), descend from this home's
    person key through its rotation links, and bind this device.

    Raises:
        ConfigError: ``home-not-initialized``; ``config-invalid`` (not a valid record);
            ``person-not-successor`` (it does not descend from this home's person key,
            or it is not newer); ``person-device-unbound`` (it does not bind this device).
    """
    home = Path(home)
    with person_lock(home):
        return _adopt_person(home, raw)


def _adopt_person(home: Path, raw: object) -> PersonRecord:
    from node.trust.identity import load_identity

    rec = load_person(home)
    if rec is None:
        raise ConfigError("home-not-initialized", "This home has no person key yet.")
    new = person_from_json(raw, where="the imported person record")
    olds = [link["person_key"] for link in new.successors]
    if rec.person_key == new.person_key or rec.person_key not in olds:
        raise ConfigError("person-not-successor")
    if new.binding_for(load_identity(home).public_key) is None:
        raise ConfigError("person-device-unbound")
    save_person(home, new)
    if load_person_secret(home) is not None:  # an old person key left here signs nothing any more
        (home / PERSON_KEY_FILE).unlink()
    return new


class RotationLedger:
    """The rotations a host has followed (``<home>/rotations.json``, 0600, tmp+rename).

    File shape: ``{"version": 1, "rotations": {"<old key>": {"successor": "<key>" | null,
    "via": "person" | "recovery" | "superseded", "seenAt": "<RFC 3339>"}}}``.

    Raises (from :meth:`load`):
        ConfigError: ``config-invalid`` naming the file.
    """

    def __init__(self, path: Path, entries: dict[str, dict[str, Any]]) -> None:
        self.path = path
        self.entries = entries

    @classmethod
    def load(cls, home: Path) -> "RotationLedger":
        """Read ``<home>/rotations.json`` (missing → empty)."""
        path = Path(home) / ROTATIONS_FILE
        try:
            raw = read_json_state(path)
        except FileNotFoundError:
            return cls(path, {})
        try:
            entries = {str(k): {"successor": v.get("successor"), "via": str(v["via"]), "seenAt": str(v.get("seenAt", ""))}
                       for k, v in raw["rotations"].items()}
        except (KeyError, TypeError, AttributeError):
            raise ConfigError("config-invalid", f"{ROTATIONS_FILE} is not a rotation ledger") from None
        return cls(path, entries)

    def save(self) -> None:
        """Write the ledger (oldest dropped beyond :data:`MAX_LEDGER_ENTRIES`)."""
        while len(self.entries) > MAX_LEDGER_ENTRIES:
            self.entries.pop(next(iter(self.entries)))
        data = {"version": LEDGER_VERSION, "rotations": self.entries}
        atomic_write(self.path, (json.dumps(data, indent=2) + "\n").encode("utf-8"))

    def check(self, pid: PersonIdentity) -> list[tuple[str, str, str]]:
        """Judge a verified chain against the followed rotations (nothing is recorded).

        Returns:
            The chain's rotations this host has not followed yet, ``(old, new, via)``.

        Raises:
            HandshakeError: ``handshake-rotation-revoked-key`` (a rotation from a key
                this host saw rotated to another key — unless a recovery rotation replaces
                a person-key one), ``handshake-person-key-retired`` (the device link is
                signed by a key this host saw rotated away).
        """
        new: list[tuple[str, str, str]] = []
        overruled: set[str] = set()
        for old, succ, via in pid.rotations:
            seen = self.entries.get(old)
            if seen is None:
                new.append((old, succ, via))
            elif seen["successor"] != succ:
                if not (via == VIA_RECOVERY and seen["via"] == VIA_PERSON):
                    raise HandshakeError("handshake-rotation-revoked-key",
                                         "the chain rotates a person key this host saw rotated to another key")
                new.append((old, succ, via))
                if seen["successor"]:
                    overruled.add(seen["successor"])
        if pid.person in self.entries and pid.person not in overruled:
            raise HandshakeError("handshake-person-key-retired",
                                 "this device's binding is signed by a person key that was rotated; "
                                 "run `kith person import` on it")
        return new

    def follow(self, pid: PersonIdentity, seen_at: str | None = None) -> list[tuple[str, str, str]]:
        """:meth:`check`, then record the new rotations (and retire the successor a
        recovery rotation overruled), saving when anything changed.

        Returns:
            The rotations followed now (``(old, new, via)``; empty: nothing new).

        Raises:
            HandshakeError: as :meth:`check`.
        """
        new = self.check(pid)
        if not new:
            return []
        at = seen_at or now_rfc3339()
        for old, succ, via in new:
            prev = self.entries.get(old)
            if prev is not None and prev["successor"] and prev["successor"] != succ:
                self.entries[prev["successor"]] = {"successor": None, "via": VIA_SUPERSEDED, "seenAt": at}
            self.entries[old] = {"successor": succ, "via": via, "seenAt": at}
        try:
            self.save()
        except OSError as exc:  # the rotation is still followed in memory; said once
            raise KithError("internal-error", f"{ROTATIONS_FILE} could not be written ({exc.strerror})") from None
        return new

    def lineage(self, pid: PersonIdentity) -> list[str]:
        """Every person key ``pid`` descends from, newest first: its own, the chain's
        earlier keys, then older ones this host followed (so a pin on any of them names
        this person)."""
        out = [pid.person, *reversed(pid.earlier)]
        back = {v["successor"]: k for k, v in self.entries.items() if v.get("successor")}
        key = out[-1]
        while key in back and back[key] not in out:
            key = back[key]
            out.append(key)
        return out

    def current(self, key: str) -> str:
        """The newest key ``key`` was rotated to at this host (``key`` itself if none)."""
        return self.forward(key)[-1]

    def forward(self, key: str) -> list[str]:
        """``key`` and every key it was rotated to at this host, oldest first (what a pin
        on ``key`` names today and before)."""
        out = [key]
        while True:
            nxt = (self.entries.get(out[-1]) or {}).get("successor")
            if not nxt or nxt in out:
                return out
            out.append(nxt)


def pinned_in_lineage(registry: Any, ledger: RotationLedger, pid: PersonIdentity) -> Any:
    """The registry record pinned on a person key ``pid`` descends from — its own, the
    chain's earlier keys, then older ones the host followed (:meth:`RotationLedger.lineage`,
    newest first) — or None. This is how a pin on an old person key keeps naming the person
    after a rotation (specs/peers.md §11).

    Args:
        registry: a :class:`node.trust.peers.PeerRegistry` (anything with ``by_key``).
    """
    for key in ledger.lineage(pid):
        rec = registry.by_key(key)
        if rec is not None:
            return rec
    return None


__all__ = ["PENDING_KEY_FILE", "ROTATIONS_FILE", "RotationLedger", "RotationResult", "adopt_person",
           "check_rotation", "finish_pending_key", "pinned_in_lineage", "rotate_person"]

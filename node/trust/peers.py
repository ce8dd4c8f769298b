"""The trusted peer registry ``<home>/peers.json`` (0600, tmp+rename; DESIGN §10).

Local name → public key (+ note, shared profile, ``profileSyncedAt``). ``kith peers``
edits it; the Host admits by it (``--peers-only``) and names peers by it; both sides merge
the profile a *known* peer shares in the handshake (an unknown peer is never added by
itself); a name pinned to one key refuses another key on both sides.

The node's own shared profile is ``<home>/profile.json`` (same four fields).

File shape (version 2, specs/peers.md §1): ``{"version": 2, "peers": {"alice":
{"publicKey": "<64 hex>", "note": "", "profile": {}, "profileSyncedAt": null, "addedAt":
"<RFC 3339>", "invitation": {...} | absent, "server": "<URL>" | absent}}, "blocked":
{"<64 hex>": {"name": "alice" | null, "note": "", "blockedAt": "<RFC 3339>"}}}``. A file
without ``version`` is version 1 (no ``blocked``) and is still read; every save writes
version 2. ``invitation`` / ``server`` (how to reach a pinned peer: its last invitation
document and the community server it came from; ``kith ask --peer NAME``) are optional
version-2 fields: a file written before them is read unchanged and gains them when a
peer is pinned or joined again.
"""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from node.common.errors import ConfigError, PolicyError
from node.common.home import atomic_write, read_json_state, read_regular
from node.common.names import name_skeletons
from node.trust.signing import PUBLIC_KEY_HEX_LEN, check_hex

PEERS_FILE = "peers.json"
PROFILE_FILE = "profile.json"
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
#: Shared profile fields and their maximum length (characters) — DESIGN §10.
PROFILE_FIELDS: dict[str, int] = {"displayName": 64, "fullName": 128, "shortDescr": 160, "description": 1000}
MAX_NOTE_CHARS = 1000
MAX_REGISTRY_BYTES = 4 << 20
#: Largest saved invitation document (UTF-8 JSON bytes); a real one is ≈1 KiB.
MAX_SAVED_INVITATION_BYTES = 16 << 10
#: Longest saved community server URL (characters).
MAX_SERVER_URL_CHARS = 2048
#: The ``peers.json`` format written by :meth:`PeerRegistry.save`; 1 (no ``version``
#: field, no ``blocked``) is still read.
REGISTRY_VERSION = 2




def _clean_text(value: str, limit: int, *, multiline: bool = False) -> str:
    text = unicodedata.normalize("NFC", value)
    keep = []
    for ch in text:
        cat = unicodedata.category(ch)
        if ch == "\n" and multiline:
            keep.append(ch)
        elif cat in ("Cc", "Zl", "Zp"):
            keep.append(" ")  # tabs, newlines, other controls: a space
        elif cat in ("Cf", "Cs", "Co"):
            continue  # bidi overrides, zero-width characters, surrogates: dropped
        else:
            keep.append(ch)
    return "".join(keep).strip()[:limit]


def clean_profile(raw: Any) -> dict[str, str]:
    """The shareable part of an (untrusted) profile: only :data:`PROFILE_FIELDS`, strings,
    NFC, control and format characters (bidi overrides, zero-width) removed or turned into
    spaces, each cut to its maximum length; empty values dropped. Anything else → ``{}``."""
    if not isinstance(raw, dict):
        return {}
    out: dict[str, str] = {}
    for key, limit in PROFILE_FIELDS.items():
        value = raw.get(key)
        if isinstance(value, str):
            text = _clean_text(value, limit, multiline=key == "description")
            if text:
                out[key] = text
    return out


def load_own_profile(home: Path) -> dict[str, str]:
    """This node's shared profile (``<home>/profile.json``; missing or invalid → ``{}``)."""
    try:
        raw = read_json_state(Path(home) / PROFILE_FILE)
    except (OSError, ConfigError):
        return {}
    return clean_profile(raw)


def save_own_profile(home: Path, profile: dict[str, Any]) -> dict[str, str]:
    """Write this node's shared profile (cleaned with :func:`clean_profile`; 0600)."""
    clean = clean_profile(profile)
    atomic_write(Path(home) / PROFILE_FILE, json.dumps(clean, indent=2, ensure_ascii=False).encode("utf-8") + b"\n")
    return clean


def _bounded_invitation(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` when its JSON is at most :data:`MAX_SAVED_INVITATION_BYTES`, else ValueError."""
    if len(json.dumps(doc, ensure_ascii=False).encode("utf-8")) > MAX_SAVED_INVITATION_BYTES:
        raise ValueError("the invitation is too large to keep")
    return doc


def _bounded_server(url: str | None) -> str | None:
    return url if isinstance(url, str) and 0 < len(url) <= MAX_SERVER_URL_CHARS else None


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class PeerRecord:
    """One registry entry."""

    name: str
    public_key: str
    note: str = ""
    profile: dict[str, Any] = field(default_factory=dict)
    profile_synced_at: str | None = None
    added_at: str = ""
    #: The peer's last invitation document (parsed and verified only when used), or None.
    invitation: dict[str, Any] | None = None
    #: The community server ``invitation`` came from (``browse --host KEY`` there when
    #: the saved one no longer works), or None.
    server: str | None = None
    #: ``public_key`` is a *person* key (``kith peers add --devices``): every device with a
    #: valid binding of it is this peer (specs/peers.md §10). False: one device's key.
    devices: bool = False
    #: The devices of a person pin this host has seen (device key → ``{"name",
    #: "firstSeen"}``), at most :data:`MAX_SEEN_DEVICES`; empty for a device pin.
    seen_devices: dict[str, dict[str, str]] = field(default_factory=dict)
    #: When this pin ends (RFC 3339 UTC, ``kith peers add --until``), or None: never.
    until: str | None = None


@dataclass
class BlockRecord:
    """One blocked key (``peers.json`` ``blocked``; ``kith peers block``).

    Attributes:
        public_key: 64 lowercase hex.
        name: the registry name the key had when it was blocked, or None.
        note: the owner's note (``--note``), never sent.
        blocked_at: RFC 3339 UTC.
    """

    public_key: str
    name: str | None = None
    note: str = ""
    blocked_at: str = ""


class PeerRegistry:
    """Load, query and update ``peers.json``.

    Raises (from :meth:`load`):
        ConfigError: ``config-invalid`` naming the file when it is not valid.
    """

    def __init__(self, path: Path, peers: dict[str, PeerRecord],
                 blocked: dict[str, BlockRecord] | None = None) -> None:
        self.path = path
        self.peers = peers
        self.blocked: dict[str, BlockRecord] = blocked or {}
        #: pins left out of :attr:`peers` by :meth:`in_force` (still saved)
        self._ended: dict[str, PeerRecord] = {}

    @classmethod
    def load(cls, home: Path) -> "PeerRegistry":
        """Read ``<home>/peers.json`` (missing → empty registry).

        Raises:
            ConfigError: ``config-invalid`` naming the file (bad JSON, bad name or key, a
                key pinned under two names, a bad ``blocked`` entry, a ``version`` other
                than 1 or 2, larger than 4 MiB).
        """
        path = Path(home) / PEERS_FILE
        try:
            data = read_regular(path, MAX_REGISTRY_BYTES + 1)
            if len(data) > MAX_REGISTRY_BYTES:
                raise ConfigError("config-invalid", f"{PEERS_FILE} is larger than {MAX_REGISTRY_BYTES} bytes")
        except FileNotFoundError:
            return cls(path, {})
        except OSError as exc:  # unreadable is not invalid: never suggest moving it aside
            from node.common.dbfaults import io_error

            raise io_error(str(path), exc.strerror or type(exc).__name__) from None
        raw = read_json_state(path, data=data,
                              hint=f"fix it, or move it aside (mv {PEERS_FILE} {PEERS_FILE}.bad): this home then "
                                   "pins no peer, and `kith peers add NAME KEY` pins each again")
        peers: dict[str, PeerRecord] = {}
        blocked: dict[str, BlockRecord] = {}
        try:
            version = raw.get("version", 1)
            if version not in (1, REGISTRY_VERSION) or isinstance(version, bool):
                raise ValueError(f"unknown version {str(version)[:20]!r} (this Kith reads 1 and {REGISTRY_VERSION})")
            keys: set[str] = set()
            for name, rec in raw.get("peers", {}).items():
                if not NAME_RE.fullmatch(name):
                    raise ValueError(f"bad peer name {name!r}")
                check_hex(rec["publicKey"], PUBLIC_KEY_HEX_LEN, f"peers.{name}.publicKey")
                if rec["publicKey"] in keys:
                    raise ValueError(f"the key of {name!r} is pinned under another name too")
                keys.add(rec["publicKey"])
                note = rec.get("note", "")
                inv, server = rec.get("invitation"), rec.get("server")
                if inv is not None and not isinstance(inv, dict):
                    raise ValueError(f"peers.{name}.invitation is not an object")
                if server is not None and not (isinstance(server, str) and 0 < len(server) <= MAX_SERVER_URL_CHARS):
                    raise ValueError(f"peers.{name}.server is not a URL")
                peers[name] = PeerRecord(name, rec["publicKey"], note if isinstance(note, str) else "",
                                         clean_profile(rec.get("profile")),
                                         rec.get("profileSyncedAt"), rec.get("addedAt", ""), inv, server,
                                         *_person_fields(name, rec))
                peers[name].until = _pin_until(rec.get("until"), name)
            for key, rec in (raw.get("blocked") or {}).items():
                check_hex(key, PUBLIC_KEY_HEX_LEN, f"blocked.{str(key)[:70]}")
                name, note = rec.get("name"), rec.get("note", "")
                blocked[key] = BlockRecord(key, name if isinstance(name, str) and NAME_RE.fullmatch(name) else None,
                                           note if isinstance(note, str) else "", str(rec.get("blockedAt", "")))
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise ConfigError("config-invalid", f"{PEERS_FILE}: {exc}") from None
        except Exception as exc:  # SigningError from check_hex
            raise ConfigError("config-invalid", f"{PEERS_FILE}: {getattr(exc, 'message', type(exc).__name__)}") from None
        return cls(path, peers, blocked)

    def by_key(self, public_key: str) -> PeerRecord | None:
        """The entry whose key is ``public_key``, or None."""
        return next((p for p in self.peers.values() if p.public_key == public_key), None)

    def by_name(self, name: str) -> PeerRecord | None:
        """The entry called ``name``, or None."""
        return self.peers.get(name)

    def pin(self, name: str, public_key: str, note: str = "") -> PeerRecord:
        """Add (or replace) ``name`` → ``public_key`` and save atomically.

        Prefer :meth:`add`, which refuses to re-pin a name or a key.
        """
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            raise PolicyError("peer-bad-name", "a peer name is 1-64 of [A-Za-z0-9_.-], starting alphanumeric")
        check_hex(public_key, PUBLIC_KEY_HEX_LEN, "public key")
        rec = PeerRecord(name, public_key, _clean_text(note, MAX_NOTE_CHARS, multiline=True), added_at=_now())
        self.peers[name] = rec
        self.save()
        return rec

    def add(self, name: str, public_key: str, note: str = "", *, profile: dict[str, Any] | None = None,
            invitation: dict[str, Any] | None = None, server: str | None = None) -> PeerRecord:
        """Pin a new peer ``name`` → ``public_key`` (DESIGN §10) and save.

        Args:
            profile: a profile already received from this peer (e.g. after ``join``);
                stored with ``profileSyncedAt`` = now.
            invitation, server: how to reach the peer (:meth:`remember_invitation`); the
                caller has verified the invitation and that its host key is ``public_key``.

        Raises:
            PolicyError: ``peer-bad-name``; ``peer-exists`` (the name is taken — remove it
                first; a pinned name never silently changes key); ``peer-key-pinned``
                (the key is already pinned under another name).
            SigningError: ``bad-hex`` for a key that is not 64 lowercase hex.
        """
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            raise PolicyError("peer-bad-name", "a peer name is 1-64 of [A-Za-z0-9_.-], starting alphanumeric")
        check_hex(public_key, PUBLIC_KEY_HEX_LEN, "public key")
        if name in self.peers:
            raise PolicyError("peer-exists", f"a peer named {name!r} is already pinned",
                              hint="`kith peers remove NAME` first to pin another key")
        other = self.by_key(public_key)
        if other is not None:
            raise PolicyError("peer-key-pinned", f"that key is already pinned as {other.name!r}")
        rec = PeerRecord(name, public_key, _clean_text(note, MAX_NOTE_CHARS, multiline=True), added_at=_now())
        if profile:
            rec.profile, rec.profile_synced_at = clean_profile(profile), _now()
        if invitation is not None:
            rec.invitation = _bounded_invitation(invitation)
        rec.server = _bounded_server(server)
        self.peers[name] = rec
        self.save()
        return rec

    def remember_invitation(self, public_key: str, invitation: dict[str, Any], server: str | None) -> PeerRecord | None:
        """Keep ``invitation`` (a verified invitation document of the host ``public_key``)
        and the community ``server`` it came from as how to reach that pinned peer, and
        save. An unknown key is never added (like :meth:`merge_profile`).

        Returns:
            The updated record, or None (the key is not pinned, or the document is larger
            than :data:`MAX_SAVED_INVITATION_BYTES`).
        """
        rec = self.by_key(public_key)
        if rec is None or invitation.get("host_public_key") != public_key:
            return None
        try:
            doc = _bounded_invitation(invitation)
        except ValueError:
            return None
        server = _bounded_server(server) if server else rec.server
        if rec.invitation == doc and rec.server == server:
            return rec
        rec.invitation, rec.server = doc, server
        self.save()
        return rec

    def remove(self, name: str) -> PeerRecord:
        """Remove ``name`` and save.

        Raises:
            PolicyError: ``peer-not-found``.
        """
        rec = self.peers.pop(name, None) if isinstance(name, str) else None
        if rec is None:
            raise PolicyError("peer-not-found", f"no peer named {name!r}")
        self.save()
        return rec

    def resolve(self, key_or_name: str) -> tuple[str, str | None]:
        """``KEY|NAME`` (``kith peers block|unblock|code``) → ``(public_key, name | None)``.

        A pinned name is looked up first; an argument of exactly 64 characters that is
        not a pinned name is a KEY and must be 64 lowercase hex; anything else is a name.
        A name that is not pinned but was blocked under that name resolves to the
        blocked key (so ``unblock NAME`` works after ``remove`` + ``block``).

        Raises:
            SigningError: ``bad-hex`` for a 64-character KEY that is not lowercase hex.
            PolicyError: ``peer-not-found`` for an unknown name.
        """
        if not isinstance(key_or_name, str):
            raise PolicyError("peer-not-found", "give a peer name or a 64-hex public key")
        rec = self.peers.get(key_or_name)
        if rec is not None:
            return rec.public_key, rec.name
        if len(key_or_name) == PUBLIC_KEY_HEX_LEN:
            check_hex(key_or_name, PUBLIC_KEY_HEX_LEN, "public key")
            pinned = self.by_key(key_or_name)
            return key_or_name, pinned.name if pinned else None
        for blk in self.blocked.values():
            if blk.name == key_or_name:
                return blk.public_key, blk.name
        raise PolicyError("peer-not-found", f"no peer named {key_or_name[:70]!r}",
                          hint="`kith peers list` shows the pinned names; a peer that is not pinned is "
                               "named by its 64-hex public key")

    def is_blocked(self, public_key: str) -> bool:
        """True when ``public_key`` is blocked (``kith peers block``)."""
        return public_key in self.blocked

    def block(self, key_or_name: str, note: str = "") -> BlockRecord:
        """Block a key (by KEY or pinned NAME, :meth:`resolve`) and save. A pinned peer
        stays pinned (``unblock`` restores it as it was); blocking again updates the note.

        Raises:
            SigningError / PolicyError: from :meth:`resolve`.
        """
        key, name = self.resolve(key_or_name)
        prev = self.blocked.get(key)
        rec = BlockRecord(key, name or (prev.name if prev else None),
                          _clean_text(note, MAX_NOTE_CHARS, multiline=True) if note else (prev.note if prev else ""),
                          prev.blocked_at if prev else _now())
        self.blocked[key] = rec
        self.save()
        return rec

    def unblock(self, key_or_name: str) -> BlockRecord:
        """Lift a block (by KEY or NAME) and save.

        Raises:
            PolicyError: ``peer-not-blocked`` (that key is not blocked), ``peer-not-found``.
            SigningError: ``bad-hex``.
        """
        key, _name = self.resolve(key_or_name)
        rec = self.blocked.pop(key, None)
        if rec is None:
            raise PolicyError("peer-not-blocked", "that peer is not blocked")
        self.save()
        return rec

    def block_json(self, rec: BlockRecord) -> dict[str, Any]:
        """One blocked key as ``kith peers list --json`` / ``block --json`` print it."""
        return {"publicKey": rec.public_key, "name": rec.name, "note": rec.note, "blockedAt": rec.blocked_at}

    def merge_profile(self, public_key: str, profile: Any) -> PeerRecord | None:
        """Merge the profile a peer shared in the handshake into its record (DESIGN §10).

        Only a peer already in the registry is updated (``profile`` replaced by the cleaned
        shared profile, ``profileSyncedAt`` = now, saved); an unknown key is never added.
        An empty shared profile changes nothing.

        Returns:
            The updated record, or ``None`` (unknown peer or nothing shared).
        """
        rec = self.by_key(public_key)
        clean = clean_profile(profile)
        if rec is None or not clean:
            return None
        rec.profile, rec.profile_synced_at = clean, _now()
        self.save()
        return rec

    def claimed_by_other(self, public_key: str, profile: Any) -> PeerRecord | None:
        """The record a peer with an unknown key *claims* to be, or ``None``.

        A peer whose key is not pinned but whose shared ``displayName`` equals a registry
        name, or the ``displayName`` a pinned peer shared, claims a pinned name with a
        changed key: both sides refuse it (DESIGN §5, §10). "Equals" compares
        :func:`name_skeletons`: case, accents, white space and common look-alike
        letters (Cyrillic ``е`` for Latin ``e``, ``I`` for ``l``) do not matter.
        """
        if self.by_key(public_key) is not None:
            return None
        claimed = clean_profile(profile).get("displayName")
        if not claimed:
            return None
        key = name_skeletons(claimed)
        if not key:
            return None
        for rec in self.peers.values():
            shared = rec.profile.get("displayName") or ""
            if key & name_skeletons(rec.name) or (shared and key & name_skeletons(shared)):
                return rec
        return None

    def rank(self, query: str) -> list[tuple[float, PeerRecord]]:
        """Peers matching ``query``, best first (``kith peers list --rank``).

        Each query word (casefolded) scores 3 in the local name, 2 in the own note, 1 in
        each shared profile field (substring match); a record with score 0 is left out.
        Ties → name order.
        """
        words = [w for w in query.casefold().split() if w]
        out: list[tuple[float, PeerRecord]] = []
        for rec in self.peers.values():
            score = 0.0
            for w in words:
                score += 3 * (w in rec.name.casefold()) + 2 * (w in rec.note.casefold())
                score += sum(w in v.casefold() for v in rec.profile.values())
            if score > 0:
                out.append((score, rec))
        out.sort(key=lambda sr: (-sr[0], sr[1].name))
        return out

    def to_json(self, rec: PeerRecord) -> dict[str, Any]:
        """One record as ``kith peers list --json`` prints it."""
        return {"name": rec.name, "publicKey": rec.public_key, "note": rec.note, "profile": rec.profile,
                "profileSyncedAt": rec.profile_synced_at, "addedAt": rec.added_at,
                "invitation": (rec.invitation or {}).get("post_id"), "server": rec.server, "until": rec.until,
                "devices": rec.devices, "seenDevices": _seen_json(rec)}

    def save(self) -> None:
        """Write the registry (version 2, 0600, tmp+rename)."""
        data = {"version": REGISTRY_VERSION,
                "peers": {n: {"publicKey": p.public_key, "note": p.note, "profile": p.profile,
                              "profileSyncedAt": p.profile_synced_at, "addedAt": p.added_at,
                              **({"invitation": p.invitation} if p.invitation is not None else {}),
                              **({"server": p.server} if p.server is not None else {}),
                              **({"until": p.until} if p.until is not None else {}), **_person_json(p)}
                          for n, p in sorted({**self._ended, **self.peers}.items())},
                "blocked": {k: {"name": b.name, "note": b.note, "blockedAt": b.blocked_at}
                            for k, b in sorted(self.blocked.items())}}
        atomic_write(self.path, json.dumps(data, indent=2, ensure_ascii=False).encode("utf-8") + b"\n")


# ------------------------------------------------------------ pins that end (issue 22 item 5)
def _pin_until(value: object, name: str) -> str | None:
    """A stored pin end (``until``), checked (ValueError naming the peer otherwise)."""
    if value is None:
        return None
    from node.common.grants import until_time

    try:
        until_time(value)  # type: ignore[arg-type]
    except Exception:  # noqa: BLE001 - grant-bad-until: the file is not valid
        raise ValueError(f"peers.{name}.until is not an RFC 3339 UTC time") from None
    return value  # type: ignore[return-value]


def set_pin_until(registry: PeerRegistry, name: str, until: str | None) -> PeerRecord:
    """Give the pin ``name`` an end (``until``: RFC 3339 UTC, None: never) and save.

    Raises:
        PolicyError: ``peer-not-found``.
    """
    rec = registry.by_name(name)
    if rec is None:
        raise PolicyError("peer-not-found", f"no peer named {name[:70]!r}")
    rec.until = _pin_until(until, name)
    registry.save()
    return rec


# ------------------------------------------------------------------ person pins (issue 22)
#: The most devices of one person pin whose first sighting is remembered.
MAX_SEEN_DEVICES = 64


def _person_fields(name: str, rec: dict[str, Any]) -> tuple[bool, dict[str, dict[str, str]]]:
    """``(devices, seen_devices)`` of one ``peers.json`` entry (absent → a device pin).

    Raises:
        ValueError: ``devices`` not a boolean, or ``seenDevices`` not an object of device
            keys to ``{"name", "firstSeen"}``.
    """
    devices = rec.get("devices", False)
    if not isinstance(devices, bool):
        raise ValueError(f"peers.{name}.devices is not true or false")
    seen: dict[str, dict[str, str]] = {}
    for key, dev in (rec.get("seenDevices") or {}).items():
        check_hex(key, PUBLIC_KEY_HEX_LEN, f"peers.{name}.seenDevices")
        if not isinstance(dev, dict) or not isinstance(dev.get("name"), str):
            raise ValueError(f"peers.{name}.seenDevices.{key[:16]} is not {{name, firstSeen}}")
        seen[key] = {"name": dev["name"][:64], "firstSeen": str(dev.get("firstSeen", ""))}
    return devices, seen


def _person_json(rec: PeerRecord) -> dict[str, Any]:
    """The person-pin fields of one saved entry (none for a device pin: old readers see
    the file they know)."""
    if not rec.devices:
        return {}
    return {"devices": True, "seenDevices": dict(sorted(rec.seen_devices.items()))}


def _seen_json(rec: PeerRecord) -> list[dict[str, str]]:
    return [{"key": k, "name": d["name"], "firstSeen": d["firstSeen"]}
            for k, d in sorted(rec.seen_devices.items(), key=lambda kd: (kd[1]["firstSeen"], kd[0]))]


def pin_person(registry: PeerRegistry, name: str, person_key: str, note: str = "", **kw: Any) -> PeerRecord:
    """Pin ``name`` to a *person* key (``kith peers add NAME KEY --devices``) and save: any
    device with a valid binding chain to ``person_key`` is then this peer (its tiers,
    overrides, approvals and one quota bucket; specs/peers.md §10).

    Args:
        kw: as :meth:`PeerRegistry.add` (``profile``, ``invitation``, ``server``).

    Raises:
        PolicyError / SigningError: as :meth:`PeerRegistry.add`.
    """
    rec = registry.add(name, person_key, note, **kw)
    rec.devices = True
    registry.save()
    return rec


def pins_in_force(registry: PeerRegistry, now: float) -> PeerRegistry:
    """``registry`` without the pins whose ``until`` has passed at ``now`` (Unix s): what a
    running host admits and names by. The ended pins are still written by its
    :meth:`PeerRegistry.save` (nothing is removed from the file)."""
    from node.common.grants import in_force

    view = PeerRegistry(registry.path, {n: r for n, r in registry.peers.items() if in_force(r.until, now)},
                        registry.blocked)
    view._ended = {**registry._ended, **{n: r for n, r in registry.peers.items() if n not in view.peers}}
    return view


def person_pin(registry: PeerRegistry, person_key: str | None) -> PeerRecord | None:
    """The person pin (``--devices``) of ``person_key``, or None (not pinned, or pinned as
    one device's key: a new device of that person is a stranger)."""
    if person_key is None:
        return None
    rec = registry.by_key(person_key)
    return rec if rec is not None and rec.devices else None


def persons_of_device(registry: PeerRegistry, device_key: str) -> list[str]:
    """The person keys of the person pins (``--devices``) that have seen ``device_key``
    present a valid binding chain (``seenDevices``): what a host knows that key belongs to
    before it sends a chain — the persons whose revocation lists may revoke it at
    ``_session_init`` (:meth:`node.trust.revocation_list.RevocationStore.revokes`)."""
    return [rec.public_key for rec in registry.peers.values() if rec.devices and device_key in rec.seen_devices]


def note_device(registry: PeerRegistry, rec: PeerRecord, device_key: str, device_name: str) -> bool:
    """Remember that device ``device_key`` (named ``device_name`` by its person) of person
    pin ``rec`` was seen, and save when that changes the record.

    Returns:
        True when the device is new to this registry (the owner is told: "alice's new
        device 'work-laptop'").
    """
    known = rec.seen_devices.get(device_key)
    if known is not None and known["name"] == device_name:
        return False
    if known is None and len(rec.seen_devices) >= MAX_SEEN_DEVICES:
        oldest = min(rec.seen_devices, key=lambda k: rec.seen_devices[k]["firstSeen"])
        del rec.seen_devices[oldest]
    rec.seen_devices[device_key] = {"name": device_name[:64], "firstSeen": known["firstSeen"] if known else _now()}
    registry.save()
    return known is None


def _bound_device_of(home: Path, person_key: str, device_key: str, rec: PeerRecord | None) -> bool:
    """Has this home seen ``person_key`` bind ``device_key`` (its own person's binding, or
    the person pin ``rec``'s ``seenDevices``), whatever revoked it since?"""
    if rec is not None and rec.devices and device_key in rec.seen_devices:
        return True
    from node.trust.person import load_person

    own = load_person(Path(home))
    return own is not None and own.person_key == person_key and own.binding_for(device_key) is not None


def revoked_device_of(home: Path, person_key: str, device_key: str, rec: PeerRecord | None = None) -> str | None:
    """When ``device_key`` is a device this home saw ``person_key`` bind and a revocation
    list of that person kept here (``revocations.json``) revokes it: when the list kept says
    so (its ``created`` time), else None. Such a device is never a known device of the
    person (:func:`known_device_of`; specs/peers.md §10)."""
    if device_key == person_key or not _bound_device_of(home, person_key, device_key, rec):
        return None
    from node.trust.revocation_list import RevocationStore

    store = RevocationStore.load(Path(home))
    if store.revokes(device_key, [person_key]) is None:
        return None
    kept = store.list_for(person_key) or {}
    return str(kept.get("created") or "an earlier list")


def known_device_of(home: Path, person_key: str, device_key: str, rec: PeerRecord | None = None) -> bool:
    """Does this home know ``device_key`` is ``person_key`` or a device it bound? True for
    the person key itself, a device of this home's own person (``person.json``), or a
    device the person pin ``rec`` has seen present a valid chain (``seenDevices``) — never
    for a device a revocation list of that person kept here revokes
    (:func:`revoked_device_of`). What ``kith peers add --devices --invite``, ``kith join``
    and ``kith ask --peer`` accept as a person's host."""
    if device_key == person_key:
        return True
    if not _bound_device_of(home, person_key, device_key, rec):
        return False
    from node.trust.revocation_list import RevocationStore

    return RevocationStore.load(Path(home)).revokes(device_key, [person_key]) is None


def pin_of_revoked_device(registry: PeerRegistry, home: Path, device_key: str) -> tuple[PeerRecord, str] | None:
    """The person pin that saw ``device_key`` bound and whose person's list kept here
    revokes it, with when that list says so (:func:`revoked_device_of`), or None — what
    ``kith join`` warns of before it treats such a host as unknown."""
    for rec in registry.peers.values():
        if rec.devices:
            when = revoked_device_of(home, rec.public_key, device_key, rec)
            if when is not None:
                return rec, when
    return None


def pin_of_known_device(registry: PeerRegistry, home: Path, device_key: str) -> PeerRecord | None:
    """The person pin whose person this home knows bound ``device_key``
    (:func:`known_device_of`), or None — a guest's view of a host device of a pinned
    person (the host sends no chain, so only what this home has seen counts)."""
    for rec in registry.peers.values():
        if rec.devices and known_device_of(home, rec.public_key, device_key, rec):
            return rec
    return None

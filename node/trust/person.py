"""This home's person key and its device bindings (specs/peers.md §9).

Files in the home:

- ``identity.key`` — this *device's* key (unchanged: it is the iroh endpoint id and the key
  every session is signed with, :mod:`node.trust.identity`);
- ``person.key`` — the person key's 32-byte seed, 64 lowercase hex, mode 0600, only on the
  device that holds it (it never leaves that device);
- ``person.json`` — public data only: the person key, the public key of the recovery
  secret signed by the person key, the successor links of earlier rotations (none yet),
  and the device bindings the person key signed (``devices``, one per device, with a
  sequence number that only grows).

The recovery secret is 32 random bytes shown once by ``kith init`` as 24 BIP-39 words (for
paper). Nothing of it is stored: its Ed25519 key is derived from the words
(:func:`recovery_seed`), and only that key's *public* half is kept, signed by the person
key, so a rotation it signs later can be checked.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from node.common.errors import ConfigError, KithError, SigningError
from node.common.home import atomic_write, read_json_state, read_regular
from node.trust.binding import MAX_CHAIN_LINKS, check_device_name, device_link, verify_chain
from node.trust.identity import Identity
from node.trust.invitation import rfc3339
from node.trust.signing import (
    person_recovery_payload,
    public_key_of,
    sign,
    verify,
)

PERSON_KEY_FILE = "person.key"
PERSON_FILE = "person.json"
#: Domain of the recovery key derivation: seed = SHA-256(domain || 32-byte secret).
RECOVERY_DOMAIN = b"kith/recovery-key/v1\x00"
PERSON_FORMAT = 1


@dataclass
class PersonRecord:
    """The public part of this home's person (``person.json``).

    Attributes:
        person_key: 64 hex. recovery_key: 64 hex (public half of the recovery secret).
        recovery_signature: the person key's signature over the recovery statement.
        created: RFC 3339 UTC. successors: rotation links, oldest first (none yet).
        devices: device links signed by the person key (the wire shape of
            :mod:`node.trust.binding`), in the order they were bound.
    """

    person_key: str
    recovery_key: str
    recovery_signature: str
    created: str
    successors: list[dict[str, Any]] = field(default_factory=list)
    devices: list[dict[str, Any]] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        """The ``person.json`` object."""
        return {"format": PERSON_FORMAT, "person_key": self.person_key, "recovery_key": self.recovery_key,
                "recovery_signature": self.recovery_signature, "created": self.created,
                "successors": list(self.successors), "devices": list(self.devices)}

    def binding_for(self, device_key: str) -> dict[str, Any] | None:
        """The newest device link for ``device_key``, or None."""
        found = [d for d in self.devices if d.get("device_key") == device_key]
        return max(found, key=lambda d: d["seq"]) if found else None

    def chain_for(self, device_key: str) -> list[dict[str, Any]] | None:
        """The binding chain this device sends in the handshake (the newest
        ``MAX_CHAIN_LINKS - 1`` rotation links, then its device link), or None when the
        person has not bound it. A host more rotations behind than that does not converge
        (specs/peers.md §11)."""
        link = self.binding_for(device_key)
        return None if link is None else [*self.carried_successors(), link]

    def all_keys(self) -> list[str]:
        """This person's key, then every earlier key it was rotated from (oldest first): the
        keys whose revocation lists speak for this person's devices."""
        return [self.person_key, *(link["person_key"] for link in self.successors)]

    def carried_successors(self) -> list[dict[str, Any]]:
        """The rotation links a binding chain carries: the newest ``MAX_CHAIN_LINKS - 1``."""
        return self.successors[-(MAX_CHAIN_LINKS - 1):] if self.successors else []


def now_rfc3339() -> str:
    """The current UTC time as ``YYYY-MM-DDTHH:MM:SSZ``."""
    return rfc3339(datetime.now(timezone.utc))


def default_device_name(home: Path | str | None = None) -> str:
    """The name a device gets when none is given: this machine's host name (``device`` if
    it has none) — followed by ``-`` and the home folder's name for a home that is not the
    platform default, so two homes on one machine (``--home ~/kith-host``, ``--home
    ~/kith-guest``) are told apart: ``desktop-kith-guest``. Cut to a valid device name."""
    import platformdirs

    base = "".join(c for c in socket.gethostname() if c.isprintable()).strip() or "device"
    if home is not None:
        home = Path(home).expanduser().resolve()
        if home != Path(platformdirs.user_data_dir("kith")).expanduser().resolve():
            suffix = "".join(c for c in home.name if c.isprintable()).strip()
            if suffix:
                base = f"{base[:64 - len(suffix[:40]) - 1]}-{suffix[:40]}"
    return base[:64].strip() or "device"


def recovery_seed(secret: bytes) -> bytes:
    """The Ed25519 seed of the recovery key derived from the 32-byte recovery secret."""
    return hashlib.sha256(RECOVERY_DOMAIN + secret).digest()


def recovery_words(secret: bytes) -> str:
    """The recovery secret as 24 BIP-39 English words (what ``kith init`` prints)."""
    from mnemonic import Mnemonic

    return Mnemonic("english").to_mnemonic(secret)


def recovery_secret_of(words: str) -> bytes:
    """The 32-byte recovery secret from its 24 words.

    Raises:
        ConfigError: ``config-invalid`` when the words are not a valid 24-word phrase.
    """
    from mnemonic import Mnemonic

    m = Mnemonic("english")
    phrase = " ".join(words.split())
    if len(phrase.split()) != 24 or not m.check(phrase):
        raise ConfigError("config-invalid", "the recovery words are not a valid 24-word phrase",
                          hint="type the 24 words `kith init` printed, in their order, separated by spaces")
    return bytes(m.to_entropy(phrase))


def _load_seed(path: Path) -> bytes | None:
    try:
        text = read_regular(path).decode("ascii").strip()
    except FileNotFoundError:
        return None
    except OSError as exc:  # unreadable is not corrupt: never suggest replacing the key
        from node.common.dbfaults import io_error

        raise io_error(str(path), exc.strerror or type(exc).__name__) from None
    except UnicodeDecodeError:
        raise KithError("identity-corrupt", f"{path.name} in this home is not readable",
                        hint=f"restore {path.name} from a backup, or replace the person key with your 24 recovery "
                             "words: `kith person rotate --recovery`") from None
    if len(text) != 64 or any(c not in "0123456789abcdef" for c in text):
        raise KithError("identity-corrupt", f"{path.name} in this home is not 64 lowercase hex",
                        hint=f"move {path.name} aside")
    return bytes.fromhex(text)


def person_from_json(raw: object, *, where: str = PERSON_FILE) -> PersonRecord:
    """Check a ``person.json`` object (or the one a paired device sent) and build its record.

    Every device link is verified (shape and signature, with the successor links before it)
    and the recovery statement too.

    Raises:
        ConfigError: ``config-invalid`` naming ``where`` when it is not a valid record.
    """
    try:
        if not isinstance(raw, dict):
            raise TypeError("not an object")
        rec = PersonRecord(person_key=raw["person_key"], recovery_key=raw["recovery_key"],
                           recovery_signature=raw["recovery_signature"], created=raw["created"],
                           successors=list(raw.get("successors") or []), devices=list(raw.get("devices") or []))
        verify(rec.person_key, person_recovery_payload(person_key=rec.person_key, recovery_key=rec.recovery_key,
                                                       created=rec.created), rec.recovery_signature)
        _check_history(rec.successors)
        for link in rec.devices:
            who = verify_chain([*rec.carried_successors(), link],
                               link.get("device_key", "") if isinstance(link, dict) else "")
            if who.person != rec.person_key:
                raise TypeError("a device is bound by another person key")
    except (KeyError, TypeError, AttributeError, SigningError, KithError) as exc:
        detail = getattr(exc, "message", "") or str(exc) or type(exc).__name__
        raise ConfigError("config-invalid", f"{where} is not a valid person record ({detail})") from None
    return rec


def _check_history(successors: list[dict[str, Any]]) -> None:
    """Rotation links older than those a chain carries: each well-formed, signed, and
    continued by the next one (the carried ones are checked with the device links by
    :func:`node.trust.binding.verify_chain`).

    Raises:
        TypeError / HandshakeError: a link that is not.
    """
    from node.trust.binding import check_link, verify_link  # the handshake's own rules

    for i, raw in enumerate(successors[:-(MAX_CHAIN_LINKS - 1)]):
        link = check_link(raw, False, i)
        nxt = successors[i + 1]
        if not isinstance(nxt, dict) or link["successor_key"] != nxt.get("person_key"):
            raise TypeError(f"rotation link {i} is not continued by the next one")
        verify_link(link, i)


def load_person(home: Path) -> PersonRecord | None:
    """Read ``person.json`` (None when this home has no person yet: a home made before
    person keys existed, until ``kith init`` migrates it), checked by
    :func:`person_from_json`, so a hand-edited file is refused rather than sent.

    Raises:
        ConfigError: ``config-invalid`` when the file is not a valid person record.
    """
    path = home / PERSON_FILE
    try:
        data = read_regular(path)
    except FileNotFoundError:
        return None
    except OSError as exc:  # unreadable is not invalid
        from node.common.dbfaults import io_error

        raise io_error(str(path), exc.strerror or type(exc).__name__) from None
    raw = read_json_state(path, data=data, hint=f"restore {PERSON_FILE} (the signed person record) from a backup")
    return person_from_json(raw)


def load_person_secret(home: Path) -> bytes | None:
    """The person key's seed, or None on a device that does not hold it.

    Raises:
        KithError: ``identity-corrupt`` when ``person.key`` is not 64 lowercase hex.
    """
    return _load_seed(home / PERSON_KEY_FILE)


def bind_device(rec: PersonRecord, person_secret: bytes, device_key: str, device_name: str,
                created: str | None = None) -> dict[str, Any]:
    """Sign a device binding with the person key and add it to ``rec`` (not saved).

    The sequence number is one more than the highest the person has used, so a newer
    binding of the same device always has a larger ``seq``.

    Returns:
        the new device link (wire shape).

    Raises:
        SigningError: ``bad-payload-value`` for an invalid device name.
    """
    seq = max((d["seq"] for d in rec.devices), default=-1) + 1
    link = device_link(person_secret, device_key, device_name, created or now_rfc3339(), seq)
    rec.devices.append(link)
    return link


PERSON_LOCK_FILE = "person.lock"


@contextmanager
def person_lock(home: Path) -> Iterator[None]:
    """Hold ``<home>/person.lock`` (a blocking ``flock``, held for a read-modify-write of
    ``person.json`` only, never across a wait for the owner): ``kith device add``'s bind,
    ``kith device revoke``, ``kith person rotate`` and ``import`` take it, so none writes back
    a record another changed meanwhile."""
    import fcntl

    fd = os.open(Path(home) / PERSON_LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the flock


def save_person(home: Path, rec: PersonRecord) -> None:
    """Write ``person.json`` atomically (mode 0600)."""
    atomic_write(home / PERSON_FILE, (json.dumps(rec.as_json(), indent=2) + "\n").encode("utf-8"))


def no_record_error(home: Path) -> Any:
    """The refusal of a command that needs this home's person record and finds none:
    ``home-not-initialized`` (run ``kith init``) — or, when ``person.key`` is here without
    ``person.json`` (deleted or lost), ``config-invalid`` saying so: ``kith init`` would make
    a new person (it keeps the old key aside as ``person.key.<time>.bak``)."""
    from node.common.errors import ConfigError
    from node.common.home import init_hint

    if (home / PERSON_KEY_FILE).exists():
        return ConfigError("config-invalid", f"{PERSON_FILE} is missing, yet {PERSON_KEY_FILE} is here",
                           hint=f"restore {PERSON_FILE} (the signed person record) from a backup; `kith init` "
                                f"would make a new person key (keeping this one aside as {PERSON_KEY_FILE}.<time>.bak)")
    return ConfigError("home-not-initialized", "This home has no person key yet.", hint=init_hint(home))


def init_person(home: Path, device: Identity, device_name: str | None = None
                ) -> tuple[PersonRecord, str | None]:
    """Create this home's person key and bind ``device`` to it, unless the home has a person.

    An existing home (an ``identity.key`` from before person keys) migrates in place: the
    identity key stays this device's key; a person key is created and binds it.

    Returns:
        ``(record, recovery_words)``; ``recovery_words`` (24 words) only when the person was
        created now — it is never stored and cannot be shown again.

    Raises:
        SigningError: ``bad-payload-value`` for an invalid ``device_name``.
        ConfigError: ``config-invalid`` for an unreadable ``person.json``.
    """
    existing = load_person(home)
    if existing is not None:
        return existing, None
    kept = home / PERSON_KEY_FILE
    if kept.exists():  # a key without its record: never destroyed, kept beside (issue 42)
        os.replace(kept, home / f"{PERSON_KEY_FILE}.{int(time.time())}.bak")
    name = check_device_name(device_name) if device_name is not None else default_device_name(home)
    person_secret = os.urandom(32)
    secret = os.urandom(32)
    created = now_rfc3339()
    person_key = public_key_of(person_secret)
    recovery_key = public_key_of(recovery_seed(secret))
    rec = PersonRecord(person_key=person_key, recovery_key=recovery_key, created=created,
                       recovery_signature=sign(person_secret, person_recovery_payload(
                           person_key=person_key, recovery_key=recovery_key, created=created)))
    bind_device(rec, person_secret, device.public_key, name, created)
    # the key first: a crash between the two leaves a key and no record, and init retries
    atomic_write(home / PERSON_KEY_FILE, person_secret.hex().encode("ascii") + b"\n", mode=0o600)
    save_person(home, rec)
    return rec, recovery_words(secret)


def own_chain(home: Path, device_key: str) -> list[dict[str, Any]] | None:
    """The binding chain this home's device sends in the handshake, or None (no person yet,
    or the person never bound this device)."""
    rec = load_person(home)
    return None if rec is None else rec.chain_for(device_key)


def own_revocation(home: Path) -> dict[str, Any] | None:
    """The newest revocation list of this home's person kept in ``revocations.json``
    (wire shape; specs/peers.md §10), which this device carries beside its chain, or None."""
    return revocation_of(home, load_person(home))


def revocation_of(home: Path, rec: PersonRecord | None) -> dict[str, Any] | None:
    """:func:`own_revocation` for a person record read already (``rec``; None: no person,
    no list): a caller that holds the record reads ``person.json`` once."""
    from node.trust.revocation_list import RevocationStore

    return None if rec is None else RevocationStore.load(home).list_for(rec.person_key)


#: The shortest key prefix ``kith device revoke`` takes for a device (hex characters).
MIN_KEY_PREFIX = 8


def device_keys_named(rec: PersonRecord, name: str) -> list[str]:
    """The keys of this person's bound devices that ``name`` names: the devices called
    ``name``, or — when none is, since names are not unique (the default is the host name)
    — the one whose key is ``name`` or starts with it (:data:`MIN_KEY_PREFIX`+ lowercase
    hex). Empty when none.

    Raises:
        ConfigError: ``device-not-found`` for a prefix of several keys.
    """
    keys = sorted({d["device_key"] for d in rec.devices if d["device_name"] == name})
    if not keys and MIN_KEY_PREFIX <= len(name) <= 64 and all(c in "0123456789abcdef" for c in name):
        keys = sorted({d["device_key"] for d in rec.devices if d["device_key"].startswith(name)})
        if len(keys) > 1:
            raise ConfigError("device-not-found", f"{name!r} is the start of several device keys",
                              hint="give more of the key (`kith device list`)")
    return keys


def revoke_device(home: Path, device_name: str, *, device_key: str | None = None) -> tuple[dict[str, Any], list[str]]:
    """Revoke this person's device named ``device_name`` — its name, or, when no device has
    that name, its key or a unique prefix of :data:`MIN_KEY_PREFIX`+ lowercase hex
    (``kith device revoke NAME|KEY``; names are not unique): sign
    a new revocation list with the person key — every device revoked before, plus this one,
    under a ``seq`` one more than the last — and keep it in ``revocations.json`` (what this
    device carries in its next handshakes). Revoking one device never revokes the others.

    Returns:
        ``(list, newly_revoked_keys)``; the keys are empty when the device was revoked already.

    Raises:
        ConfigError: ``home-not-initialized`` (no person), ``device-no-person-key`` (this
            device does not hold the person key), ``device-not-found`` (no bound device of that
            name), ``device-revoke-this`` (the device holding the person key).
        KithError: ``revocation-malformed`` when the list would name more than 48 devices.
    """
    with person_lock(home):
        return _revoke_device(home, device_name, device_key)


def _revoke_device(home: Path, device_name: str, device_key: str | None) -> tuple[dict[str, Any], list[str]]:
    from node.trust.revocation_list import RevocationStore, check_list, make_list

    rec = load_person(home)
    if rec is None:
        raise ConfigError("home-not-initialized", "This home has no person key yet.")
    secret = load_person_secret(home)
    if secret is None:
        raise ConfigError("device-no-person-key")
    keys = device_keys_named(rec, device_name)
    if device_key is not None:
        keys = [k for k in keys if k == device_key]
    if not keys:
        raise ConfigError("device-not-found", f"this person has bound no device named {device_name[:64]!r}",
                          hint="`kith device list` shows the names and keys")
    from node.trust.identity import load_identity

    if load_identity(home).public_key in keys:  # the device holding the person key
        raise ConfigError("device-revoke-this", hint=None if len(keys) == 1 else
                          "another device shares this name: name it by its key (or 8+ of its first hex "
                          "characters, `kith device list`)")
    store = RevocationStore.load(home)
    before = store.list_for(rec.person_key)
    revoked = list(before["revoked"]) if before else []
    new = [k for k in keys if k not in revoked]
    if before is not None and not new:
        return before, []
    doc = make_list(secret, revoked + new, (before["seq"] + 1) if before else 0, now_rfc3339())
    store.offer(check_list(doc), via="own", now=doc["created"])
    return doc, new


__all__ = ["PERSON_FILE", "PERSON_KEY_FILE", "PersonRecord", "bind_device", "default_device_name", "device_keys_named", "init_person",
           "load_person", "load_person_secret", "own_chain", "person_lock", "own_revocation", "revocation_of", "revoke_device", "person_from_json", "recovery_secret_of", "recovery_seed",
           "recovery_words", "save_person"]

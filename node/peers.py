"""The trusted peer registry ``<home>/peers.json`` (0600, tmp+rename; DESIGN §10).

Local name → public key (+ note, shared profile, ``profileSyncedAt``). This first cut
gives lookups and pinning; ``kith peers`` commands build on it.

File shape: ``{"peers": {"alice": {"publicKey": "<64 hex>", "note": "", "profile": {},
"profileSyncedAt": null, "addedAt": "<RFC 3339>"}}}``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from node.errors import ConfigError
from node.home import atomic_write
from node.signing import PUBLIC_KEY_HEX_LEN, check_hex

PEERS_FILE = "peers.json"
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


@dataclass
class PeerRecord:
    """One registry entry."""

    name: str
    public_key: str
    note: str = ""
    profile: dict[str, Any] = field(default_factory=dict)
    profile_synced_at: str | None = None
    added_at: str = ""


class PeerRegistry:
    """Load, query and update ``peers.json``.

    Raises (from :meth:`load`):
        ConfigError: ``config-invalid`` naming the file when it is not valid.
    """

    def __init__(self, path: Path, peers: dict[str, PeerRecord]) -> None:
        self.path = path
        self.peers = peers

    @classmethod
    def load(cls, home: Path) -> "PeerRegistry":
        """Read ``<home>/peers.json`` (missing → empty registry)."""
        path = Path(home) / PEERS_FILE
        try:
            raw = json.loads(path.read_text("utf-8"))
        except FileNotFoundError:
            return cls(path, {})
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            raise ConfigError("config-invalid", f"{PEERS_FILE} is not valid JSON") from None
        peers: dict[str, PeerRecord] = {}
        try:
            for name, rec in raw.get("peers", {}).items():
                if not NAME_RE.fullmatch(name):
                    raise ValueError(f"bad peer name {name!r}")
                check_hex(rec["publicKey"], PUBLIC_KEY_HEX_LEN, f"peers.{name}.publicKey")
                peers[name] = PeerRecord(name, rec["publicKey"], rec.get("note", ""), dict(rec.get("profile") or {}),
                                         rec.get("profileSyncedAt"), rec.get("addedAt", ""))
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise ConfigError("config-invalid", f"{PEERS_FILE}: {exc}") from None
        except Exception as exc:  # SigningError from check_hex
            raise ConfigError("config-invalid", f"{PEERS_FILE}: {getattr(exc, 'message', type(exc).__name__)}") from None
        return cls(path, peers)

    def by_key(self, public_key: str) -> PeerRecord | None:
        """The entry whose key is ``public_key``, or None."""
        return next((p for p in self.peers.values() if p.public_key == public_key), None)

    def by_name(self, name: str) -> PeerRecord | None:
        """The entry called ``name``, or None."""
        return self.peers.get(name)

    def pin(self, name: str, public_key: str, note: str = "") -> PeerRecord:
        """Add (or replace) ``name`` → ``public_key`` and save atomically."""
        if not NAME_RE.fullmatch(name):
            raise ConfigError("config-invalid", "a peer name is 1-64 of [A-Za-z0-9_.-], starting alphanumeric")
        check_hex(public_key, PUBLIC_KEY_HEX_LEN, "public key")
        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        rec = PeerRecord(name, public_key, note, added_at=now)
        self.peers[name] = rec
        self.save()
        return rec

    def save(self) -> None:
        """Write the registry (0600, tmp+rename)."""
        data = {"peers": {n: {"publicKey": p.public_key, "note": p.note, "profile": p.profile,
                              "profileSyncedAt": p.profile_synced_at, "addedAt": p.added_at}
                          for n, p in sorted(self.peers.items())}}
        atomic_write(self.path, json.dumps(data, indent=2).encode("utf-8") + b"\n")

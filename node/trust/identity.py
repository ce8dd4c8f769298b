"""The node identity: one Ed25519 key pair whose public key is also the iroh EndpointId.

The 32-byte secret seed lives in ``<home>/identity.key`` as 64 lowercase hex characters
(mode 0600, written tmp+rename). The iroh endpoint is bound with the same seed
(``EndpointOptions.secret_key``), so QUIC/TLS proves the peer's identity (DESIGN §1, §3).
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import nacl.signing

from node.common.errors import ConfigError, KithError
from node.common.home import IDENTITY_FILE, atomic_write, init_hint, read_regular
from node.trust.signing import sign

KEY_FILE = IDENTITY_FILE


@dataclass(frozen=True)
class Identity:
    """An Ed25519 identity.

    Attributes:
        secret: the 32-byte seed (never logged, never sent).
        public_key: 64 lowercase hex characters; equals the iroh EndpointId.
    """

    secret: bytes

    @property
    def public_key(self) -> str:
        """The public key as 64 lowercase hex characters."""
        return nacl.signing.SigningKey(self.secret).verify_key.encode().hex()

    @property
    def fingerprint(self) -> str:
        """A short human-checkable fingerprint of the public key (see :func:`fingerprint`)."""
        return fingerprint(self.public_key)

    def sign(self, message: bytes) -> str:
        """Sign ``message``; return the signature as 128 lowercase hex characters."""
        return sign(self.secret, message)

    def __repr__(self) -> str:  # never show the secret
        return f"Identity(public_key={self.public_key})"


def fingerprint(public_key: str) -> str:
    """Return ``SHA256:`` + the first 16 bytes of SHA-256(key bytes) in colon-grouped hex.

    Example: ``SHA256:1a2b:3c4d:...`` (8 groups of 4 hex digits).
    """
    digest = hashlib.sha256(bytes.fromhex(public_key)).hexdigest()[:32]
    return "SHA256:" + ":".join(digest[i:i + 4] for i in range(0, 32, 4))


def key_path(home: Path) -> Path:
    """Path of the identity key file inside ``home``."""
    return home / KEY_FILE


def load_identity(home: Path) -> Identity:
    """Load the identity from ``home``.

    Raises:
        ConfigError: ``home-not-initialized`` if there is no key file.
        KithError: ``identity-corrupt`` if the file is not 64 lowercase hex characters.
    """
    path = key_path(home)
    try:
        text = read_regular(path).decode("ascii").strip()
    except FileNotFoundError:
        raise ConfigError("home-not-initialized", f"The Kith home {home} has no identity yet.",
                          hint=init_hint(home)) from None
    except PermissionError:
        # unreadable is not corrupt: never suggest replacing an identity we cannot read
        raise ConfigError("io-error", f"{KEY_FILE} in this home is not readable (permission denied)",
                          hint="run kith as the user who owns this home, or fix the file's permissions") from None
    except (OSError, UnicodeDecodeError):
        raise KithError("identity-corrupt") from None
    if len(text) != 64 or any(c not in "0123456789abcdef" for c in text):
        raise KithError("identity-corrupt", hint=f"move {KEY_FILE} aside and run `kith init`")
    mode = stat.S_IMODE(os.stat(path).st_mode)
    if mode & 0o077:
        os.chmod(path, 0o600)
    return Identity(bytes.fromhex(text))


def init_identity(home: Path) -> tuple[Identity, bool]:
    """Create the identity in ``home`` unless one exists.

    Returns:
        ``(identity, created)``; ``created`` is False when an identity already existed (it
        is then left untouched).
    """
    if key_path(home).exists():
        return load_identity(home), False
    seed = os.urandom(32)
    atomic_write(key_path(home), seed.hex().encode("ascii") + b"\n", mode=0o600)
    return Identity(seed), True


def load_or_init_identity(home: Path) -> Identity:
    """Load the identity, creating it on first use (tests and load scripts; the CLI's
    ``host``/``join``/``mcp`` use :func:`load_identity` and refuse a home without one)."""
    return init_identity(home)[0]

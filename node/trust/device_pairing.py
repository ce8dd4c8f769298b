"""One-time device pairing codes (specs/peers.md §9): the rules, no I/O.

``kith device add`` on the device holding the person key makes an offer: a secret of
:data:`SECRET_BYTES` random bytes (80 bits), valid for :data:`TTL_S` seconds, for at most
:data:`MAX_TRIES` wrong tries, used once. The code the owner carries to the new device is
``<secret as 16 base32 characters>@<iroh ticket of the offering device>``; the new device
(``kith device join CODE``) connects to that ticket, so QUIC proves the offering device's key,
and presents the secret. Both sides then show the pairing words of the two device keys
(:func:`node.trust.pairing.pairing_code`); the owner confirms on the offering device before
the person key signs a binding. The person key never leaves the offering device.
"""

from __future__ import annotations

import base64
import hmac
import os
import re
from dataclasses import dataclass

from node.common.errors import UsageError

SECRET_BYTES = 10
TTL_S = 600.0
MAX_TRIES = 3
_SECRET_RE = re.compile(r"[a-z2-7]{16}")


def new_secret() -> str:
    """A fresh secret: 80 random bits as 16 lowercase base32 characters."""
    return base64.b32encode(os.urandom(SECRET_BYTES)).decode("ascii").lower()


def make_code(secret: str, ticket: str) -> str:
    """The code the owner carries to the new device: ``secret@ticket``."""
    return f"{secret}@{ticket}"


def parse_code(code: str) -> tuple[str, str]:
    """Split a pairing code into ``(secret, ticket)``.

    Raises:
        UsageError: ``pairing-code-invalid`` when it is not ``<16 base32>@<ticket>``.
    """
    secret, sep, ticket = code.strip().partition("@")
    if not sep or _SECRET_RE.fullmatch(secret) is None or not ticket or any(c.isspace() for c in ticket):
        raise UsageError("pairing-code-invalid")
    return secret, ticket


@dataclass
class PairingOffer:
    """The offering device's state of one code (time is an input: ``now`` in monotonic s).

    Attributes:
        secret: the code's secret. created: when it was made.
        wrong: wrong tries so far. used: True once a right try consumed it.
    """

    secret: str
    created: float
    wrong: int = 0
    used: bool = False

    def state(self, now: float) -> str | None:
        """None while the code can still be tried, else why not: ``pairing-used``,
        ``pairing-too-many-tries`` or ``pairing-expired``."""
        if self.used:
            return "pairing-used"
        if self.wrong >= MAX_TRIES:
            return "pairing-too-many-tries"
        if now - self.created >= TTL_S:
            return "pairing-expired"
        return None

    def try_secret(self, secret: object, now: float) -> str | None:
        """Judge one try. Returns None when ``secret`` is right (the offer is then used:
        single use), else the refusal code (``pairing-code-wrong`` counts a try)."""
        closed = self.state(now)
        if closed is not None:
            return closed
        if not isinstance(secret, str) or not hmac.compare_digest(secret.encode(), self.secret.encode()):
            self.wrong += 1
            return "pairing-code-wrong"
        self.used = True
        return None


__all__ = ["MAX_TRIES", "PairingOffer", "SECRET_BYTES", "TTL_S", "make_code", "new_secret", "parse_code"]

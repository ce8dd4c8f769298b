"""Pairing codes: five words two people read aloud to check their keys (specs/peers.md §6).

The code of a pair of nodes is five words from the BIP-39 English list (2048 words, 11 bits
each: 55 bits), taken from ``SHA-256("kith/pairing-code/v1" 0x00 || lo || hi)`` where
``lo``/``hi`` are the two raw 32-byte Ed25519 public keys in ascending byte order. Sorting
makes the code a property of the *pair*: the host and the guest (and either of them later
with ``kith peers code``) compute the same words, whoever hosted. The domain string keeps the
hash from ever equalling another Kith hash of the same keys (session ids, fingerprints).

The word list is the one the ``mnemonic`` package ships (the BIP-39 reference list): fixed,
public, unambiguous in its first four letters, and the same on every machine — it must never
change, or two versions of Kith would show different codes for the same keys.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

from node.trust.signing import PUBLIC_KEY_HEX_LEN, check_hex

#: Domain separation tag of the pairing-code hash (version 1).
PAIRING_DOMAIN = b"kith/pairing-code/v1\x00"
#: Words in a code, and bits per word (2048-word list).
PAIRING_WORDS = 5
BITS_PER_WORD = 11


@lru_cache(maxsize=1)
def wordlist() -> tuple[str, ...]:
    """The BIP-39 English word list (2048 words, index = 11-bit value).

    Raises:
        RuntimeError: the installed ``mnemonic`` package does not ship a 2048-word list
            (a broken install; the code would not be comparable with other nodes).
    """
    from mnemonic import Mnemonic

    words = tuple(Mnemonic("english").wordlist)
    if len(words) != 1 << BITS_PER_WORD or len(set(words)) != len(words):
        raise RuntimeError("the BIP-39 English word list is not 2048 distinct words")
    return words


def pairing_code(key_a: str, key_b: str) -> str:
    """The pairing code of two public keys: five words separated by single spaces.

    Args:
        key_a, key_b: Ed25519 public keys, 64 lowercase hex each (order does not matter).

    Returns:
        e.g. ``"orbit wheat rabbit unveil cancel"`` (55 bits of the domain-separated hash).

    Raises:
        SigningError: ``bad-hex`` when a key is not 64 lowercase hex.
    """
    a = bytes.fromhex(check_hex(key_a, PUBLIC_KEY_HEX_LEN, "public key"))
    b = bytes.fromhex(check_hex(key_b, PUBLIC_KEY_HEX_LEN, "public key"))
    lo, hi = sorted((a, b))
    digest = int.from_bytes(hashlib.sha256(PAIRING_DOMAIN + lo + hi).digest(), "big")
    words = wordlist()
    out = []
    for i in range(PAIRING_WORDS):  # the most significant 55 bits, 11 at a time
        shift = 256 - BITS_PER_WORD * (i + 1)
        out.append(words[(digest >> shift) & ((1 << BITS_PER_WORD) - 1)])
    return " ".join(out)


__all__ = ["PAIRING_DOMAIN", "PAIRING_WORDS", "pairing_code", "wordlist"]

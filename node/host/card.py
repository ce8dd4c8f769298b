"""The hosting device's own card (specs/peers.md §13): made for its live invitation, with the
public totals and a new sequence number; published by the host (:meth:`node.host.host.Host`)
in its handshake and to the community server. The pure rules are :mod:`node.trust.card`; a
guest's handling of the cards it is sent is :mod:`node.guest.cards`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from node.common.errors import KithError
from node.common.home import atomic_write, read_regular
from node.trust.card import SEQ_FILE, make_card

if TYPE_CHECKING:
    from node.trust.identity import Identity


def _now() -> str:
    from node.trust.person import now_rfc3339

    return now_rfc3339()


def public_totals(home: Path) -> tuple[int, int]:
    """``(documents, chunks)`` this home shares with anyone: the indexed documents whose
    winning policy rule for a stranger is ``public`` (:meth:`node.policy.store.Policy.match`
    with no peer name) and their chunks. ``(0, 0)`` without a corpus or policy."""
    import sqlite3

    from node.corpus.store import Corpus
    from node.policy.store import Policy

    try:
        policy = Policy.load(home)
        corpus = Corpus(home, readonly=True)
    except KithError:
        return 0, 0
    try:
        with corpus.record.lock:
            db = corpus.record.db
            if db is None:
                return 0, 0
            try:
                rows = db.execute("SELECT source_id, chunk_count FROM documents WHERE status = 'done'").fetchall()
            except sqlite3.OperationalError:
                return 0, 0
    finally:
        corpus.close()
    docs = chunks = 0
    for source, count in rows:
        rule = policy.match(source)
        if rule is not None and rule.tier == "public":
            docs, chunks = docs + 1, chunks + int(count or 0)
    return docs, chunks


def next_seq(home: Path) -> int:
    """The next card sequence number of this home (``<home>/card-seq``, written before the
    card is used: a crash never reuses a number). A missing or unparsable file starts at 0.

    Raises:
        OSError: the file cannot be read (no permission, a folder in its place) or written
            (a full disk); never read as "no number yet", which would reuse numbers.
    """
    path = Path(home) / SEQ_FILE
    try:
        last = int(read_regular(path).decode("ascii").strip())
    except FileNotFoundError:
        last = -1
    except (UnicodeDecodeError, ValueError):
        last = -1
    seq = max(last + 1, 0)
    atomic_write(path, f"{seq}\n".encode("ascii"))
    return seq


def own_card(home: Path, identity: "Identity", invitation: dict[str, Any],
             seq: int | None = None) -> dict[str, Any] | None:
    """This hosting device's card for its live ``invitation``, or None when its person has
    not bound it (no person yet: nothing to vouch for it). ``seq``: a number taken
    beforehand with :func:`next_seq` (``kith host`` takes its first one before it publishes
    anything), or None to take a new one now.

    Raises:
        KithError: the person record does not load. OSError: as :func:`next_seq`.
    """
    from node.trust.person import own_chain

    chain = own_chain(home, identity.public_key)
    if chain is None:
        return None
    documents, chunks = public_totals(home)
    return make_card(identity.secret, chain, invitation, documents=documents, chunks=chunks, created=_now(),
                     seq=next_seq(home) if seq is None else seq)


def first_seq(home: Path, identity: "Identity") -> int | None:
    """The sequence number of the first card of a ``kith host`` start, taken before it
    prints or publishes an invitation, so that ``card-seq`` that cannot be read or written
    refuses the start before any promise is made; None when no card will be made (no
    person binds this device, or its record does not load: said when the card is made).

    Raises:
        OSError: as :func:`next_seq`.
    """
    from node.trust.person import own_chain

    try:
        if own_chain(home, identity.public_key) is None:
            return None
    except KithError:
        return None
    return next_seq(home)


def with_mailboxes(identity: "Identity", card: dict[str, Any], mailboxes: list[str]) -> dict[str, Any]:
    """This device's ``card`` signed again as card format 2 naming ``mailboxes``, with the
    same ``seq`` (it replaces the format-1 card before either is sent: the handshake and the
    server carry this one; specs/sealed.md §6)."""
    return make_card(identity.secret, card["binding_chain"], card["invitation"], documents=card["totals"]["documents"],
                     chunks=card["totals"]["chunks"], created=card["created"], seq=card["seq"], mailboxes=mailboxes)

"""A sealed answer taken from a holder goes into the outbox row it answers, once
(issue 43 item 4; specs/sealed.md §5, specs/outbox.md §3).

The ``on_answer`` of :func:`node.community.inbox.take_step` on the asking side. An opened
answer (its signature and chain verified by :func:`node.trust.sealed.open_sealed`) is
stored only when:

- its question id is a question of this outbox with an open row (``waiting`` or
  ``pending-approval``);
- its sender is the peer that row was kept for: the row's pinned key is the sender's
  device key, or — a person pin — the sender's verified chain descends from it (the person
  key or a key it was rotated from);
- it is the answer :func:`node.guest.outbox.classify` accepts for that row (the very
  ``query_id``, a well-formed envelope): a complete answer closes the row, a
  ``pending-approval`` one is stored as the interim answer, anything else is recorded as
  the row's code and the row stays open;
- its device is neither blocked here nor revoked by a revocation list kept here
  (:func:`dropped_sender`), as a live answer from it would be dropped.

A second answer to the same question changes nothing (the row is closed): one stored answer
per question and peer. Nothing here dials anyone.
"""

from __future__ import annotations

from typing import Any, Callable

from node.guest.outbox import OutboxStore, classify, query_id_of
from node.trust.sealed import Opened


def sender_is_peer(opened: Opened, peer_key: str) -> bool:
    """True when ``opened`` was signed by the peer pinned as ``peer_key``: its device key,
    or a person key its verified binding chain descends from."""
    if opened.sender == peer_key:
        return True
    who = opened.identity
    return who is not None and peer_key in (who.person, *who.earlier)


class TrustView:
    """A home's ``peers.json`` and revocation lists, each read at most once: one
    :class:`~node.trust.peers.PeerRegistry` and one
    :class:`~node.trust.revocation_list.RevocationStore` for every answer of one take step
    (not a read of both files per answer).

    Args:
        home: the asking home.

    Raises (on first use of a property):
        ConfigError: ``config-invalid`` when the file does not load.
    """

    def __init__(self, home: Any) -> None:
        self.home = home
        self._peers: Any = None
        self._revocations: Any = None

    @property
    def peers(self) -> Any:
        """The home's :class:`~node.trust.peers.PeerRegistry` (read on first use)."""
        if self._peers is None:
            from node.trust.peers import PeerRegistry

            self._peers = PeerRegistry.load(self.home)
        return self._peers

    @property
    def revocations(self) -> Any:
        """The home's :class:`~node.trust.revocation_list.RevocationStore` (read on first use)."""
        if self._revocations is None:
            from node.trust.revocation_list import RevocationStore

            self._revocations = RevocationStore.load(self.home)
        return self._revocations


def dropped_sender(home: Any, opened: Opened, peer_key: str, *, view: TrustView | None = None) -> bool:
    """True when this home must not take ``opened`` from the peer pinned as ``peer_key``, as a
    live answer would be dropped (node/guest/asker.py, node/guest/cards.py): its device is
    blocked here (``kith peers block KEY``), or a revocation list kept here of the pinned
    person — or of a person key its verified chain descends from — revokes it (a stolen
    device still holds its seed and chain: specs/sealed.md §8).

    Args:
        view: the home's files already read this step (:class:`TrustView`); None: read now.
    """
    view = view if view is not None else TrustView(home)
    if view.peers.is_blocked(opened.sender):
        return True
    who = opened.identity
    persons = [peer_key, *((who.person, *who.earlier) if who is not None else ())]
    return view.revocations.revokes(opened.sender, persons) is not None


def store_sealed_answer(store: OutboxStore, opened: Opened, *,
                        on_stored: Callable[[str, str, str, Any], None] | None = None,
                        view: TrustView | None = None) -> bool:
    """Store ``opened`` (kind ``answer``) into the open outbox row it answers.

    Args:
        store: the home's :class:`OutboxStore`.
        opened: a sealed answer that opened and verified.
        on_stored: called once the row took it, with ``(question id, peer name, state, results
            message)``
            (state ``answered`` or ``pending-approval``): the runner reports it as it reports a
            live answer (``outbox-answered`` / ``outbox-pending``).
        view: ``peers.json`` and the revocation lists as read once for the whole take step
            (:class:`TrustView`); None: read for this answer.

    Returns:
        True when a row took it as its answer (``answered``, or ``pending-approval``'s
        interim answer); False when no open row of that question was kept for its sender
        (an unknown or closed question, another peer's answer) or the answer is not one the
        row accepts (its code is recorded; the row stays open).
    """
    if opened.kind != "answer":
        return False
    results: Any = opened.body.get("results")
    for row in store.open_deliveries():
        if row.question_id != opened.question_id or not sender_is_peer(opened, row.peer_key):
            continue
        if dropped_sender(store.home, opened, row.peer_key, view=view):
            return False  # a revoked or blocked device: dropped as a live answer is
        outcome = classify(results, query_id_of(opened.question_id))
        taken = store.record_attempt(row.question_id, row.peer_key, outcome,
                                     message=results if isinstance(results, dict) else None)
        if taken and outcome.state is not None and on_stored is not None:
            on_stored(row.question_id, row.peer_name, outcome.state, results)
        return taken and outcome.state is not None
    return False


__all__ = ["TrustView", "dropped_sender", "sender_is_peer", "store_sealed_answer"]
